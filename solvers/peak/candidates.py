"""Plans a peak solve starts from, cheap to make: min-cut across its trade-off, checkpointing
plans (every k-th block boundary or residual value; the blocks: ``solvers.blocks``), callers'
plans; each with its simulated peak; the cheapest of them that fits (``cheapest_fitting``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..baselines import uniform_checkpoints
from ..blocks import find_blocks, narrow_cut_values
from ..liveness import simulator
from ..errors import InfeasibleError, PlanError
from ..mincut import lam_range, solve_mincut
from ..problem import Plan, Problem, Role, Status, plan_from_saved, recompute_closure

# what torch.utils.checkpoint every k-th block does, the spacings people write
EVERY = (1, 2, 4, 8)


def simulated_peak(problem: Problem, saved: Iterable[str]) -> int:
    """The simulated step peak alone (``simulate_plan(...).peak`` without the curve: half the time
    at 70B)."""
    return simulator(problem).peak(saved)[0]


def frontier_plans(problem: Problem) -> list[tuple[Plan, int]]:
    """Min-cut plans across the memory/recompute trade-off (no weight, the extremes of
    ``lam_range`` and 7 between), and checkpointing plans, with their simulated peaks: cheap
    candidates (warm start, fallback, search starts, the smallest peak found) computed once per
    solve."""
    return structural_plans(problem, [0.0, *lam_weights(problem, 9)])


def lam_weights(problem: Problem, count: int) -> list[float]:
    """``count`` min-cut weights from ``lam_range``'s low extreme to its high one, geometric."""
    lo, hi = lam_range(problem)
    return [lo * (hi / max(lo, 1e-300)) ** (i / (count - 1)) for i in range(count)]


def structural_plans(problem: Problem, weights: Sequence[float],
                     every: Sequence[int] = EVERY) -> list[tuple[Plan, int]]:
    """Checkpointing every k-th block boundary (k in ``every``, and sqrt(n) of the n boundaries),
    min-cut plans at ``weights``, and the narrow-cut checkpoints (``checkpoint_plans``: the lowest
    peaks where blocks are unknown): each saved set once, with its simulated peak."""
    plans = uniform_checkpoints(problem, every)
    bounds_n = plans[0].extra.get("n_boundaries") if plans else None
    if isinstance(bounds_n, int) and bounds_n:
        root = max(1, math.ceil(math.sqrt(bounds_n)))
        if root not in every:
            plans += uniform_checkpoints(problem, (root,))
    for weight in weights:
        try:
            plans.append(solve_mincut(problem, weight))
        except InfeasibleError:
            continue
    seen: set[frozenset[str]] = set()
    out = []
    for plan in plans:
        if plan.saved not in seen:
            seen.add(plan.saved)
            out.append((plan, simulated_peak(problem, plan.saved)))
    for plan, peak in checkpoint_plans(problem):
        if plan.saved not in seen:
            seen.add(plan.saved)
            out.append((plan, peak))
    return out


# checkpointing starts: every k-th value crossing a cut at most w times the narrowest, for these
# (w, k): narrow cuts and long strides hold little and recompute much, wide cuts the reverse
CHECKPOINT_STARTS = ((1.0, 1), (1.0, 2), (1.0, 3), (1.0, 6), (2.0, 1), (2.0, 2), (4.0, 1), (4.0, 2))


def _checkpoint_seeds(problem: Problem) -> list[set[str]]:
    """Per (w, k) of ``CHECKPOINT_STARTS``, the values to checkpoint. Where the model's blocks are
    known (``solvers.blocks``), the narrowest cuts are their boundaries (every k-th block's) and
    the wider ones are looked for within the blocks (the loss head's scalars make cuts narrower
    than any between blocks)."""
    blocks = find_blocks(problem)
    groups = blocks.boundaries if blocks is not None else []
    within = blocks.span if blocks is not None else None
    values: dict[float, list[str]] = {}
    out = []
    for widest, k in CHECKPOINT_STARTS:
        if widest == 1.0 and groups:
            out.append({v for g in groups[k - 1::k] for v in g})
            continue
        if widest not in values:
            values[widest] = narrow_cut_values(problem, widest, largest_only=widest > 1.0, within=within)
        out.append(set(values[widest][::k]))
    return out


def checkpoint_plans(problem: Problem) -> list[tuple[Plan, int]]:
    """Checkpointing plans: every k-th narrow-cut value saved (and what is free), the rest
    recomputed; low-peak starting points that min-cut plans do not reach. Budget-free: made once
    per problem (the fast default and the peak search's frontier both start from them)."""
    return list(problem.derived("peak.candidates.checkpoint_plans", _checkpoint_plans))


def _checkpoint_plans(problem: Problem) -> list[tuple[Plan, int]]:
    by_name = problem.by_name
    free = {n.name for n in problem.nodes if n.role is Role.INPUT and problem.can_save(n.name)}
    out = []
    for seed in _checkpoint_seeds(problem):
        saved = {v for v in seed if problem.can_save(v)} | free
        for _ in range(4):  # values that cannot be recomputed (dropout) are saved where needed
            recomputed, _ = recompute_closure(problem, saved)
            needed = {u for v in recomputed for u in by_name[v].inputs} | set(problem.backward_reads)
            must = {u for u in needed - saved - recomputed if problem.can_save(u)}
            if not must:
                break
            saved |= must
        try:
            plan = plan_from_saved(problem, saved, solver="checkpoint", status=Status.HEURISTIC)
        except PlanError:
            continue  # something the backward needs can be neither saved nor recomputed
        out.append((plan, simulated_peak(problem, plan.saved)))
    return out


def cheapest_fitting(frontier: list[tuple[Plan, int]], peak_budget: int,
                      budget: int | None) -> tuple[Plan, int] | None:
    fitting = [(p, peak) for p, peak in frontier
               if peak <= peak_budget and (budget is None or p.saved_bytes <= budget)]
    return min(fitting, key=lambda x: (x[0].recompute_cost, x[0].saved_bytes)) if fitting else None


def caller_plans(problem: Problem, saved_sets: Iterable[Iterable[str]]) -> list[tuple[Plan, int]]:
    """Callers' plans (the default path's, torch's) with their simulated peaks; invalid ones skipped."""
    out = []
    for saved in saved_sets:
        try:
            plan = plan_from_saved(problem, saved, solver="candidate", status=Status.HEURISTIC)
        except PlanError:
            continue
        out.append((plan, simulated_peak(problem, plan.saved)))
    return out


