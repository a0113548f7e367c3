"""The fast default under peak budgets (solvers.fast_peak) and plans remembered across solves
(opt_remat.plan_memory): the default fits every budget some checkpoint-every-k plan fits at no
more cost, gives the same plan twice, and refuses only below the smallest peak it found; across
solves a looser budget never gets a costlier plan, or a refusal, where a tighter one's plan fits."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.random_problems import random_problem, repeated_problem

from opt_remat import plan_memory
from opt_remat.plan_memory import GraphKey
from opt_remat.solve import PeakBudgetError, choose_peak_plan
from solvers.baselines import save_all, uniform_checkpoints
from solvers.fast_peak import fast_peak_plan
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.peak import PeakInfeasibleError
from solvers.problem import check_plan


def _key(problem, tag=""):
    # a hand-made problem's names are stable: they serve as its canonical ids
    return GraphKey(f"{problem.name}{tag}", {n.name: n.name for n in problem.nodes})


def test_fast_default_fits_where_checkpointing_does_at_no_more_cost():
    checked = 0
    for seed in range(12):
        p = repeated_problem(seed, layers=8, per_layer=6)
        for ck in uniform_checkpoints(p, (1, 2, 4, 8)):
            peak = simulate_plan(p, ck.saved).peak
            plan = fast_peak_plan(p, peak)
            assert check_plan(p, plan).valid, seed
            assert simulate_plan(p, plan.saved).peak == plan.extra["peak"] <= peak, seed
            assert plan.recompute_cost <= ck.recompute_cost + 1e-9, (seed, ck.extra["every"])
            checked += 1
    assert checked >= 30


def test_fast_default_is_deterministic():
    for seed in range(6):
        p = repeated_problem(seed, layers=8, per_layer=6)
        top = simulate_plan(p, save_all(p).saved).peak
        budget = (peak_lower_bound(p) + top) // 2
        try:
            first = fast_peak_plan(p, budget)
        except PeakInfeasibleError:
            continue
        again = fast_peak_plan(p, budget)
        assert (first.saved, first.recompute_cost, first.extra["found_by"]) == \
            (again.saved, again.recompute_cost, again.extra["found_by"])


def test_fast_default_refuses_only_below_the_smallest_peak_it_found():
    p = repeated_problem(1, layers=8, per_layer=6)
    floor = peak_lower_bound(p)
    with pytest.raises(PeakInfeasibleError) as err:
        fast_peak_plan(p, floor - 1)
    smallest = err.value.min_peak
    assert smallest is not None and smallest >= floor
    assert fast_peak_plan(p, smallest).extra["peak"] <= smallest


def _costs(problem, solver, budgets, key):
    out = []
    for b in budgets:
        try:
            options = {"time_limit_s": 2, "threads": 1} if solver == "cpsat" else {}
            out.append(choose_peak_plan(problem, solver, b, None, options, memory=key).recompute_cost)
        except PeakBudgetError:
            out.append(None)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), layered=st.booleans(), solver=st.sampled_from(["mincut", "cpsat"]),
       fractions=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4))
def test_a_looser_peak_budget_never_gets_a_costlier_plan_or_a_refusal(seed, layered, solver, fractions):
    p = repeated_problem(seed, layers=6, per_layer=5) if layered else random_problem(seed, n_forward=10)
    floor, top = peak_lower_bound(p), simulate_plan(p, save_all(p).saved).peak
    budgets = sorted({int(floor + f * (top - floor)) for f in fractions})
    plan_memory.forget_all()
    costs = _costs(p, solver, budgets, _key(p, f"-{seed}-{solver}"))
    for tighter, looser in zip(costs, costs[1:]):
        if tighter is not None:
            assert looser is not None and looser <= tighter + 1e-9, (budgets, costs)


def test_a_remembered_plan_that_fits_and_costs_less_wins_and_survives_the_process():
    """Where the fast default alone costs more than cpsat's plan at a tighter budget, the looser
    solve returns the remembered cpsat plan (or a cheaper one); the plan is on disk too."""
    used = 0
    # the default meets cpsat's plan on seeds 0-29 (its cut rounds) and 199 (the 5th session's
    # spending); 204 and 366 are ones where not
    for seed in (199, 204, 366):
        p = repeated_problem(seed, layers=6, per_layer=6)
        floor, top = peak_lower_bound(p), simulate_plan(p, save_all(p).saved).peak
        tight, loose = floor + (top - floor) // 4, floor + (top - floor) // 3
        try:
            exact = choose_peak_plan(p, "cpsat", tight, None, {"time_limit_s": 2, "threads": 1})
            alone = fast_peak_plan(p, loose)
        except (PeakBudgetError, PeakInfeasibleError):
            continue
        if alone.recompute_cost <= exact.recompute_cost:
            continue
        key = _key(p)
        plan_memory.remember(key, exact.saved)
        plan_memory.forget_all()  # what is left is the file on disk: another process's view
        assert plan_memory.recall(key) == [exact.saved]
        got = choose_peak_plan(p, "mincut", loose, None, memory=key)
        assert got.recompute_cost <= exact.recompute_cost + 1e-9 < alone.recompute_cost
        # the remembered plan wins, or the budget it leaves is spent from it
        assert got.extra["found_by"] in ("remembered plan", "offered", "budget spent") and got.extra["peak"] <= loose
        assert simulate_plan(p, got.saved).peak == got.extra["peak"] and check_plan(p, got).valid
        used += 1
        if used >= 2:
            break
    assert used, "no problem where the memory matters: the test checks nothing"


def test_the_memory_is_off_with_the_environment_variable(monkeypatch):
    p = repeated_problem(2, layers=6, per_layer=5)
    monkeypatch.setenv("OPT_REMAT_PLAN_MEMORY", "0")
    assert plan_memory.graph_key([{"name": "a", "id": "x"}], "g") is None
    monkeypatch.delenv("OPT_REMAT_PLAN_MEMORY")
    key = _key(p)
    plan_memory.remember(key, save_all(p).saved)
    assert plan_memory.recall(key) == [save_all(p).saved]


def test_the_collector_is_left_as_it_was_after_a_plan_or_a_refusal():
    # the default pauses Python's cyclic collector while it runs (speed at 70B); it must come
    # back on after a plan and after a refusal, and stay off for a caller who turned it off
    import gc

    p = random_problem(3, n_forward=20, n_backward=16)
    lo, hi = peak_lower_bound(p), simulate_plan(p, save_all(p).saved).peak
    assert gc.isenabled()
    fast_peak_plan(p, hi)
    assert gc.isenabled()
    with pytest.raises(PeakInfeasibleError):
        fast_peak_plan(p, lo - 1)
    assert gc.isenabled()
    gc.disable()
    try:
        fast_peak_plan(p, hi)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_spending_tries_no_copy_of_a_value_that_overshot():
    # on repeated layers a value whose saving overshoots rules out its copies in the other layers
    # (at 70B each of 80 copies was simulated in turn); every simulated move is logged here
    import math

    from solvers.peak.layers import find_layers
    from solvers.peak.search import Judge
    from solvers.peak.spend import spend_budget

    tried = 0
    for seed in range(6):
        p = repeated_problem(seed, layers=8, per_layer=6)
        layers = find_layers(p)
        if layers is None:
            continue
        position = {v: i for i, col in enumerate(zip(*layers.slots)) for v in col}
        copies = {v: col for col in zip(*layers.slots) for v in col}
        start = uniform_checkpoints(p, (1,))[0]
        lo, hi = simulate_plan(p, start.saved).peak, simulate_plan(p, save_all(p).saved).peak
        for share in (0.2, 0.5, 0.8):
            budget = lo + int(share * (hi - lo))
            judge = Judge(p, budget, None, math.inf, 500)
            moves: list[tuple[frozenset[str], bool]] = []
            state = judge.state

            def logged(closed, state=state, moves=moves, judge=judge):
                st = state(closed)
                moves.append((st.saved, judge.over(st) == 0))
                return st

            judge.state = logged
            spend_budget(p, start.saved, budget, max_evaluations=500, judge=judge, copies=copies)
            accepted, rejected_positions = moves[0][0], set()
            for saved, fits in moves[1:]:
                added = {position[v] for v in saved - accepted if v in position}
                assert not added & rejected_positions, (seed, share)
                tried += 1
                if fits:
                    accepted = saved
                elif len(saved - accepted) == 1:
                    rejected_positions |= added
    assert tried > 20
