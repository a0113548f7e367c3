"""Least recompute under a budget on the step's *peak* live memory (and optionally saved bytes).

The step is the one ``solvers.liveness`` simulates (forward in graph order; backward in graph order
with recomputation just in time; values freed after their last use). ``solve_peak``:

* a proven lower bound on the recompute cost of every plan that fits, from the linear relaxation
  of ``solvers.peak_bound`` solved by HiGHS (which also proves budgets infeasible), raised by
  cutting planes where its plan overshoots the simulation (``solvers.peak_cuts``);
* plans that fit, judged by the exact simulation: the relaxation's plans re-solved at lowered
  budgets, and repaired where they nearly fit (``solvers.peak_repair``); cheap candidates
  (``solvers.peak_candidates``: min-cut, checkpointing, callers' plans); on graphs of repeated
  layers, a dynamic program over the layers taking each from a different plan
  (``solvers.peak_layers``); grafts of the cheaper plans that overshoot onto the best one that
  fits (``solvers.peak_graft``); on small graphs the stage model (``solvers.peak_stages``); the
  local search of ``solvers.peak_search`` from all, until it stalls (on big graphs only while no
  plan fits);
* it stops once the gap (cost - bound) / cost is at most ``gap``; Ctrl-C stops it with its best plan.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Iterable

from . import interrupt
from .liveness import peak_lower_bound, simulate_plan, without_gradients
from .peak_cuts import CutContext, violated_steps
from .peak_graft import graft_plans
from .peak_layers import find_layers, layer_plans
from .peak_candidates import PeakInfeasibleError, _candidate_plans, _cheapest_fitting, _frontier
from .peak_repair import repair_overshoot
from .peak_search import DEBUG as _DEBUG, StallClock, improve_saved_sets
from .peak_settings import (FULL_EFFORT_VALUES, MIN_EFFORT_S, EFFORT_POWER, SEARCH_SHARE,
                            SEARCH_MAX_VALUES, FINISH_SHARE, STALL_SHARE, STALL_MIN_S, DEFAULT_GAP,
                            RELAX_SHARE, SHRINK_SHARE, CUT_SHARE, CUTS_PER_ROUND, CUT_FIRST_SHARE,
                            CUT_FIRST_NO_PLAN_SHARE, CUT_NO_PLAN_SHARE, NEAR_FIT, REPAIR_SHARE,
                            NEAR_DONE_GAPS, GRAFT_PLANS, GRAFT_SHARE, ROUND_GRAFT_SHARE, LAYERS_SHARE,
                            LAYERS_RELAX_LOOSER, LAYERS_RELAX_SHARE, LAYERS_MAX_COST_RATIO, RELAX_GAP_SHARE,
                            STAGE_MODEL_MAX_VALUES, MIN_RESOLVE_SHARE, SHRINK_SHARE_MIXING,
                            CUT_STALL_ROUNDS, CUT_STALL_GAIN, PROBING_MAX_VALUES)
from .peak_stages import _solve_model
from .problem import Plan, PlanError, Problem, Status, plan_from_saved


def solve_peak(problem: Problem, peak_budget: int, budget: int | None = None, *,
               stages: int | None = None, time_limit_s: float = 60.0, threads: int = 2,
               seed: int = 0, hint_saved: set[str] | None = None, gap: float = DEFAULT_GAP,
               candidates: Iterable[Iterable[str]] = (), count_gradients: bool = True,
               search_share: float = SEARCH_SHARE) -> Plan:
    """The least-recompute plan whose simulated step peak is <= ``peak_budget`` bytes, with a
    proven lower bound on the cost of every such plan (``plan.bound``; the gap in
    ``extra["gap"]``).

    1. The relaxation of ``solvers.peak_bound`` (HiGHS) gives the bound, and proves a budget
       infeasible when it admits no plan. Its plan often fits the exact simulation: then it is
       optimal up to the solver's gap.
    2. Otherwise plans that fit: the relaxation re-solved at budgets lowered by its overshoot,
       its plans within ``NEAR_FIT`` of the budget repaired (``solvers.peak_repair``);
       every plan the project can make cheaply (min-cut across its trade-off, checkpointing every
       k-th residual value, ``hint_saved`` and ``candidates`` such as torch's or the default
       plan); on graphs of repeated layers, each layer from a different plan seen
       (``solvers.peak_layers``); grafts of the cheaper plans that overshoot onto the best that
       fits (``solvers.peak_graft``); on small graphs the stage model below; then the local
       search of ``solvers.peak_search`` from all of these, judged by the exact simulation, until it finds
       nothing 0.3% better for ``STALL_SHARE`` of the time limit.
    3. Cutting planes raise the bound: rows at steps where the relaxation's plan overshoots
       the simulation (first where the relaxation is tight, then next to steps cut already and
       where it overshoots most: ``peak_cuts.violated_steps``), counting what recompute chains
       keep live there (``solvers.peak_cuts``);
       their plans are grafted too, and re-solved below the budget when they nearly fit. Once a
       plan fits, a first turn of rounds runs before the local search (which starts from their
       plans too), the rest after it.
    The solve returns as soon as the gap is at most ``gap`` (relative). Its effort scales with
    the graph (``FULL_EFFORT_VALUES``): a smaller graph gets a share of ``time_limit_s``; while no
    plan fits, all of it until the search stalls for that share's ``STALL_SHARE``. Raises
    PeakInfeasibleError naming the smallest peak found (and whether no plan can fit, proven by the
    relaxation).
    ``count_gradients=False`` budgets the step without its gradients (``without_gradients``).
    """
    if peak_budget < 0:
        raise ValueError(f"peak_budget must be >= 0 bytes, got {peak_budget}")
    if not count_gradients:
        plan = solve_peak(without_gradients(problem), peak_budget, budget, stages=stages,
                          time_limit_s=time_limit_s, threads=threads, seed=seed, hint_saved=hint_saved,
                          gap=gap, candidates=candidates, search_share=search_share)
        return replace(plan, extra={**plan.extra, "count_gradients": False})
    # Ctrl-C between or inside the stages (the local search is Python) stops the solve with its
    # best plan so far, as inside a native solve (solvers.interrupt)
    with interrupt.stop_on_sigint(lambda: None):
        return _solve_peak(problem, peak_budget, budget, stages=stages, time_limit_s=time_limit_s,
                           threads=threads, seed=seed, hint_saved=hint_saved, gap=gap,
                           candidates=candidates, search_share=search_share)


def _solve_peak(problem: Problem, peak_budget: int, budget: int | None, *, stages: int | None,
                time_limit_s: float, threads: int, seed: int, hint_saved: set[str] | None,
                gap: float, candidates: Iterable[Iterable[str]], search_share: float) -> Plan:
    from .mip_model import build_model, presolve
    from .peak_bound import Relaxed, peak_rows, relaxed_live, solve_relaxation

    start = time.perf_counter()
    # the effort scales with the graph: each phase's share is of this (measured: the 4-layer test
    # models' solves gained nothing after ~10 s of their 60; the 7B shape's 3,331 values use all).
    # While no plan fits, the whole time limit is the search's (measured: timm's convnext_atto
    # at torch's 0.2 peak needs more than its 17 s). A share is kept back from the limit: HiGHS
    # runs 0.1-0.2 s past its own, then the result is checked (measured, 64-layer small LLaMA:
    # 60.6 s of a 60 s limit without it)
    hard_deadline = start + (1.0 - FINISH_SHARE) * float(time_limit_s)
    time_limit_s = min(float(time_limit_s),
                       max(MIN_EFFORT_S, time_limit_s * min(1.0, len(problem.candidates)
                                                            / FULL_EFFORT_VALUES) ** EFFORT_POWER))
    deadline = min(start + time_limit_s, hard_deadline)

    def left() -> float:  # after a Ctrl-C (solvers.interrupt) no time is left: the best plan so far
        if interrupt.requested():
            return 0.0
        return max(0.0, (deadline if best_plan is not None else hard_deadline) - time.perf_counter())

    frontier = _frontier(problem) + _candidate_plans(
        problem, ([hint_saved] if hint_saved is not None else []) + [set(c) for c in candidates])
    best = _cheapest_fitting(frontier, peak_budget, budget)
    best_plan, best_peak = (best[0], best[1]) if best is not None else (None, None)

    model = presolve(problem, build_model(problem), for_peak=True)  # see presolve: views and peaks
    rows = peak_rows(problem)
    cuts = (CutContext(problem, model, rows), [])  # the cut steps grow as plans overshoot
    # HiGHS proves the relaxation optimal in seconds where CP-SAT takes the whole share without
    # proving it (measured, 7B shape at 0.6x the min-cut peak: 2-3 s vs 18 s unproven); asked for
    # a fraction of the solve's gap, not 1e-4, it returns in 1.7 s where it took 60 s at 0.3x
    rel_gap = max(1e-4, RELAX_GAP_SHARE * gap)

    first_s: list[float] = []  # how long the first relaxation solve took

    def relax(target: int, limit: float, probing: bool = True):
        # a re-solve given much less time than the first took returns nothing, yet HiGHS's
        # presolve runs past a short limit (measured, 64-layer small LLaMA: 2.5 s on a limit of 0)
        if first_s and limit < MIN_RESOLVE_SHARE * first_s[0]:
            return Relaxed("unknown", None, None)
        began = time.perf_counter()
        got = solve_relaxation(problem, model, rows, target, budget, threads=threads, seed=seed,
                               time_limit_s=limit, chains=False, engine="highs", cuts=cuts,
                               rel_gap=rel_gap, probing=probing)
        if not first_s:
            first_s.append(time.perf_counter() - began)
        if _DEBUG:
            print(f"[peak] relax: limit {limit:.1f} s, took {time.perf_counter() - began:.1f} s, "
                  f"{got.status}", flush=True)
        return got

    relaxed = relax(peak_budget, RELAX_SHARE * time_limit_s)
    if relaxed.status == "infeasible":
        raise PeakInfeasibleError(peak_budget, min((pk for _, pk in frontier), default=None), False,
                                  peak_lower_bound(problem), infeasible_proven=True)
    lower = relaxed.bound or 0.0
    first_relaxed = relaxed
    tried: list[frozenset[str]] = []
    last_curve: list = [None]  # the simulation of the last plan offered
    seen: list[tuple[Plan, int]] = []  # every plan offered, with its simulated peak

    def offer(saved: Iterable[str], how: str) -> int | None:
        nonlocal best_plan, best_peak
        try:
            plan = plan_from_saved(problem, saved, solver=how, status=Status.HEURISTIC)
        except PlanError:
            return None
        tried.append(plan.saved)
        curve = simulate_plan(problem, plan.saved)
        last_curve[0] = (plan, curve)
        peak = curve.peak
        seen.append((plan, peak))
        if _DEBUG:
            print(f"[peak] {how}: cost {plan.recompute_cost:.6g} peak {peak} budget {peak_budget} "
                  f"bound {lower:.6g} t={time.perf_counter() - start:.1f}s", flush=True)
        if (peak <= peak_budget and (budget is None or plan.saved_bytes <= budget)
                and (best_plan is None or (plan.recompute_cost, plan.saved_bytes)
                     < (best_plan.recompute_cost, best_plan.saved_bytes))):
            best_plan, best_peak = plan, peak
        elif how.startswith("relaxation") and 0 < peak - peak_budget <= NEAR_FIT * peak_budget \
                and (best_plan is None or plan.recompute_cost < best_plan.recompute_cost) and left() > 0:
            # a relaxation's plan that nearly fits and costs less than the best: its cheapest
            # repairs (solvers.peak_repair); the caller goes on from this plan's simulation
            fixed = repair_overshoot(problem, plan.saved, peak_budget, budget,
                                     cost_below=best_plan.recompute_cost if best_plan else math.inf,
                                     deadline=time.perf_counter() + min(left(), REPAIR_SHARE * time_limit_s))
            if fixed is not None:
                offer(fixed.saved, "repair")
                last_curve[0] = (plan, curve)
        return peak

    def smallest_peak() -> int | None:  # of the plans seen that keep the saved-bytes budget
        return min((pk for p, pk in frontier + seen if budget is None or p.saved_bytes <= budget),
                   default=None)

    def done(gaps: float = 1.0) -> bool:  # within ``gaps`` times the solve's gap of the bound
        return best_plan is not None \
            and best_plan.recompute_cost - lower <= gaps * gap * best_plan.recompute_cost

    overshoot = 0
    if relaxed.saved is not None:
        peak = offer(relaxed.saved, "relaxation")
        overshoot = 0 if peak is None else peak - peak_budget
    relaxed_curve = last_curve[0]
    # plans that fit: the linear relaxation (HiGHS) re-solved at budgets lowered by what its plans
    # overshoot the simulation, then bisected between the highest budget whose plan did not fit
    # and the lowest whose plan did. (The relaxation with recompute chains, solvers.peak_schedule,
    # was a last resort here while nothing fit: measured, on the 4-layer models of the tests and
    # the library models of tests/test_library_models.py none of its plans was the first to fit
    # nor the best, and its CP-SAT solve held the 4-layer GPT at 1/4 of floor..min-cut 3 s.)
    def shrink(share: float, overshoot: int) -> bool:
        """Whether one of these re-solves' plans fits."""
        fits_at, over_at = None, peak_budget if overshoot > 0 else None
        refused_at = None  # the highest budget where the relaxation admits no plan (nor below it)
        target = peak_budget - overshoot
        until = time.perf_counter() + share * time_limit_s
        while over_at is not None and not done() and time.perf_counter() < until - 0.5 and left() > 0:
            again = relax(target, min(until - time.perf_counter(), left(), max(1.0, 0.15 * time_limit_s)))
            if again.status == "unknown" and again.saved is None:
                break  # skipped for want of time, or timed out without a plan: a lower
                # target would not do better in less time
            peak = None if again.saved is None else offer(again.saved, "relaxation, lowered budget")
            if peak is not None and peak <= peak_budget:
                fits_at = target
            elif again.status == "infeasible":
                refused_at = target
            else:
                over_at = target
            low = max(x for x in (fits_at, refused_at, -1) if x is not None)
            if low >= 0 and over_at - low <= peak_budget // 200:
                break
            if fits_at is None and refused_at is None:
                target -= max(peak - peak_budget if peak is not None else 0, peak_budget // 100)
            else:  # measured, 32-layer small LLaMA at 0.6x: the budget lowered by the overshoot
                # admits no plan; bisect rather than lower further
                target = (low + over_at) // 2
            if target <= 0:
                break
        return fits_at is not None

    def graft(seconds: float, first: Plan | None = None) -> None:
        """Grafts of the cheaper plans that overshoot onto the best plan (solvers.peak_graft),
        again from each better plan found, while they gain; ``first``'s before the others."""
        until = time.perf_counter() + seconds
        while best_plan is not None and not done() and time.perf_counter() < until and left() > 0:
            base = best_plan
            cheaper = sorted({p.saved: p for p, pk in seen + frontier
                              if pk > peak_budget and p.recompute_cost < base.recompute_cost}.values(),
                             key=lambda p: (p is not first, p.recompute_cost))[:GRAFT_PLANS]
            for plan, _ in graft_plans(problem, base.saved, [p.saved for p in cheaper], peak_budget,
                                       budget, deadline=min(until, time.perf_counter() + left())):
                offer(plan.saved, "graft")
            if best_plan is base:
                break

    # cutting planes, for the bound: where the relaxation's plan overshoots the simulation, rows
    # that count what recompute chains keep live there (solvers.peak_cuts: valid for every plan,
    # so each re-solve's bound is a bound; their plans are offered too), until its plan fits, the
    # steps repeat or the time is spent. Last: a cut at a few steps moves the relaxation's
    # overshoot to other steps, so its plans are rarely the ones that fit.
    cut_from = [None]  # the last cut round's plan and simulation: the next round goes on from it

    round_s = [0.0]  # how long the last round's solve took
    # once a round's program is solved within the limit, the next ones go without HiGHS's probing:
    # solved at its root, most of its time is the presolve's probing (measured, 32-layer small
    # LLaMA at 0.6x, the second round: 13 s, 8 of them presolve; without probing 10 s, the same
    # bound). Measured with NEAR_DONE_GAPS: 64 layers at 0.6x 2.4% -> 1.2%, 32 layers and the 7B
    # shape unchanged. Where the rounds run out of time (7B) the probing pays: without it in every
    # round, gaps 3.5/3.9/1.8/2.8% -> 4.3/4.7/2.3/6.3% (32 layers at 0.6x: 0.16%)
    # (and on big graphs none do: PROBING_MAX_VALUES)
    probe_rounds = len(problem.candidates) <= PROBING_MAX_VALUES
    cut_stalled = False  # set once the rounds stopped raising the bound while no plan fits

    def cut_rounds(seconds: float, start_from, last: bool = False) -> None:
        nonlocal lower, relaxed, probe_rounds, cut_stalled
        if best_plan is None and cut_stalled:
            return  # an earlier turn stopped for want of progress, from the same last cut plan
        current = cut_from[0] or start_from
        until = time.perf_counter() + seconds
        stalled = 0  # rounds in a row that did not raise the bound
        while current is not None and not done() and time.perf_counter() < until - 0.5 and left() > 0:
            if not last and until - time.perf_counter() < 2 * round_s[0]:
                # a round cut short by the turn's end leaves its rows' bound unsolved, and takes
                # the local search's time (measured, 32-layer small LLaMA at 0.6x: its 2.4 s of an
                # 11 s solve returned nothing); the last turn starts with it instead. Each round
                # has more rows than the last: twice the last one's time
                break
            plan, curve = current
            if curve.peak <= peak_budget:
                break
            # a plan can still overshoot at a step cut already (inside a batch of recomputations,
            # which the row does not see): cut the next steps it overshoots rather than stop
            # the first round also at the step where the relaxation counts most (peak_cuts); later
            # rounds where the plans overshoot most (measured, 32-layer small LLaMA at 0.6x:
            # later rows where the relaxation counts most left the bound as it was)
            counted = None if cuts[1] else relaxed_live(problem, rows, set(plan.saved), set(plan.recomputed))
            new = violated_steps(problem, curve, peak_budget, count=CUTS_PER_ROUND, skip=set(cuts[1]),
                                 relaxed=counted)
            if not new:
                break
            if _DEBUG:
                print(f"[peak] cut steps {new} (cut before: {len(cuts[1])})", flush=True)
            for k in new:
                cuts[0].note(k, set(plan.saved), set(plan.recomputed))
            cuts[1].extend(new)
            began = time.perf_counter()
            again = relax(peak_budget, min(until - began, left()), probing=probe_rounds)
            round_s[0] = time.perf_counter() - began
            probe_rounds = probe_rounds and again.status != "optimal"
            if again.status == "infeasible":  # the cuts hold for every plan that fits
                if best_plan is not None:
                    raise RuntimeError("opt-remat internal error: the peak relaxation's cuts refuse "
                                       "a plan that fits")
                raise PeakInfeasibleError(peak_budget, smallest_peak(),
                                          False, peak_lower_bound(problem), infeasible_proven=True)
            raised = again.bound is not None and again.bound > lower * (1 + CUT_STALL_GAIN)
            if again.bound is not None and again.bound > lower:
                lower = again.bound
                if again.status == "optimal":
                    relaxed = again
            stalled = 0 if raised else stalled + 1
            if again.saved is None:
                break
            last_curve[0] = None
            offer(again.saved, "relaxation with cuts")
            current = cut_from[0] = last_curve[0]
            over = 0 if current is None else current[1].peak - peak_budget
            if over > 0:
                graft(min(ROUND_GRAFT_SHARE * time_limit_s, max(0.0, until - time.perf_counter())),
                      first=current[0])
            if 0 < over <= NEAR_FIT * peak_budget and time.perf_counter() < until - 0.5 \
                    and not done(NEAR_DONE_GAPS):
                # nearly fits: with its cuts, at the budget lowered by its overshoot (measured,
                # 32-layer small LLaMA: cut plans 0.5% over at 1-2% above the bound; bisecting
                # further, tried, took the time of the cut rounds that raise the bound)
                lowered = relax(peak_budget - over, min(until - time.perf_counter(), left()),
                                probing=probe_rounds)
                if lowered.saved is not None:
                    offer(lowered.saved, "relaxation with cuts, lowered budget")
            if best_plan is None and stalled >= CUT_STALL_ROUNDS:
                # no plan fits, so the rounds can only prove that none can: once they stop
                # raising the bound, the rest of the limit would go to rounds that each take
                # longer (measured, 4-layer GPT at 1/4 of floor..min-cut: the bound flat after 15 s,
                # rounds of 3-19 s until 59 s, and no proof)
                cut_stalled = True
                break

    layers = find_layers(problem)
    every = next((p for p, _ in frontier if p.extra.get("every") == 1), None)
    # where checkpointing every layer costs far more than the bound, the savings are not in
    # the layers (measured, 32-layer small LLaMA at 0.6x/0.8x: 5x/11x; its mixes' 10 s
    # delayed the cut rounds: gaps 0.35/0.30% -> 2.3/2.3%; 7B at 0.3x-0.6x: 1.3x-2.3x)
    mixing = layers is not None and every is not None \
        and every.recompute_cost <= LAYERS_MAX_COST_RATIO * lower
    # where the layer mix runs, its plans fit the budget: the lowered re-solves get less time
    # and the cut rounds, which raise the bound, more (measured, 7B shape on a slower machine,
    # 0.3/0.45/0.6/0.8x: gaps 3.4/3.5/1.8/2.8%, with 0.3x of the limit 3.4/5.6/5.0/2.8%)
    shrink(SHRINK_SHARE_MIXING if mixing else SHRINK_SHARE, overshoot)

    looser: list[frozenset[str]] | None = None  # solved at the first mix

    def mix_layers(seconds: float) -> None:
        """Plans taking each repeated layer from a different plan seen so far
        (solvers.peak_layers: a dynamic program over the chain of layers)."""
        nonlocal looser
        if not mixing or done() or left() <= 0:
            return
        base = every.saved
        if looser is None:  # layers to mix in from the relaxation at looser budgets, solved once
            looser = []
            for factor in LAYERS_RELAX_LOOSER:
                again = relax(int(factor * peak_budget), min(LAYERS_RELAX_SHARE * time_limit_s, left()))
                if again.saved is not None:
                    looser.append(frozenset(again.saved))
        until = time.perf_counter() + min(seconds, left())
        # the frontier's and the looser relaxations' layers also on their own (measured, 7B
        # shape at 0.3x: 261.0 ms with the relaxation's lowered-budget plans, 236.1 without: the
        # relaxation's plan at the budget and the frontier)
        trusted = [p.saved for p, _ in frontier] + looser + (
            [frozenset(first_relaxed.saved)] if first_relaxed.saved is not None else [])
        for plan, _ in layer_plans(problem, layers, base, [p.saved for p, _ in seen], peak_budget,
                                   budget, deadline=until, apart=[trusted]):
            offer(plan.saved, "layers")

    # measured, 7B shape at 0.3x the min-cut peak: 243.2 ms in 2 s, where grafts and the local
    # search reached 252.4 ms in 58 s
    mix_layers(LAYERS_SHARE * time_limit_s)
    graft(GRAFT_SHARE * time_limit_s)
    # cut rounds run before the local search and again last, with this share kept for them
    reserved = CUT_SHARE * time_limit_s if relaxed_curve is not None and overshoot > 0 else 0.0
    # once a plan fits, the local search runs on graphs up to SEARCH_MAX_VALUES only (see below)
    search_once_fit = len(problem.candidates) <= SEARCH_MAX_VALUES
    # a first turn of cut rounds before the local search, seeding it with their plans (measured,
    # 32-layer small LLaMA: gap 2.4% -> 0.26% at 0.8x the min-cut peak, 1.3% -> 1.2% at 0.6x;
    # the 7B shape's 0.3x-0.6x solves unchanged). While no plan fits, a shorter turn: the search
    # needs the time (measured, 4-layer GPT at 3/4 of floor..min-cut: its plan took 60 s instead
    # of 10 s), yet the cuts can prove the budget infeasible (ResNet at 1/4: 1.8 s instead of 14 s)
    if reserved and best_plan is not None and not search_once_fit:
        # no local search follows (see below): one turn, its first round given all the time left
        # (measured, 7B shape at 0.45x: that round's HiGHS solve, given 19.8 s, raised the bound
        # to 0.1719 or, where it ran slower, stopped at its root's 0.1687: a gap of 3.9% or 5.7%)
        cut_rounds(left(), relaxed_curve, last=True)
    elif reserved:
        cut_rounds((CUT_FIRST_SHARE if best_plan is not None else CUT_FIRST_NO_PLAN_SHARE)
                   * time_limit_s, relaxed_curve)
    attempts: list[frozenset[str]] = []
    if not done() and len(problem.candidates) <= STAGE_MODEL_MAX_VALUES and left() > 0:
        try:
            plan = _solve_model(problem, peak_budget, budget, stages=stages, time_limit_s=left(),
                                threads=threads, seed=seed, hint_saved=hint_saved,
                                _frontier_plans=frontier,
                                _deadline=time.perf_counter() + (1.0 - search_share) * left(),
                                _attempts=attempts)
            offer(plan.saved, "stage-model")
        except PeakInfeasibleError:
            pass
    found = None
    # the resumed search below stalls from the first one's last gain, not from its own start
    # (measured, 4-layer GPT at 1/4 of floor..min-cut, no plan: its 3 s of a fresh stall clock
    # found nothing; 10.7 s -> 9.5 s; ResNet at 3/4 6.7 s -> 3.7 s, the same smallest peak)
    clock = StallClock()

    def search(seconds: float, stall_s: float, more: list[frozenset[str]]) -> None:
        nonlocal found
        starts = ([best_plan.saved] if best_plan is not None else []) + more + tried + attempts \
            + [p.saved for p, _ in frontier]
        got = improve_saved_sets(problem, starts, peak_budget, budget, time_limit_s=seconds,
                                 stall_s=max(STALL_MIN_S, stall_s), clock=clock)
        if got is not None and simulate_plan(problem, got.saved).peak != got.peak:
            raise RuntimeError("opt-remat internal error: the local search's simulation disagrees "
                               "with solvers.liveness")
        if got is not None:
            found = got
            offer(got.saved, "local-search")

    # the graph's share of the time first (minus the cut rounds'); while nothing fits after it,
    # the rest of the whole limit, from where it stopped. On big graphs only while nothing fits:
    # there its descents gained nothing once a plan fit, and the last cut rounds get the time
    # (measured, 32-layer small LLaMA at 0.6x: gaps 0.95/0.24/1.6% in 35-56 s, was 1.1-2.2% in 56 s)
    soft = max(0.0, min(left(), deadline - time.perf_counter()))
    if not done() and soft > 0 and (best_plan is None or search_once_fit):
        search(max(soft - reserved, min(soft, STALL_MIN_S)), STALL_SHARE * time_limit_s, [])
    if best_plan is None and reserved and left() > 0:
        # still nothing fits: more cut rounds before the long search, as they may prove the budget
        # infeasible (measured, 4-layer ResNet at 1/4 of floor..min-cut: in 1 s more, instead of
        # after the search's 10 s)
        cut_rounds(CUT_NO_PLAN_SHARE * time_limit_s, relaxed_curve)
    if best_plan is None and left() > 0:
        # up to the whole limit, but it stops once it stalls for the graph's share, as before
        # (measured, 4-layer ResNet at 1/4: no plan 0.24% over the budget found 10 s in 14; now
        # 7.7 s. The timm/torchvision tests at torch's peaks still pass, convnext_atto at 0.2 too)
        search(left(), STALL_SHARE * time_limit_s, [found.saved] if found is not None else [])
    if found is not None and best_plan is not None and best_plan.saved == found.saved:
        # with the layers of the search's plans too; else the same mix again (measured, 7B
        # shape: the second mix returned the first's plans, 7 s)
        mix_layers(LAYERS_SHARE * time_limit_s)
    cut_rounds(left(), relaxed_curve, last=True)
    elapsed = time.perf_counter() - start
    if best_plan is None:
        raise PeakInfeasibleError(peak_budget, smallest_peak(), False, peak_lower_bound(problem))
    cost = best_plan.recompute_cost
    lower = min(lower, cost)
    closed = cost - lower <= 1e-12 * max(cost, 1e-30) or relaxed.status == "optimal" and cost <= lower
    rel_gap = 0.0 if cost <= 0 else (cost - lower) / cost
    extra = {"peak": best_peak, "peak_budget": peak_budget, "gap": rel_gap,
             "relaxation_status": relaxed.status, "relaxation_bound": relaxed.bound,
             "found_by": best_plan.solver, "local_search": best_plan.solver == "local-search",
             "floor": peak_lower_bound(problem)}
    return replace(best_plan, solver="cpsat-peak", budget=budget, solve_time_s=elapsed,
                   status=Status.OPTIMAL if closed else Status.FEASIBLE,
                   objective=cost, bound=lower, extra=extra,
                   message=f"simulated peak {best_peak} bytes (peak budget {peak_budget}); "
                           f"plan by {best_plan.solver}; recompute cost within {rel_gap:.2%} of the "
                           "proven bound")
