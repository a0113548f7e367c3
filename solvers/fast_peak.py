"""The default plan under a peak budget: seconds, from the model's structure, not proven optimal.

Every plan is judged by the exact simulation of the step (``solvers.liveness``):

* checkpointing every k-th block (``solvers.baselines.uniform_checkpoints``, k in ``EVERY`` and
  sqrt(n)): what ``torch.utils.checkpoint`` users write by hand; checkpoints at the forward's
  narrow cuts (``solvers.peak.candidates.checkpoint_plans``): low peaks where blocks are unknown;
* min-cut plans across the memory/recompute trade-off (``LAMS`` weights between the extremes of
  ``solvers.mincut.lam_range``);
* callers' plans (plans remembered from earlier solves of the graph, the default path's);
* on graphs of repeated layers, the layer-mix dynamic program of ``solvers.peak.layers`` over
  all of the above and the layer's own trade-off, based on checkpointing every layer: each
  layer takes its decisions from a different plan;
* on small graphs (``relaxed_plans.MAX_VALUES``), the plans of the peak search's relaxation
  (``solvers.peak.relaxed_plans``: HiGHS bounded by nodes, cut rounds and re-solves at lowered
  budgets), often optimal there; a budget the relaxation admits no plan under is refused at once;
* on graphs of repeated layers, the best plan with its decisions outside the layers taken from
  each pool plan (``_outside_swaps``), before the spending and again after it (then spent again);
* the budget those plans leave unused is spent (``solvers.peak.spend``): from the cheapest plans
  that fit, recomputed values are saved back, most recompute per byte first, while the step
  fits (on repeated layers, a value that overshoots rules out its copies in the other layers);
  where none fits, the local search's descent on the overshoot from the lowest peaks first;
* below every pool plan's peak, plans no budget steers (``_refusal_plans``, once per problem):
  the budgets met are exactly those from the lowest peak among them up (``_lowest_met``).

The cheapest plan that fits wins (ties: fewer saved bytes). The work is bounded by counts
(simulations, ``SPEND_WORK``), never by a clock, so the same problem and budget give the same
plan on any machine (the peak search's start alone passes a deadline). ``cpsat``
(``solvers.peak``) is the search with a proven gap.
"""

from __future__ import annotations

import functools
import gc
import math
import time
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from .budget import format_bytes
from .errors import PeakInfeasibleError, PlanError
from .liveness import peak_lower_bound, without_gradients
from .peak.candidates import EVERY, cheapest_fitting, lam_weights, simulated_peak, structural_plans
from .peak.layers import Layers, find_layers, layer_plans
from .peak.relaxed_plans import MAX_VALUES as RELAXED_MAX_VALUES
from .peak.relaxed_plans import REL_GAP as RELAXED_REL_GAP
from .peak.relaxed_plans import relaxed_plans
from .peak.search import Judge, SearchState
from .peak.spend import EXACT_RANK_MAX_NODES, fit_then_spend, lowest_peaks, spend_budget
from .problem import Plan, Problem, Role, Status, plan_from_saved

P = ParamSpec("P")
R = TypeVar("R")
# min-cut weights between lam_range's extremes (geometric): their plans' layers are the layer
# mix's options, so fewer weights give a faster but costlier mix
LAMS = 6
# simulations spent on spending the budget, in node-simulations (a simulation of an n-node step
# counts n): a 700-node graph gets ~360 simulations, the 7B shape's ~60; between these bounds
SPEND_WORK = 250_000
SPEND_MIN, SPEND_MAX = 40, 600
# the cheapest fitting plans the budget is spent from, and the lowest-peak plans descended when
# none fits
SPEND_STARTS = 2
# ... and the fitting plans with the lowest peaks (most room to spend), the last of them ranking by
# recompute gain per ROOMY_BYTE_POWER-th power of the bytes (``spend.spend_budget``'s byte_power)
ROOMY_STARTS = 2
ROOMY_BYTE_POWER = 0.5
DESCEND_STARTS = 2
# graphs of at least this many nodes rule out a value's copies in the other layers once it
# overshoots (``spend.spend_budget``): at 70B it halved the simulations; on small graphs the layers
# differ more (T5: encoder and decoder) and every value is worth its own try
COPIES_MIN_NODES = 2000
# relaxation solves at fixed budgets before a refusal on a small graph (``_refusal_plans``)
REFUSAL_GRID = 8
# ... on graphs up to this many candidate values (each solve takes ~0.5 s at 360: Mixtral)
REFUSAL_RELAXED_MAX_VALUES = 200


