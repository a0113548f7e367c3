"""The default plan under a peak budget: seconds, from the model's structure, not proven optimal.

Every plan is judged by the exact simulation of the step (``solvers.liveness``):

* checkpointing every k-th block (``solvers.baselines.uniform_checkpoints``, k in ``EVERY`` and
  sqrt(n)): what ``torch.utils.checkpoint`` users write by hand;
* min-cut plans across the memory/recompute trade-off (``LAMS`` weights between the extremes of
  ``solvers.mincut.lam_range``, and the caller's default ``lam``);
* callers' plans (plans remembered from earlier solves of the graph, the default path's);
* on graphs of repeated layers, the layer-mix dynamic program of ``solvers.peak.layers`` over
  all of the above, based on checkpointing every layer: each layer takes its decisions from a
  different plan.

The cheapest plan that fits wins (ties: fewer saved bytes). Where none fits, or the graph has no
repeated layers, the frontier of ``solvers.peak.candidates.mincut_under_peak`` (checkpoints at
the forward's narrow cuts too) is tried before refusing. The work is bounded by counts, never by
a clock, so the same problem and budget give the same plan. ``cpsat`` (``solvers.peak``) is the
search with a proven gap.
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Iterable, cast

from .baselines import uniform_checkpoints
from .budget import format_bytes
from .errors import InfeasibleError, PeakInfeasibleError, PlanError
from .liveness import peak_lower_bound, simulate_plan, without_gradients
from .mincut import lam_range, solve_mincut
from .peak.candidates import cheapest_fitting, mincut_under_peak
from .peak.layers import find_layers, layer_plans
from .problem import Plan, Problem, Status, plan_from_saved

# checkpoint spacings tried (with sqrt(n)): the ones people write; each more costs a simulation
EVERY = (1, 2, 4, 8)
# min-cut weights between lam_range's extremes (geometric), beside the caller's lam: their plans'
# layers are the layer mix's options, so fewer weights give a faster but costlier mix
LAMS = 6


def fast_peak_plan(problem: Problem, peak_budget: int, budget: int | None = None, *,
                   candidates: Iterable[Iterable[str]] = (), count_gradients: bool = True,
                   lam: float | None = None) -> Plan:
    """The cheapest plan found (see the module doc) whose simulated step peak is at most
    ``peak_budget`` bytes and whose saved bytes are at most ``budget``. Raises
    PeakInfeasibleError naming the smallest peak found when none fits.
    ``count_gradients=False`` budgets the step without its gradients."""
    start = time.perf_counter()
    if not count_gradients:
        problem = without_gradients(problem)
    pool = _pool(problem, lam, candidates)
    best = cheapest_fitting(pool, peak_budget, budget)
    layers = find_layers(problem)
    every = next((p for p, _ in pool if p.extra.get("every") == 1), None)
    if layers is not None and every is not None:
        # no deadline: the options measured are bounded by the pool's distinct layers
        mixed = layer_plans(problem, layers, every.saved, [p.saved for p, _ in pool], peak_budget,
                            budget, deadline=math.inf)
        best = cheapest_fitting(([best] if best else []) + mixed, peak_budget, budget)
    if best is None or layers is None:
        try:
            found = mincut_under_peak(problem, peak_budget, budget)
        except PeakInfeasibleError as exc:
            if best is None:
                smallest = min([peak for _, peak in pool] + ([exc.min_peak] if exc.min_peak else []),
                               default=None)
                raise PeakInfeasibleError(peak_budget, smallest, False, peak_lower_bound(problem)) from None
        else:
            found_peak = cast(int, found.extra["peak"])
            best = cheapest_fitting(([best] if best else []) + [(found, found_peak)], peak_budget, budget)
    assert best is not None
    plan, peak = best
    return Plan(saved=plan.saved, recomputed=plan.recomputed, saved_bytes=plan.saved_bytes,
                recompute_cost=plan.recompute_cost, solver="default", status=Status.HEURISTIC,
                solve_time_s=time.perf_counter() - start, objective=plan.recompute_cost, budget=budget,
                message=f"fast default under the peak budget: the cheapest fitting {_origin(plan)} plan, "
                        f"simulated peak {format_bytes(peak)}",
                extra={"peak": peak, "peak_budget": peak_budget, "found_by": _origin(plan)})


def _origin(plan: Plan) -> str:
    if plan.solver == "uniform":
        return f"checkpoint every {plan.extra.get('every')}"
    return {"layers": "layer mix", "mincut": "min-cut frontier", "checkpoint": "narrow-cut checkpoint",
            "candidate": "offered"}.get(plan.solver, plan.solver)


def _pool(problem: Problem, lam: float | None, candidates: Iterable[Iterable[str]]) -> list[tuple[Plan, int]]:
    """Checkpointing, min-cut and offered plans, each once, with their simulated peaks."""
    out = list(_structural(problem, lam))
    seen = {plan.saved for plan, _ in out}
    for saved in candidates:
        try:
            plan = plan_from_saved(problem, saved, solver="candidate", status=Status.HEURISTIC)
        except PlanError:
            continue  # a remembered plan from another setting (bans, must-saves) that does not apply
        if plan.saved not in seen:
            seen.add(plan.saved)
            out.append((plan, simulate_plan(problem, plan.saved).peak))
    return out


# the budget-free part of the pool, per problem object (a sweep of budgets computes it once)
_STRUCTURAL: dict[tuple[int, float | None], list[tuple[Plan, int]]] = {}


def _structural(problem: Problem, lam: float | None) -> list[tuple[Plan, int]]:
    key = (id(problem), lam)
    if key not in _STRUCTURAL:
        _STRUCTURAL[key] = _structural_plans(problem, lam)
        weakref.finalize(problem, _STRUCTURAL.pop, key, None)
    return _STRUCTURAL[key]


def _structural_plans(problem: Problem, lam: float | None) -> list[tuple[Plan, int]]:
    """Checkpointing and min-cut plans, each once, with their simulated peaks."""
    bounds_n: int | None = None
    plans: list[Plan] = []
    checkpoints = uniform_checkpoints(problem, EVERY)
    if checkpoints:
        bounds_n = cast("int | None", checkpoints[0].extra.get("n_boundaries"))
    if bounds_n:
        root = max(1, math.ceil(math.sqrt(bounds_n)))
        if root not in EVERY:
            checkpoints += uniform_checkpoints(problem, (root,))
    plans += checkpoints
    lo, hi = lam_range(problem)
    lams = [lo * (hi / max(lo, 1e-300)) ** (i / (LAMS - 1)) for i in range(LAMS)]
    for weight in ([lam] if lam is not None else []) + lams:
        try:
            plans.append(solve_mincut(problem, weight))
        except InfeasibleError:
            continue
    seen: set[frozenset[str]] = set()
    out = []
    for plan in plans:
        if plan.saved not in seen:
            seen.add(plan.saved)
            out.append((plan, simulate_plan(problem, plan.saved).peak))
    return out
