"""Baselines that users compare optimal plans against; all in ``solvers.catalog``, all torch-free.

* ``save-all``    – torch's ``default_partition``: save every value the backward reads;
* ``inputs-only`` – recompute everything that may be recomputed (torch's memory budget 0);
* ``greedy``/``dp`` – torch's ``activation_memory_budget`` knapsack, reformulated on this model;
* ``uniform``/``sqrt`` – ``torch.utils.checkpoint``-style block checkpointing (the blocks:
  ``solvers.blocks``).

Every baseline returns a plan built by ``plan_from_saved`` (so it is valid by construction) with
status ``HEURISTIC``, or ``INFEASIBLE`` when a budget was given and the plan exceeds it: the plan is
still returned so callers can see how many bytes the method reached. A problem that has no valid
plan at all raises ``InfeasibleError``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from .blocks import boundary_groups
from .budget import format_bytes
from .errors import InfeasibleError, PlanError
from .mincut import lam_range, solve_mincut
from .options import DpOptions
from .problem import Plan, Problem, Status, plan_from_saved

# ---- shared helpers ---------------------------------------------------------------------------

def _mincut(problem: Problem, lam: float) -> Plan:
    """``solve_mincut``, double-checked with the exact networkx backend before giving up.

    The OR-Tools backend scales float capacities so that they sum to just under its "infinite"
    capacity; a cut through every finite arc can round up to it and be reported as infeasible.
    """
    try:
        return solve_mincut(problem, lam)
    except InfeasibleError:
        return solve_mincut(problem, lam, backend="networkx")


def _walk(problem: Problem, prefer_save: Callable[[str], bool]) -> frozenset[str]:
    """The saved set of a plan that walks back from what the backward reads.

    A reached value is saved when ``prefer_save`` says so and it can be saved, else recomputed
    (its inputs are then reached too) if that is possible, else saved. Recomputing is possible
    when the value may be recomputed and each of its inputs can be saved or, recursively,
    recomputed -- so the walk never strands itself on a value a smarter choice would avoid, and
    fails only when the backward reads a value that no plan can provide.
    """
    producible: dict[str, bool] = {}  # may be recomputed in the backward, inputs and all
    for n in problem.candidates:
        producible[n.name] = problem.can_recompute(n.name) and all(
            problem.can_save(i) or producible[i] for i in n.inputs)
    saved: set[str] = set()
    recomputed: set[str] = set()
    stack = sorted(problem.backward_reads, key=problem.index.__getitem__)
    errors: list[str] = []
    while stack:
        name = stack.pop()
        if name in saved or name in recomputed:
            continue
        if prefer_save(name) and problem.can_save(name):
            saved.add(name)
        elif producible[name]:
            recomputed.add(name)
            stack.extend(problem.by_name[name].inputs)
        elif problem.can_save(name):
            saved.add(name)
        else:
            errors.append(name)
    if errors:
        raise InfeasibleError(
            "no valid plan: the backward needs " + ", ".join(repr(e) for e in sorted(errors)[:5])
            + ", which can be neither saved nor recomputed"
        )
    return frozenset(saved)


def _finish(problem: Problem, saved: frozenset[str] | set[str], *, solver: str, start: float,
            budget: int | None, message: str = "", extra: dict[str, object] | None = None) -> Plan:
    """A plan from a saved set, marked INFEASIBLE (but still returned) when it exceeds the budget."""
    try:
        plan = plan_from_saved(problem, saved, solver=solver, status=Status.HEURISTIC,
                               budget=budget, extra=extra)
    except PlanError as exc:  # a bug in a baseline, not in the problem: say so loudly
        raise RuntimeError(str(exc)) from exc
    status = Status.HEURISTIC
    if budget is not None and plan.saved_bytes > budget:
        status = Status.INFEASIBLE
        over = (f"{solver} reaches {format_bytes(plan.saved_bytes)} saved, over the budget of {format_bytes(budget)}")
        message = f"{over}; {message}" if message else over
    return replace(plan, status=status, message=message,
                   solve_time_s=time.perf_counter() - start)


# ---- save-all and inputs-only -----------------------------------------------------------------

def save_all(problem: Problem, budget: int | None = None) -> Plan:
    """Save every value the backward reads; recompute only what cannot be saved.

    That is torch's ``default_partition``. Values that cannot be saved (``must_recompute``,
    unsaveable) are recomputed, and their inputs saved where possible.
    """
    start = time.perf_counter()
    saved = _walk(problem, lambda _name: True)
    return _finish(problem, saved, solver="save-all", start=start, budget=budget)


def inputs_only(problem: Problem, budget: int | None = None) -> Plan:
    """Recompute everything that may be recomputed; save only the frontier that must be saved.

    The saved set is the graph inputs and banned values the recomputation reaches (torch's
    ``memory_budget == 0``), plus values whose recomputation would need something that can be
    neither saved nor recomputed. Its recomputed set contains every valid plan's recomputed set,
    so it has the largest recompute cost of all plans -- but, with banned values, not necessarily
    the fewest saved bytes (a banned value may be bigger than the value computed from it).
    """
    start = time.perf_counter()
    saved = _walk(problem, lambda _name: False)
    return _finish(problem, saved, solver="inputs-only", start=start, budget=budget)


# ---- knapsack: torch's activation_memory_budget -----------------------------------------------

def greedy_knapsack(weights: Sequence[float], values: Sequence[float],
                    capacity: float) -> list[int]:
    """Indices kept by the greedy value/weight rule (what torch's ``greedy`` solver does).

    Items are taken in descending value/weight order (zero weight first; the sort is stable, so
    ties keep the caller's order) whenever they still fit.
    """
    def ratio(i: int) -> float:
        return math.inf if weights[i] <= 0 else values[i] / weights[i]

    order = sorted(range(len(weights)), key=ratio, reverse=True)
    kept: list[int] = []
    total = 0.0
    for i in order:
        if total + weights[i] <= capacity:
            total += weights[i]
            kept.append(i)
    return sorted(kept)


def dp_knapsack(weights: Sequence[float], values: Sequence[float], capacity: float, *,
                unit: float = 1.0) -> list[int]:
    """Indices kept by the 0-1 knapsack DP on weights quantized to ``unit``.

    Weights round up and the capacity down, so the kept set always fits the true capacity (torch
    rounds both, which can overshoot). Memory-lean: one 1-D array of best values over capacities,
    updated in place item by item, plus a bit-packed "took item i at capacity c" bitmap for the
    backtrack -- ``n * (C + 1)`` bits instead of torch's ``n * (C + 1)`` float table.
    """
    n = len(weights)
    if n == 0 or capacity < 0:
        return []
    if sum(weights) <= capacity:  # everything fits: no quantization error can drop an item
        return list(range(n))
    if unit <= 0:
        raise ValueError(f"unit must be > 0, got {unit}")
    q_cap = math.floor(capacity / unit + 1e-9)
    q_w = [math.ceil(w / unit - 1e-9) if w > 0 else 0 for w in weights]
    best = np.zeros(q_cap + 1, dtype=np.float64)
    took = np.zeros((n, (q_cap + 8) // 8), dtype=np.uint8)  # packed bits, one row per item
    for i, (w, v) in enumerate(zip(q_w, values)):
        if w > q_cap or v <= 0:
            continue
        if w == 0:
            best += v
            took[i] = 0xFF
            continue
        candidate = best[:-w] + v  # built from the previous row: 0-1 knapsack, not unbounded
        better = candidate > best[w:]
        best[w:] = np.where(better, candidate, best[w:])
        row = np.zeros(q_cap + 1, dtype=bool)
        row[w:] = better
        took[i] = np.packbits(row)
    kept: list[int] = []
    c = q_cap
    for i in range(n - 1, -1, -1):
        if (took[i, c >> 3] >> (7 - (c & 7))) & 1:
            kept.append(i)
            c -= q_w[i]
    return sorted(kept)


def knapsack_setup(problem: Problem) -> tuple[Plan, Plan, list[str]]:
    """The memory-max plan, the memory-min plan and the knapsack items of torch's scheme.

    Memory-max: the min-cut at a ``lam`` so large that nothing with a positive cost is recomputed
    (torch's runtime-optimized cut). Memory-min: the min-cut at a ``lam`` so small that memory
    dominates (torch uses the graph inputs; here bans can force more). Items: the values the
    memory-max plan saves that could be recomputed at a positive cost, largest first (as torch
    sorts its banned nodes), i.e. what the knapsack decides to keep saved or give up.
    """
    lo, hi = lam_range(problem)
    max_plan = _mincut(problem, hi)
    min_plan = _mincut(problem, lo)
    items = [s for s in max_plan.saved
             if problem.can_recompute(s) and problem.recompute_cost_of(s) > 0]
    items.sort(key=lambda s: (-problem.save_weight(s), problem.index[s]))
    return max_plan, min_plan, items


def knapsack_baseline(problem: Problem, budget: int | None, *, solver: str = "greedy",
                      quantization: int = DpOptions.quantization) -> Plan:
    """torch's ``activation_memory_budget`` scheme with a ``greedy`` or ``dp`` knapsack.

    Without a budget, or when the memory-max plan fits, that plan is the answer. Otherwise the
    knapsack keeps items (value = recompute cost, weight = saved bytes) within
    ``budget - min bytes`` (torch's budget is a fraction of the max-min range, the same thing),
    the kept items are banned from recomputation and a memory-dominated min-cut decides the rest.
    Item weights ignore what else recomputing or saving them drags in, so the plan can miss the
    budget; it is then returned with status INFEASIBLE.
    """
    start = time.perf_counter()
    max_plan, min_plan, items = knapsack_setup(problem)
    max_bytes, min_bytes = max_plan.saved_bytes, min_plan.saved_bytes
    info: dict[str, object] = {"max_bytes": max_bytes, "min_bytes": min_bytes,
                               "n_items": len(items)}
    if budget is None or max_bytes <= budget or max_bytes <= min_bytes:
        msg = "memory-max plan" if budget is None or max_bytes <= budget else \
            "the memory-max plan is already the memory-min plan"
        return _finish(problem, max_plan.saved, solver=solver, start=start, budget=budget,
                       message=msg, extra=info)
    weights = [problem.save_weight(s) for s in items]
    values = [problem.recompute_cost_of(s) for s in items]
    capacity = float(budget - min_bytes)
    if capacity < 0:
        kept_idx: list[int] = []
    elif solver == "greedy":
        kept_idx = greedy_knapsack(weights, values, capacity)
    else:
        # quantize like torch: ``quantization`` buckets across the max-min range, but never finer
        # than a byte (small problems are then solved exactly)
        unit = max(1.0, (max_bytes - min_bytes) / quantization)
        kept_idx = dp_knapsack(weights, values, capacity, unit=unit)
    kept = frozenset(items[i] for i in kept_idx)
    constrained = problem.with_nodes(
        [replace(n, banned=True) if n.name in kept else n for n in problem.nodes])
    lo, _ = lam_range(constrained)
    cut = _mincut(constrained, lo)
    info.update(capacity=capacity, kept=sorted(kept, key=problem.index.__getitem__),
                kept_value=sum(values[i] for i in kept_idx))
    return _finish(problem, cut.saved, solver=solver, start=start, budget=budget,
                   message=f"knapsack kept {len(kept)} of {len(items)} items", extra=info)


# ---- block checkpointing: torch.utils.checkpoint ----------------------------------------------

def _checkpoint_plan(problem: Problem, groups: list[tuple[str, ...]], every: int, *, solver: str,
                     start: float, budget: int | None, mode: str) -> Plan:
    """Save every ``every``-th boundary group (segments of ``every`` blocks), recompute the rest
    allowed."""
    chosen = frozenset(v for g in groups[every - 1::every] for v in g)
    saved = _walk(problem, chosen.__contains__)
    plan = _finish(problem, saved, solver=solver, start=start, budget=budget,
                   extra={"every": every, "n_boundaries": len(groups), "boundary_mode": mode})
    # report the checkpoints the plan really keeps (one no recomputation reaches is dropped)
    kept = [b for g in groups for b in g if b in chosen and b in plan.saved]
    return replace(plan, extra={**plan.extra, "checkpoints": kept})


def uniform_checkpoint(problem: Problem, budget: int | None, *, every: int | None = None) -> Plan:
    """Checkpoint every ``every``-th block boundary (default 2).

    With a budget and no explicit ``every``: every spacing ``k = 1 .. n+1`` (``n+1``: no
    checkpoint, the whole forward as one segment) is tried, and the fitting plan with the least
    recompute cost (then fewest bytes) wins; if none fits, the plan with the fewest bytes is
    returned as INFEASIBLE.
    """
    start = time.perf_counter()
    bounds, mode = boundary_groups(problem)
    if every is not None or budget is None:
        return _checkpoint_plan(problem, bounds, every or 2, solver="uniform", start=start,
                                budget=budget, mode=mode)
    plans = [_checkpoint_plan(problem, bounds, k, solver="uniform", start=start, budget=budget,
                              mode=mode) for k in range(1, len(bounds) + 2)]
    fitting = [p for p in plans if p.saved_bytes <= budget]
    if fitting:
        best = min(fitting, key=lambda p: (p.recompute_cost, p.saved_bytes))
    else:
        best = min(plans, key=lambda p: (p.saved_bytes, p.recompute_cost))
    return replace(best, solve_time_s=time.perf_counter() - start)


def uniform_checkpoints(problem: Problem, everies: Sequence[int]) -> list[Plan]:
    """``uniform_checkpoint`` at each spacing in ``everies``, the block boundaries found once;
    a spacing that gives no valid plan is left out."""
    start = time.perf_counter()
    bounds, mode = boundary_groups(problem)
    plans = []
    for every in everies:
        try:
            plans.append(_checkpoint_plan(problem, bounds, every, solver="uniform", start=start,
                                          budget=None, mode=mode))
        except (PlanError, InfeasibleError):
            continue
    return plans


def sqrt_checkpoint(problem: Problem, budget: int | None) -> Plan:
    """Chen et al.'s sqrt(n) checkpointing: every ``ceil(sqrt(n))``-th of the n block boundaries."""
    start = time.perf_counter()
    bounds, mode = boundary_groups(problem)
    k = max(1, math.ceil(math.sqrt(len(bounds))))
    return _checkpoint_plan(problem, bounds, k, solver="sqrt", start=start, budget=budget,
                            mode=mode)