def _collector_paused(solve: Callable[P, R]) -> Callable[P, R]:
    """``solve`` with Python's cyclic garbage collector off while it runs (on again after, as it
    was): the simulations allocate many short-lived acyclic objects, and the collections they
    set off, which free nothing, took a fifth of the 70B default's time."""
    @functools.wraps(solve)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        was = gc.isenabled()
        gc.disable()
        try:
            return solve(*args, **kwargs)
        finally:
            if was:
                gc.enable()
    return paused


@_collector_paused
def fast_peak_plan(problem: Problem, peak_budget: int, budget: int | None = None, *,
                   candidates: Iterable[Iterable[str]] = (), count_gradients: bool = True,
                   deadline: float = math.inf) -> Plan:
    """The cheapest plan found (see the module doc) whose simulated step peak is at most
    ``peak_budget`` bytes and whose saved bytes are at most ``budget``. Raises
    PeakInfeasibleError naming the smallest peak met when the budget is below it (``_lowest_met``:
    the budgets met are exactly those from it up).
    ``count_gradients=False`` budgets the step without its gradients. ``deadline`` (a
    ``time.perf_counter()`` time; none by default, so the plan depends on the problem alone):
    the layer mix and the spending stop there, and the best plan by then is returned
    (``extra["cut_short"]``); the peak search's start passes one so its bound gets time. Which
    budgets are refused does not depend on it."""
    start = time.perf_counter()
    if not count_gradients:
        problem = without_gradients(problem)
    pool = _pool(problem, candidates)
    steered: list[tuple[Plan, int]] = []
    proven, bound = False, None
    if len(problem.candidates) <= RELAXED_MAX_VALUES:
        relaxed = relaxed_plans(problem, peak_budget, budget)
        steered += relaxed.plans
        proven, bound = relaxed.infeasible, relaxed.bound
    lowest, unsteered = (None, []) if proven else _lowest_met(problem, pool, peak_budget, budget)
    if lowest is None or peak_budget < lowest:
        # below the lowest peak of the plans no budget steers: refused, even where a plan steered by
        # this budget fits (rare), so that the budgets met are exactly those from that peak up
        smallest = lowest if lowest is not None else _smallest(pool, budget)
        raise PeakInfeasibleError(peak_budget, smallest, False, peak_lower_bound(problem), infeasible_proven=proven)
    layers = find_layers(problem)
    every = next((p for p, _ in pool if p.extra.get("every") == 1), None)
    if layers is not None and every is not None:
        # no deadline by default: the options measured are bounded by the pool's distinct layers
        steered = layer_plans(problem, layers, every.saved, [p.saved for p, _ in pool], peak_budget,
                              budget, deadline=deadline) + steered
    found = pool + steered
    if layers is not None:
        # the outside from the pool before spending too: the spending starts from the cheapest
        found += _outside_swaps(problem, layers, found, pool, peak_budget, budget)
    # the refusal plans are no starts here: they would displace the starts the spending and the
    # descents get (costlier plans on random problems); they are candidates, and spent, below
    # on small graphs the spending from the roomiest plans too, unless the relaxation's bound leaves
    # them nothing to find (on big ones they found nothing and took a third of the time)
    best = cheapest_fitting(found, peak_budget, budget)
    near = best is not None and bound is not None and best[0].recompute_cost <= bound * (1 + RELAXED_REL_GAP)
    roomiest = len(problem.nodes) <= EXACT_RANK_MAX_NODES and not near
    found += _spent(problem, found, peak_budget, budget, layers=layers, deadline=deadline, roomiest=roomiest)
    if layers is not None:
        swapped = _outside_swaps(problem, layers, found, pool, peak_budget, budget)
        if swapped:
            found += swapped
            found += _spent(problem, swapped, peak_budget, budget, starts=1, layers=layers, deadline=deadline)
    if unsteered:
        before = cheapest_fitting(found, peak_budget, budget)
        found += unsteered
        best = cheapest_fitting(found, peak_budget, budget)
        if before is None:  # only they fit: spent as the others would be
            found += _spent(problem, found, peak_budget, budget, layers=layers, deadline=deadline)
        elif best is not None and best is not before:
            found += _spent(problem, [best], peak_budget, budget, starts=1, layers=layers, deadline=deadline)
    best = cheapest_fitting(found, peak_budget, budget)
    assert best is not None  # a plan of the pool or of the refusal plans fits (_lowest_met)
    plan, peak = best
    return Plan(saved=plan.saved, recomputed=plan.recomputed, saved_bytes=plan.saved_bytes,
                recompute_cost=plan.recompute_cost, solver="default", status=Status.HEURISTIC,
                solve_time_s=time.perf_counter() - start, objective=plan.recompute_cost, budget=budget,
                message=f"fast default under the peak budget: the cheapest fitting {_origin(plan)} plan, "
                        f"simulated peak {format_bytes(peak)}",
                extra={"peak": peak, "peak_budget": peak_budget, "found_by": _origin(plan),
                       "cut_short": time.perf_counter() >= deadline})


