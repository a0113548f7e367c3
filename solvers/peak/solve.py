"""Least recompute under a budget on the step's *peak* live memory (and optionally saved bytes).

The step is the one ``solvers.liveness`` simulates (forward in graph order; backward in graph order
with recomputation just in time; values freed after their last use). ``peak_search`` (solver
"peak-search" of ``solvers.catalog``) keeps one
``PeakState`` (``solvers.peak.state``) and runs the phases of ``solvers.peak.schedule`` on it:

* a proven lower bound on the recompute cost of every plan that fits, from the linear relaxation
  of ``solvers.peak.rows`` solved by HiGHS (which also proves budgets infeasible), raised by
  cutting planes where its plan overshoots the simulation (``solvers.peak.cuts``);
* plans that fit, judged by the exact simulation: cheap candidates (``solvers.peak.candidates``:
  min-cut, checkpointing, callers' plans, and the fast default's plan (``solvers.fast_peak``),
  computed first, within a share of the time limit (``settings.START_SHARE``), so the search never
  returns a costlier plan where the default finishes in it); the
  relaxation's plans, re-solved at lowered budgets and repaired where they nearly fit
  (``solvers.peak.repair``); on graphs of repeated layers, a dynamic program over the layers
  taking each from a different plan (``solvers.peak.layers``);
  grafts of the cheaper plans that overshoot onto the best one that fits (``solvers.peak.graft``);
  the local search of ``solvers.peak.search`` from all, until it stalls (on big graphs only while
  no plan fits);
* it stops once the gap (cost - bound) / cost is at most ``gap``; Ctrl-C stops it with its best plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Callable, cast

from .. import interrupt, progress
from ..budget import format_bytes
from ..errors import PeakInfeasibleError
from ..liveness import peak_lower_bound, without_gradients
from ..options import PeakSearchOptions
from ..problem import Plan, Problem, Status
from .candidates import caller_plans, frontier_plans
from .schedule import run_schedule
from .settings import START_MIN_S, START_SHARE
from .state import Clock, PeakState

_DEFAULTS = PeakSearchOptions()
# a plan the search starts from: (problem, peak budget, saved-bytes budget, candidates, deadline as a
# time.perf_counter() time, by which it returns its best so far) -> plan
StartPlan = Callable[[Problem, int, "int | None", list[set[str]], float], Plan]
# above this share of the time limit spent on the fast default's plan, the plan's message says so
DEFAULT_SHARE_NOTE = 0.5


def peak_search(problem: Problem, peak_budget: int, budget: int | None = None,
                options: PeakSearchOptions = _DEFAULTS, *,
                candidates: Iterable[Iterable[str]] = (), count_gradients: bool = True,
                start: StartPlan | None = None) -> Plan:
    """The least-recompute plan whose simulated step peak is <= ``peak_budget`` bytes, with a
    proven lower bound on the cost of every such plan (``plan.bound``; the gap in
    ``extra["gap"]``; the strategy that found it in ``extra["found_by"]``).

    The plans it starts from: min-cut across its trade-off, checkpointing every k-th block or
    residual value, and ``candidates`` (such as torch's or the default plan). The solve returns as
    soon as the gap is at most ``options.gap`` (relative). Its effort scales with the graph
    (``settings.FULL_EFFORT_VALUES``): a smaller graph gets a share of ``options.time_limit_s``;
    while no plan fits, all of it until the search stalls. Raises PeakInfeasibleError naming the
    smallest peak found (and whether no plan can fit, proven by the relaxation).
    ``count_gradients=False`` budgets the step without its gradients (``without_gradients``).
    ``start``: a plan to start from, computed first inside the time limit and given a deadline
    (``settings.START_SHARE`` of it) by which it returns its best so far, so the relaxation's
    bound gets the rest (the catalog passes the fast default's, ``solvers.fast_peak``: the search
    never returns a costlier plan than it where it finishes by then).
    ``solvers.progress`` listeners hear of each phase, best cost and bound.
    """
    if peak_budget < 0:
        raise ValueError(f"peak_budget must be >= 0 bytes, got {peak_budget}")
    if not count_gradients:
        plan = peak_search(without_gradients(problem), peak_budget, budget, options, candidates=candidates,
                           start=start)
        return replace(plan, extra={**plan.extra, "count_gradients": False})
    # Ctrl-C between or inside the phases (the local search is Python) stops the solve with its
    # best plan so far, as inside a native solve (solvers.interrupt)
    with interrupt.stop_on_sigint(lambda: None):
        clock = Clock(options.time_limit_s, len(problem.candidates))
        starts = [set(c) for c in candidates]
        # the fast default's plan first (its time counts in the limit): the search never returns
        # a costlier plan than the default's at the same budget (issues #41/#43) where the default
        # finishes in its share of the limit; past it, the default's best so far
        deadline = clock.start + max(START_MIN_S, START_SHARE * float(options.time_limit_s))
        default = [] if start is None else _start_plan(start, problem, peak_budget, budget, starts, deadline)
        frontier = frontier_plans(problem) + caller_plans(problem, starts) + default
        state = PeakState(problem, peak_budget, budget, clock=clock, threads=options.threads, seed=options.seed,
                          gap=options.gap, frontier=frontier)
        run_schedule(state)
        plan = _result(state)
        if not default:
            return plan
        spent = default[0][0].solve_time_s
        plan = replace(plan, extra={**plan.extra, "default_time_s": spent})
        share = spent / max(float(options.time_limit_s), 1e-9)
        if share <= DEFAULT_SHARE_NOTE:
            return plan
        return replace(plan, message=plan.message + f"; the fast default's plan (its start) took {share:.0%} "
                                                    "of the time limit")


def _start_plan(start: StartPlan, problem: Problem, peak_budget: int, budget: int | None,
                candidates: list[set[str]], deadline: float) -> list[tuple[Plan, int]]:
    """The start's plan (the fast default's, its best by ``deadline``) with its simulated peak;
    none where it refuses."""
    try:
        plan = start(problem, peak_budget, budget, candidates, deadline)
    except PeakInfeasibleError:
        return []
    return [(replace(plan, solver="fast default"), int(cast(int, plan.extra["peak"])))]


def _result(state: PeakState) -> Plan:
    best = state.best
    if best is None:
        raise PeakInfeasibleError(state.peak_budget, state.smallest_peak(), False,
                                  peak_lower_bound(state.problem))
    cost = best.recompute_cost
    lower = min(state.bound, cost)
    progress.report(cost, lower, "done")
    relaxed = state.relaxed
    optimal = relaxed is not None and relaxed.status == "optimal"
    closed = cost - lower <= 1e-12 * max(cost, 1e-30) or optimal and cost <= lower
    rel_gap = 0.0 if cost <= 0 else (cost - lower) / cost
    extra = {"peak": state.best_peak, "peak_budget": state.peak_budget, "gap": rel_gap,
             "relaxation_status": relaxed.status if relaxed is not None else None,
             "relaxation_bound": relaxed.bound if relaxed is not None else None,
             "found_by": best.solver, "local_search": best.solver == "local-search",
             "floor": peak_lower_bound(state.problem)}
    return replace(best, solver="peak-search", budget=state.budget, solve_time_s=state.clock.elapsed(),
                   status=Status.OPTIMAL if closed else Status.FEASIBLE,
                   objective=cost, bound=lower, extra=extra,
                   message=f"simulated peak {format_bytes(state.best_peak)} "
                           f"(peak budget {format_bytes(state.peak_budget)}); "
                           f"plan by {best.solver}; recompute cost within {rel_gap:.2%} of the "
                           "proven bound")
