"""Warm start of the saved-bytes program (``solvers.mip``): the best min-cut plan that fits the
budget (a short bisection over ``lam``), and a Lagrangian lower bound.

When no two saveable counted values share a storage, the min-cut sweep gives the bound
(``extra["lagrangian_bound"]``): for any plan P within the budget B,
``cut(lam) <= bytes(P) + lam * cost(P) <= B + lam * cost(P)``, so ``cost(P) >= (cut(lam) - B) / lam``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .mincut import _INF_BITS, lam_range, solve_mincut
from .mip_model import Model
from .problem import Plan, Problem


def better(a: Plan, b: Plan) -> bool:
    """``a`` recomputes less than ``b``, or as much with fewer saved bytes."""
    return (a.recompute_cost, a.saved_bytes) < (b.recompute_cost, b.saved_bytes)


@dataclass
class WarmStart:
    plan: Plan | None  # the least-recompute min-cut plan within the budget
    lagrangian_bound: float | None
    cuts: int
    min_bytes: int | None  # proven smallest feasible saved bytes, when the sweep established it


def warm_start(problem: Problem, model: Model, budget: int | None, *, cuts: int,
                deadline: float) -> WarmStart:
    """A short ``lam`` sweep of exact min-cuts: best fitting plan, and a Lagrangian bound."""
    lo, hi = lam_range(problem)
    weights = [problem.save_weight(n.name) for n in problem.candidates if problem.can_save(n.name)]
    total_w = sum(w for w in weights if math.isfinite(w))
    sum_cost = sum(problem.recompute_cost_of(n.name) for n in problem.candidates
                   if problem.can_recompute(n.name))
    n_arcs = 2 * len(problem.candidates) + 1
    # valid only when the cut charges every plan exactly its saved bytes: no shared storages
    lagrange_ok = not model.shared and budget is not None
    best: Plan | None = None
    lb: float | None = None
    done = 0

    def improves(p: Plan) -> bool:
        return best is None or better(p, best)

    def cut(lam: float) -> Plan:
        nonlocal best, lb, done
        p = solve_mincut(problem, lam, budget=budget)
        done += 1
        if (budget is None or p.saved_bytes <= budget) and improves(p):
            best = p
        if lagrange_ok and lam > 0 and p.objective is not None:
            # the max-flow rounds capacities scaled to 2**_INF_BITS: allow that error in full
            total = total_w + lam * sum_cost
            slack = 0.5 * n_arcs * total / (2**_INF_BITS - 1)
            value = p.objective - slack - 1e-12 * abs(p.objective)
            cand = (value - budget) / lam
            lb = cand if lb is None else max(lb, cand)
        return p

    top = cut(hi)
    if budget is None or top.saved_bytes <= budget:
        return WarmStart(top, lb, done, None)
    if cut(lo).saved_bytes > budget:
        # lam = 0 has integral capacities: exact, and equal to the least memory when no storage
        # is shared (every plan's saved bytes equal its summed save weights)
        zero = cut(0.0)
        exact = not model.shared and total_w < 2**_INF_BITS
        return WarmStart(best, lb, done, zero.saved_bytes if exact else None)
    a, b = math.log(max(lo, 1e-300)), math.log(hi)
    while done < cuts and time.perf_counter() < deadline and b - a > 1e-6:
        mid = math.exp((a + b) / 2)
        if cut(mid).saved_bytes <= budget:
            a = math.log(mid)
        else:
            b = math.log(mid)
    return WarmStart(best, lb, done, None)