def _spent(problem: Problem, found: list[tuple[Plan, int]], peak_budget: int, budget: int | None,
           starts: int = SPEND_STARTS, layers: Layers | None = None,
           deadline: float = math.inf, roomiest: bool = False) -> list[tuple[Plan, int]]:
    """Plans that spend the budget the others leave unused (``solvers.peak.spend``), each bounded
    by the same count of simulations (and ``deadline``); on ``layers``, a value that overshoots
    rules out its copies (graphs of ``COPIES_MIN_NODES`` on). ``roomiest``: from the
    ``ROOMY_STARTS`` fitting plans with the lowest peaks too."""
    evaluations = SPEND_MAX if len(problem.nodes) <= EXACT_RANK_MAX_NODES else _evaluations(problem)
    if time.perf_counter() >= deadline:
        return []
    copies = (None if layers is None or len(problem.nodes) < COPIES_MIN_NODES
              else {v: column for column in zip(*layers.slots) for v in column})
    fitting = sorted((x for x in found if x[1] <= peak_budget and (budget is None or x[0].saved_bytes <= budget)),
                     key=lambda x: (x[0].recompute_cost, x[0].saved_bytes, sorted(x[0].saved)))
    states: list[SearchState | None] = []
    chosen: list[frozenset[str]] = []
    for plan, _ in fitting:
        if plan.saved not in chosen and len(chosen) < starts:
            chosen.append(plan.saved)
    powers = [1.0] * len(chosen)
    if roomiest:
        # and the fitting plans with the most room left (checkpointing every layer, often): saving
        # back into them from scratch finds what the cheap plans' own choices rule out; the last
        # in another greedy order, which reaches plans the plain ratio passes by
        roomy = sorted(fitting, key=lambda x: (x[1], x[0].recompute_cost, sorted(x[0].saved)))
        roomy_saved = [p.saved for p, _ in roomy if p.saved not in chosen][:ROOMY_STARTS]
        chosen += roomy_saved
        powers += [1.0] * (len(roomy_saved) - 1) + [ROOMY_BYTE_POWER] * bool(roomy_saved)
    for saved, power in zip(chosen, powers):
        judge = Judge(problem, peak_budget, budget, deadline, evaluations, quick=True)
        states.append(spend_budget(problem, saved, peak_budget, budget, max_evaluations=evaluations, judge=judge,
                                   copies=copies, byte_power=power))
    if not fitting:
        for plan, _ in _lowest(found):
            states.append(fit_then_spend(problem, plan.saved, peak_budget, budget, max_evaluations=evaluations))
    out = []
    for st in states:
        if st is not None:
            plan = plan_from_saved(problem, st.saved, solver="spent", status=Status.HEURISTIC)
            out.append((plan, st.peak))
    return out


