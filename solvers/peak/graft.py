"""Grafted plans: one plan's decisions on the values after a point of the graph, another's before.

A step's live memory differs along the backward: early in it every saved activation is still
live, late in it every gradient is. So a plan that fits the peak budget (checkpointing, say) has
room to spare in some layers, and a cheaper plan that overshoots (the relaxation's) fits in some
layers too. ``graft_plans`` takes the cheap plan's saved values at or after a point of the graph
order and the fitting plan's before it (or the other way round), and bisects on the point for the
graft that uses most of the cheap plan and still fits, judged by the exact simulation.
"""

from __future__ import annotations

import time
from typing import Iterable

from ..errors import PlanError
from ..liveness import simulate_plan
from ..problem import Plan, Problem, Status, plan_from_saved


def _graft(problem: Problem, fitting: frozenset[str], cheap: frozenset[str], cut: int,
           cheap_after: bool) -> tuple[Plan, int] | None:
    index = problem.index
    saved = {v for v in cheap if (index[v] >= cut) == cheap_after}
    saved.update(v for v in fitting if (index[v] >= cut) != cheap_after)
    try:
        plan = plan_from_saved(problem, saved, solver="graft", status=Status.HEURISTIC)
    except PlanError:
        return None
    return plan, simulate_plan(problem, plan.saved).peak


def graft_plans(problem: Problem, fitting: Iterable[str], cheaper: Iterable[Iterable[str]],
                peak_budget: int, budget: int | None = None, *,
                deadline: float | None = None) -> list[tuple[Plan, int]]:
    """Grafts of each plan of ``cheaper`` (saved sets) onto ``fitting`` (a saved set whose plan
    fits) that fit the peak budget (and the saved-bytes ``budget``), with their simulated peaks:
    per cheap plan and direction, the bisection's cheapest fitting graft."""
    fitting = frozenset(fitting)
    cuts = sorted({problem.index[v] for v in fitting} | {problem.index[n.name] for n in problem.candidates})
    out: list[tuple[Plan, int]] = []
    for cheap in cheaper:
        cheap = frozenset(cheap)
        for cheap_after in (True, False):
            best: tuple[Plan, int] | None = None
            lo, hi = 0, len(cuts) - 1
            while lo <= hi:
                if deadline is not None and time.perf_counter() >= deadline:
                    return out + ([best] if best is not None else [])
                mid = (lo + hi) // 2
                got = _graft(problem, fitting, cheap, cuts[mid], cheap_after)
                fits = (got is not None and got[1] <= peak_budget
                        and (budget is None or got[0].saved_bytes <= budget))
                if fits and got is not None and (best is None or got[0].recompute_cost < best[0].recompute_cost):
                    best = got
                # more of the cheap plan: an earlier cut when it goes after, a later one before
                if fits == cheap_after:
                    hi = mid - 1
                else:
                    lo = mid + 1
            if best is not None:
                out.append(best)
    return out
