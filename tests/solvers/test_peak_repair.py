"""Repairs of plans that nearly fit (solvers.peak.repair): what they return fits, is a valid plan
simulated exactly, costs less than asked, and never less than the cheapest plan that fits
(enumerated on small graphs); the repair by rate goes further than the three-step one."""

import itertools
import math
import threading
import time

import pytest

from support.random_problems import random_problem, repeated_problem

from solvers.baselines import save_all
from solvers.liveness import simulate_plan
from solvers.peak.repair import repair_by_rate, repair_overshoot
from solvers.problem import Status, check_plan, plan_from_saved, recompute_closure


def _cheapest_fitting_cost(p, peak_budget):
    choices = [n.name for n in p.candidates if p.can_save(n.name)]
    best = math.inf
    for r in range(len(choices) + 1):
        for combo in itertools.combinations(choices, r):
            recomputed, err = recompute_closure(p, combo)
            if not err and simulate_plan(p, combo).peak <= peak_budget:
                best = min(best, p.recompute_cost(recomputed))
    return best


def _cheapest_first(p, saved, peak_budget):
    return repair_overshoot(p, saved, peak_budget, None, cost_below=math.inf, deadline=float("inf"))


def _by_rate(p, saved, peak_budget):
    return repair_by_rate(p, saved, peak_budget, None, deadline=float("inf"))


@pytest.mark.parametrize("repair, shaves, least_share", [(_cheapest_first, (0.02, 0.1), 3), (_by_rate, (0.02, 0.2), 2)],
                         ids=["cheapest-first", "by-rate"])
def test_repairs_fit_and_are_never_below_the_optimum(repair, shaves, least_share):
    repaired = tried = 0
    for seed in range(60):
        p = random_problem(seed, n_forward=7, view_prob=0.2, either_prob=0.2, n_backward=5)
        start = save_all(p)
        top = simulate_plan(p, start.saved).peak
        for shave in shaves:
            peak_budget = int(top * (1 - shave))
            tried += 1
            got = repair(p, start.saved, peak_budget)
            if got is None:
                continue
            repaired += 1
            _assert_fits(p, got, peak_budget, seed)
            assert got.cost >= _cheapest_fitting_cost(p, peak_budget) - 1e-12, seed
    assert repaired >= tried // least_share, (repaired, tried)


def test_repairs_respect_the_cost_ceiling_and_gain_on_layered_graphs():
    gained = 0
    for seed in range(12):
        p = repeated_problem(seed, layers=6, per_layer=5)
        start = save_all(p)
        top = simulate_plan(p, start.saved).peak
        peak_budget = int(0.97 * top)
        free = repair_overshoot(p, start.saved, peak_budget, None, cost_below=math.inf,
                                deadline=float("inf"))
        if free is None:
            continue
        gained += 1
        # asked to beat the plan it found, it finds nothing as cheap or cheaper
        again = repair_overshoot(p, start.saved, peak_budget, None, cost_below=free.cost,
                                 deadline=float("inf"))
        assert again is None or again.cost < free.cost
    assert gained >= 6, gained


def _assert_fits(p, got, peak_budget, seed):
    plan = plan_from_saved(p, got.saved, solver="repair", status=Status.HEURISTIC)
    assert check_plan(p, plan).valid, seed
    assert simulate_plan(p, plan.saved).peak == got.peak <= peak_budget, seed
    assert math.isclose(plan.recompute_cost, got.cost, rel_tol=1e-9, abs_tol=1e-15)


def test_rate_repairs_take_many_steps_on_layered_graphs():
    # far over the budget, a few moves are not enough: only the many-step repair fits, on
    # several graphs; with three steps it fits nowhere that it needs more
    further = 0
    for seed in range(12):
        p = repeated_problem(seed, layers=10, per_layer=6)
        start = save_all(p)
        peak_budget = int(0.7 * simulate_plan(p, start.saved).peak)
        got = _by_rate(p, start.saved, peak_budget)
        if got is None:
            continue
        _assert_fits(p, got, peak_budget, seed)
        short = repair_by_rate(p, start.saved, peak_budget, None, deadline=float("inf"), steps=3)
        assert short is None or short.peak <= peak_budget
        further += short is None and _cheapest_first(p, start.saved, peak_budget) is None
    assert further >= 3, further