def _outside_swaps(problem: Problem, layers: Layers, found: list[tuple[Plan, int]],
                   pool: list[tuple[Plan, int]], peak_budget: int, budget: int | None) -> list[tuple[Plan, int]]:
    """The cheapest fitting plan with its decisions outside the repeated layers (the embedding,
    the loss head) taken from each plan of the pool instead: the layer mix and the spending
    change the layers only, and a min-cut plan's head often costs less. Those that fit and cost
    less, each simulated once."""
    best = cheapest_fitting(found, peak_budget, budget)
    if best is None:
        return []
    mapped = {v for slot in layers.slots for v in slot}
    inputs = {n.name for n in problem.nodes if n.role is Role.INPUT}
    # the inputs saved at no cost (the parameters), whichever side reads them
    free = {v for v in inputs if problem.can_save(v) and not problem.counts_memory(problem.by_name[v].storage_id)}
    kept = {v for v in best[0].saved if v in mapped or v in inputs} | free
    out, seen = [], {best[0].saved}
    for plan, _ in pool:
        saved = frozenset(kept | {v for v in plan.saved if v not in mapped})
        if saved in seen:
            continue
        seen.add(saved)
        try:
            swapped = plan_from_saved(problem, saved, solver="layers", status=Status.HEURISTIC)
        except PlanError:
            continue
        if swapped.recompute_cost >= best[0].recompute_cost:
            continue
        peak = simulated_peak(problem, swapped.saved)
        if peak <= peak_budget and (budget is None or swapped.saved_bytes <= budget):
            out.append((swapped, peak))
    return out


def _lowest(found: list[tuple[Plan, int]]) -> list[tuple[Plan, int]]:
    """The lowest peaks of the structural plans and of the others (relaxation's: cheaper)."""
    order = sorted(found, key=lambda x: (x[1], x[0].recompute_cost, sorted(x[0].saved)))
    return order[:1] + [x for x in order if x[0].solver != order[0][0].solver][:DESCEND_STARTS - 1]


def _lowest_met(problem: Problem, pool: list[tuple[Plan, int]], peak_budget: int,
                budget: int | None) -> tuple[int | None, list[tuple[Plan, int]]]:
    """Whether the budget is met: the lowest peak of the plans no budget steers, and those plans
    beyond the pool. The pool's lowest peak where the budget is at least that; else the refusal
    plans (``_refusal_plans``) in their fixed order until one fits the budget (the lowest among
    them and the pool's, all of them where none fits). Which budgets are met does not depend on
    the budget otherwise: exactly those from the lowest peak of all these plans up (monotone, one
    call each); stopping at the first that fits only saves the rest's work."""
    top = _smallest(pool, budget)
    if top is not None and peak_budget >= top:
        return top, []
    refusal = _refusal_plans(problem, budget, peak_budget)
    return _smallest(pool + refusal, budget), refusal


def _smallest(plans: list[tuple[Plan, int]], budget: int | None) -> int | None:
    """The lowest peak among ``plans`` within the saved-bytes ``budget``."""
    return min((peak for p, peak in plans if budget is None or p.saved_bytes <= budget), default=None)


