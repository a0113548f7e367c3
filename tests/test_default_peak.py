"""The drop-in default under a peak budget (``solvers.fast_peak``) keeps its promises on random
problems: the same plan twice (its work is bounded by counts, not a clock), never a refusal where
a checkpointing plan fits (and never costlier than it), a plan that fits the simulated step,
across solves of one graph (plans remembered) a looser budget never costs more, and (one call
each, nothing remembered) no refusal of a budget looser than one it meets; and it spends the
budget: never costlier than the min-cut/checkpointing plans it starts from."""

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opt_remat import plan_memory
from opt_remat.plan_memory import GraphKey
from opt_remat.solve import PeakBudgetError, choose_peak_plan
from solvers.baselines import save_all, uniform_checkpoints
from solvers.fast_peak import _pool, fast_peak_plan
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.peak import PeakInfeasibleError
from solvers.peak.candidates import cheapest_fitting
from solvers.problem import check_plan
from support.random_problems import random_problem, repeated_problem

PROBLEMS = st.builds(lambda seed, layered: repeated_problem(seed, layers=5, per_layer=5) if layered
                     else random_problem(seed, n_forward=12), st.integers(0, 10**6), st.booleans())


def _budget(problem, fraction: float) -> int:
    floor, top = peak_lower_bound(problem), simulate_plan(problem, save_all(problem).saved).peak
    return int(floor + fraction * (top - floor))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=PROBLEMS, fraction=st.floats(0.0, 1.0))
def test_the_same_plan_twice(problem, fraction):
    budget = _budget(problem, fraction)
    try:
        first = fast_peak_plan(problem, budget)
    except PeakInfeasibleError as exc:
        try:
            fast_peak_plan(problem, budget)
        except PeakInfeasibleError as again:
            assert again.min_peak == exc.min_peak
            return
        raise AssertionError("refused once, planned the second time") from None
    again = fast_peak_plan(problem, budget)
    assert (first.saved, first.recompute_cost, first.extra["found_by"]) == \
        (again.saved, again.recompute_cost, again.extra["found_by"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=PROBLEMS, every=st.sampled_from([1, 2, 4]), slack=st.floats(0.0, 0.3))
def test_never_refuses_what_checkpointing_meets_and_never_costs_more(problem, every, slack):
    plans = uniform_checkpoints(problem, (every,))
    if not plans:
        return
    ck = plans[0]
    peak = simulate_plan(problem, ck.saved).peak
    budget = int(peak * (1 + slack))
    plan = fast_peak_plan(problem, budget)  # raises if refused: the test fails
    assert check_plan(problem, plan).valid
    assert simulate_plan(problem, plan.saved).peak == plan.extra["peak"] <= budget
    assert plan.recompute_cost <= ck.recompute_cost + 1e-12


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=PROBLEMS, fraction=st.floats(0.05, 0.95))
def test_spends_the_budget_its_starting_plans_leave(problem, fraction):
    """Never costlier than the cheapest fitting plan of its own pool (min-cut, checkpointing)."""
    budget = _budget(problem, fraction)
    start = cheapest_fitting(_pool(problem, ()), budget, None)
    if start is None:
        return
    plan = fast_peak_plan(problem, budget)
    assert plan.recompute_cost <= start[0].recompute_cost + 1e-12
    assert simulate_plan(problem, plan.saved).peak <= budget


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=PROBLEMS, fractions=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4))
def test_a_looser_budget_never_costs_more_across_solves(problem, fractions):
    budgets = sorted({_budget(problem, f) for f in fractions})
    plan_memory.forget_all()
    key = GraphKey(f"{problem.name}-{hash(tuple(budgets))}", {n.name: n.name for n in problem.nodes})
    costs = []
    for b in budgets:
        try:
            costs.append(choose_peak_plan(problem, None, b, None, memory=key).recompute_cost)
        except PeakBudgetError:
            costs.append(None)
    for tighter, looser in zip(costs, costs[1:]):
        if tighter is not None:
            assert looser is not None and looser <= tighter + 1e-12, (budgets, costs)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=PROBLEMS, fractions=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=5))
# the layered problems where the relaxation's plans at the budget once missed a looser budget
@example(problem=repeated_problem(26, layers=5, per_layer=5), fractions=[0.55, 0.6, 0.85, 0.9])
@example(problem=repeated_problem(18, layers=5, per_layer=5), fractions=[0.25, 0.3])
# ... and the one that still did before the refusal rule (fast_peak._lowest_met)
@example(problem=random_problem(14, n_forward=12), fractions=[0.5, 0.55])
def test_a_refusal_is_monotone_in_the_budget(problem, fractions):
    """Each budget solved alone (nothing remembered): once one is met, every looser one is."""
    budgets = sorted({_budget(problem, f) for f in fractions})
    met = []
    for b in budgets:
        try:
            plan = fast_peak_plan(problem, b)
        except PeakInfeasibleError:
            met.append(False)
            continue
        assert plan.extra["peak"] <= b
        met.append(True)
    assert met == sorted(met), (budgets, met)


def test_a_search_time_limit_is_the_whole_solves(monkeypatch):
    """What ran before the search (the road's preparation, the min-cut candidate) comes off the
    search's ``time_limit_s``, never below ``MIN_SEARCH_S``."""
    import time

    import opt_remat.solve as solve_module

    seen = []
    real = solve_module.solve_peak

    def recording(problem, name, peak, budget, options, **kw):
        seen.append(options.time_limit_s)
        return real(problem, name, peak, budget, options, **kw)

    monkeypatch.setattr(solve_module, "solve_peak", recording)
    problem = random_problem(3, n_forward=12)
    peak = simulate_plan(problem, save_all(problem).saved).peak
    choose_peak_plan(problem, "cpsat", peak, None, {"time_limit_s": 5}, started=time.perf_counter() - 2)
    choose_peak_plan(problem, "cpsat", peak, None, {"time_limit_s": 5}, started=time.perf_counter() - 60)
    choose_peak_plan(problem, "cpsat", peak, None, {"time_limit_s": 5})
    assert 2.5 < seen[0] <= 3.0 and seen[1] == solve_module.MIN_SEARCH_S and seen[2] == 5