def _big_state(seed, fraction):
    from solvers.peak.candidates import frontier_plans
    from solvers.peak.settings import SEARCH_MAX_VALUES
    from solvers.peak.state import Clock, PeakState

    p = repeated_problem(seed, layers=130, per_layer=17)
    assert len(p.candidates) > SEARCH_MAX_VALUES  # the rounds' repair is for big graphs only
    start = save_all(p)
    peak_budget = int(fraction * simulate_plan(p, start.saved).peak)
    state = PeakState(p, peak_budget, None, clock=Clock(60.0, len(p.candidates)), threads=1, seed=0, gap=0.01,
                      frontier=frontier_plans(p))
    return p, start, peak_budget, state


def test_a_cut_rounds_plan_that_nearly_fits_is_repaired_on_big_graphs():
    from solvers.peak.strategy_cuts import _Rounds, _repair_round_plan

    repaired = 0
    for seed in (0, 2):
        p, start, peak_budget, state = _big_state(seed, 0.95)
        over = simulate_plan(p, start.saved).peak - peak_budget
        before = state.best.recompute_cost if state.best is not None else math.inf
        _repair_round_plan(state, _Rounds(), start, over, until=math.inf)
        if state.best is None or state.best.recompute_cost >= before:
            continue
        repaired += 1
        assert state.best.solver.startswith("repair of a cut round's plan")
        assert check_plan(p, state.best).valid
        assert simulate_plan(p, state.best.saved).peak == state.best_peak <= peak_budget
    assert repaired >= 1


def test_a_rounds_gap_is_a_share_of_the_open_gap_on_big_graphs_only():
    from types import SimpleNamespace

    from solvers.peak.settings import ROUND_GAP_MAX, ROUND_GAP_SHARE
    from solvers.peak.state import PeakState
    from solvers.peak.strategy_cuts import _round_gap

    def state_of(**fields):  # the fields _round_gap reads, and PeakState's own small()
        state = SimpleNamespace(**fields)
        state.small = lambda: PeakState.small(state)
        return state

    big = SimpleNamespace(candidates=[None] * 3000)
    small = SimpleNamespace(candidates=[None] * 300)
    best = SimpleNamespace(recompute_cost=100.0)
    for problem, bound, want in ((big, 90.0, ROUND_GAP_MAX), (big, 99.0, max(2.5e-3, ROUND_GAP_SHARE * 0.01)),
                                 (big, 99.9, 2.5e-3), (small, 90.0, 2.5e-3)):
        state = state_of(problem=problem, best=best, bound=bound, rel_gap=2.5e-3)
        assert math.isclose(_round_gap(state), want), (len(problem.candidates), bound)
    assert _round_gap(state_of(problem=big, best=None, bound=0.0, rel_gap=2.5e-3)) == 2.5e-3


def test_a_big_graphs_round_offers_the_plans_highs_finds_while_it_solves():
    from solvers.peak import strategy_relaxation
    from solvers.peak.strategy_cuts import _Rounds, _round

    p, _, peak_budget, state = _big_state(0, 0.9)
    strategy_relaxation.run(state, 20.0)
    assert state.relaxed_curve is not None and state.overshoot > 0
    solve, offer = state.relax, state.offer
    found, threads, offered = [], [], []

    def relax(target, limit, **kw):  # the round's solve, its plans noted on their way to the round
        on_plan = kw.pop("on_plan")
        threads.append(threading.current_thread())

        def noted(saved):
            found.append(frozenset(saved))
            on_plan(saved)
        got = solve(target, limit, on_plan=noted, **kw)
        waited = time.perf_counter() + 10.0  # the solve ends once the round took up its last plan
        while found and not any(saved == found[-1] for saved, _ in offered) and time.perf_counter() < waited:
            time.sleep(0.05)
        return got

    def offer_noted(saved, solver):
        offered.append((frozenset(saved), threads[0].is_alive()))
        return offer(saved, solver)

    state.relax, state.offer = relax, offer_noted
    _round(state, _Rounds(), *state.relaxed_curve, until=time.perf_counter() + 20.0)
    assert threads and threads[0] is not threading.main_thread() and not threads[0].is_alive()
    # HiGHS's last plan offered while its solve ran, then again as the round's answer
    assert found and (found[-1], True) in offered and (found[-1], False) in offered
    assert state.bound <= state.best.recompute_cost + 1e-12


def test_an_error_in_the_rounds_solve_reaches_the_caller():
    from solvers.peak.strategy_cuts import _Rounds, _relax_repairing

    *_, state = _big_state(1, 0.9)

    def broken(*args, **kwargs):
        raise RuntimeError("HiGHS rejected the model")

    state.relax = broken
    with pytest.raises(RuntimeError, match="rejected"):
        _relax_repairing(state, _Rounds(), 5.0, time.perf_counter() + 5.0, state.rel_gap)