def _refusal_plans(problem: Problem, budget: int | None, enough: int | None = None) -> list[tuple[Plan, int]]:
    """Plans found with no peak budget steering them, so every budget from the lowest peak among
    them up is met (the budget-steered plans miss some: a refusal between two budgets met). On
    small graphs the relaxation's plans at ``REFUSAL_GRID`` budgets spread between the floor and
    the structural plans' lowest peak, the highest first, each with the descent-then-spend to its
    budget from its lowest plan (as the default at that budget); then the plans met descending on
    the peak to the same budgets from the lowest-peak plans (``spend.lowest_peaks``). Made in this
    order, once per problem, up to the first part with a plan peaking at most ``enough`` (None:
    all)."""
    p = problem
    structural = p.derived("fast_peak.structural_plans", _structural_plans)
    floor = peak_lower_bound(p)
    top = min((peak for _, peak in structural), default=floor)
    targets = [floor + (top - floor) * i // REFUSAL_GRID for i in range(REFUSAL_GRID - 1, -1, -1)]
    small = len(p.candidates) <= REFUSAL_RELAXED_MAX_VALUES
    parts: list[list[tuple[Plan, int]]] = p.derived(f"fast_peak.refusal_plans.{budget}", lambda _: [])
    out: list[tuple[Plan, int]] = []
    # the parts this budget needs, whatever earlier calls made: the same plans for the same budget
    last = len(targets) if small else 0
    for i in range(last + 1):
        if i == len(parts):
            part = _refusal_part(p, structural, out, targets, i, small, budget, enough if i == last else None)
            lowest = _smallest(part, budget)
            if i == last and enough is not None and lowest is not None and lowest <= enough:
                return out + part  # stopped at a plan that meets ``enough``: a prefix, not kept
            parts.append(part)
        out += parts[i]
        lowest = _smallest(out, budget)
        if enough is not None and lowest is not None and lowest <= enough:
            break
    return out


def _refusal_part(p: Problem, structural: list[tuple[Plan, int]], made: list[tuple[Plan, int]],
                  targets: list[int], i: int, small: bool, budget: int | None,
                  enough: int | None = None) -> list[tuple[Plan, int]]:
    """Part ``i`` of ``_refusal_plans``, after the parts ``made``; the last one stops at a plan
    peaking at most ``enough`` (``spend.lowest_peaks``)."""
    if small and i < len(targets):
        relaxed = relaxed_plans(p, targets[i], budget).plans
        part = list(relaxed)
        if relaxed:  # as the default at this budget: the descent from the relaxation's lowest plan
            low = min(relaxed, key=lambda x: (x[1], x[0].recompute_cost, sorted(x[0].saved)))[0]
            st = fit_then_spend(p, low.saved, targets[i], budget, max_evaluations=_evaluations(p))
            if st is not None:
                part.append((plan_from_saved(p, st.saved, solver="spent", status=Status.HEURISTIC), st.peak))
        return part
    starts = [plan.saved for plan, _ in _lowest(structural + made)]
    # halved beyond the small graphs: Mixtral's refusals took 4 s of CPU with the whole count
    evaluations = _evaluations(p) // (1 if small else 2)
    return [(plan_from_saved(p, saved, solver="spent", status=Status.HEURISTIC), peak)
            for saved, peak, _ in lowest_peaks(p, starts, targets, budget, max_evaluations=evaluations,
                                               enough=enough)]


def _evaluations(problem: Problem) -> int:
    return max(SPEND_MIN, min(SPEND_MAX, SPEND_WORK // max(1, len(problem.nodes))))


def _origin(plan: Plan) -> str:
    if plan.solver == "uniform":
        return f"checkpoint every {plan.extra.get('every')}"
    return {"layers": "layer mix", "mincut": "min-cut frontier", "checkpoint": "narrow-cut checkpoint",
            "candidate": "offered", "spent": "budget spent", "relaxation": "relaxation"}.get(plan.solver, plan.solver)


def _pool(problem: Problem, candidates: Iterable[Iterable[str]]) -> list[tuple[Plan, int]]:
    """Checkpointing, min-cut and offered plans, each once, with their simulated peaks (the
    budget-free ones computed once per problem: a sweep of budgets shares them)."""
    out = list(problem.derived("fast_peak.structural_plans", _structural_plans))
    seen = {plan.saved for plan, _ in out}
    for saved in candidates:
        try:
            plan = plan_from_saved(problem, saved, solver="candidate", status=Status.HEURISTIC)
        except PlanError:
            continue  # a remembered plan from another setting (bans, must-saves) that does not apply
        if plan.saved not in seen:
            seen.add(plan.saved)
            out.append((plan, simulated_peak(problem, plan.saved)))
    return out


def _structural_plans(problem: Problem) -> list[tuple[Plan, int]]:
    """Checkpointing and min-cut plans (``LAMS`` weights), each once, with their simulated peaks."""
    return structural_plans(problem, lam_weights(problem, LAMS), EVERY)
