"""The MIP solvers (CP-SAT, CBC, HiGHS) against brute force, each other and the min-cut."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

import solvers.mip as mip
import solvers.mip_cpsat as mip_cpsat
import solvers.mip_milp as mip_milp
import solvers.mip_model as mip_model
from solvers import InfeasibleError, Node, Problem, Role, Status, check_plan, recompute_closure
from support.brute_force import Enumeration, brute_force
from solvers.mincut import mincut_under_budget
from solvers.mip import BudgetInfeasibleError, solve_mip
from support.random_problems import random_problem
from solvers.catalog import check_options, solve
from solvers.options import SAVED, CpsatOptions, MilpOptions

ENGINES = ("cpsat", "cbc", "highs")


def mip_options(engine: str, **options: object) -> CpsatOptions:
    """Solver "cpsat"'s options (engine ``cpsat``) or "milp"'s with that backend."""
    return CpsatOptions(**options) if engine == "cpsat" else MilpOptions(backend=engine, **options)  # type: ignore[arg-type]


def _min_feasible_bytes(problem: Problem | Enumeration) -> int | None:
    """The smallest saved bytes of any valid plan, by enumerating saved sets."""
    every = problem if isinstance(problem, Enumeration) else Enumeration(problem)
    return min((mem for _, mem, _ in every.rows), default=None)


def _problem(seed: int, n: int, *, view_prob: float, must_recompute_prob: float,
             count_inputs: bool, integer_costs: bool = True) -> Problem:
    p = random_problem(seed, n_forward=n, view_prob=view_prob,
                       must_recompute_prob=must_recompute_prob, integer_costs=integer_costs)
    return dataclasses.replace(p, count_input_bytes=True) if count_inputs else p


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


@settings(max_examples=200, deadline=None)  # 3 engines each: ~7 s on 2 cores
@given(seed=st.integers(0, 10**6), n=st.integers(2, 10), frac=st.floats(0.0, 1.0),
       view_prob=st.sampled_from([0.0, 0.1, 0.4]), must_recompute_prob=st.sampled_from([0.0, 0.15]),
       count_inputs=st.booleans())
def test_engines_are_exact_against_brute_force(seed, n, frac, view_prob, must_recompute_prob,
                                               count_inputs):
    problem = _problem(seed, n, view_prob=view_prob, must_recompute_prob=must_recompute_prob,
                       count_inputs=count_inputs)
    every = Enumeration(problem)  # enumerated once, asked for each budget
    everything = every.best()
    if everything is None:
        with pytest.raises(InfeasibleError):
            solve_mip(problem, 10**9)
        return
    low = _min_feasible_bytes(every)
    budget = int(low + frac * (everything.saved_bytes - low))
    best = every.best(budget)
    assert best is not None
    try:  # the min-cut search charges shared storages per member: it may not reach this budget
        heuristic_cost = mincut_under_budget(problem, budget).recompute_cost
    except InfeasibleError:
        heuristic_cost = math.inf
    for engine in ENGINES:
        plan = solve_mip(problem, budget, mip_options(engine, time_limit_s=20))
        check = check_plan(problem, plan, budget=budget)
        assert check.valid, (engine, check.errors)
        assert plan.status is Status.OPTIMAL, (engine, plan.message)
        assert plan.recompute_cost == pytest.approx(best.recompute_cost, rel=1e-9, abs=1e-9), engine
        # integer costs: the tie-break is exact, so memory matches brute force's (cost, bytes) order
        assert plan.saved_bytes == best.saved_bytes, engine
        assert plan.gap == 0.0 and plan.objective == plan.recompute_cost, engine
        assert plan.recompute_cost <= heuristic_cost + 1e-9, engine
        assert plan.budget == budget and plan.extra["backend"] == engine
        lagrangian = plan.extra["lagrangian_bound"]
        if lagrangian is not None:
            assert lagrangian <= best.recompute_cost + 1e-9, engine


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 10), frac=st.floats(0.0, 1.0),
       view_prob=st.sampled_from([0.0, 0.3]))
def test_float_costs_agree(seed, n, frac, view_prob):
    problem = _problem(seed, n, view_prob=view_prob, must_recompute_prob=0.0, count_inputs=False,
                       integer_costs=False)
    every = Enumeration(problem)  # enumerated once, asked for each budget
    everything = every.best()
    if everything is None:
        return
    low = _min_feasible_bytes(every)
    budget = int(low + frac * (everything.saved_bytes - low))
    best = every.best(budget)
    costs = []
    for engine in ENGINES:
        plan = solve_mip(problem, budget, mip_options(engine, time_limit_s=20))
        assert check_plan(problem, plan, budget=budget).valid, engine
        assert plan.status is Status.OPTIMAL, engine
        assert plan.gap is not None and plan.gap <= 1e-6, engine
        assert plan.bound <= plan.recompute_cost, engine
        costs.append(plan.recompute_cost)
    assert all(_close(c, best.recompute_cost) for c in costs), (costs, best.recompute_cost)


@pytest.mark.parametrize("engine", ENGINES)
def test_no_budget_is_least_cost(engine):
    for seed in range(15):
        problem = random_problem(seed, n_forward=8, view_prob=0.3)
        best = brute_force(problem)
        if best is None:
            continue
        plan = solve_mip(problem, None, mip_options(engine))
        assert check_plan(problem, plan).valid
        assert plan.recompute_cost == pytest.approx(best.recompute_cost)
        assert plan.saved_bytes == best.saved_bytes


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("view_prob", [0.0, 0.5])  # no shared storage: min-cut proof; else a solve
def test_infeasible_budget_names_the_smallest_feasible_bytes(engine, view_prob):
    checked = 0
    for seed in range(40):
        problem = random_problem(seed, n_forward=7, view_prob=view_prob)
        low = _min_feasible_bytes(problem)
        if not low:
            continue
        with pytest.raises(BudgetInfeasibleError) as info:
            solve_mip(problem, low - 1, mip_options(engine))
        err = info.value
        assert isinstance(err, InfeasibleError)
        assert err.budget == low - 1 and err.min_feasible_bytes == low and err.proven
        assert str(low - 1) in str(err) and str(low) in str(err)
        assert solve_mip(problem, low, mip_options(engine)).saved_bytes == low
        checked += 1
        if checked == 6:
            break
    assert checked


def test_bad_budgets_raise_value_error():
    problem = random_problem(1, n_forward=5)
    with pytest.raises(ValueError, match="-5"):
        solve_mip(problem, -5)
    with pytest.raises(ValueError, match="budget"):
        solve(problem, "milp", -1)
    with pytest.raises(ValueError, match="backend=.gurobi.*expected one of \\['cbc', 'highs'\\]"):
        check_options("milp", {"backend": "gurobi"}, [SAVED])


def test_no_plan_at_all_raises_infeasible():
    nodes = (
        Node("x", Role.INPUT, bytes=8),
        Node("a", Role.FORWARD, ("x",), bytes=8, cost=1.0, banned=True, saveable=False),
        Node("g", Role.BACKWARD, ("a",), bytes=8),
    )
    with pytest.raises(InfeasibleError) as info:
        solve_mip(Problem(nodes), 100)
    assert not isinstance(info.value, BudgetInfeasibleError)


def test_in_the_catalog_and_options_pass_through():
    problem = random_problem(3, n_forward=9, view_prob=0.3)
    every = Enumeration(problem)
    budget = every.best().saved_bytes // 2 + _min_feasible_bytes(every) // 2
    ref = every.best(budget).recompute_cost
    for name, opts in [("cpsat", {"threads": 1, "seed": 3}), ("milp", {}),
                       ("milp", {"backend": "highs", "time_limit_s": 5})]:
        plan = solve(problem, name, budget, (CpsatOptions if name == "cpsat" else MilpOptions)(**opts))
        assert plan.solver == name and plan.recompute_cost == pytest.approx(ref)
    with pytest.raises(ValueError, match="backend"):
        check_options("milp", {"backend": "glpk"}, [SAVED])


@pytest.mark.parametrize("engine", ENGINES)
def test_tiny_time_limit_on_a_big_problem_still_returns_a_plan(engine):
    problem = random_problem(11, n_forward=3000, n_backward=3000, n_inputs=20)
    budget = 60_000  # between the least (about 35k) and save-all (about 190k) bytes
    plan = solve_mip(problem, budget, mip_options(engine, time_limit_s=0.05))
    assert check_plan(problem, plan, budget=budget).valid
    assert plan.status in (Status.TIME_LIMIT, Status.OPTIMAL)
    assert plan.gap is not None and plan.bound <= plan.objective


def test_falls_back_to_the_warm_start_when_the_solver_finds_nothing(monkeypatch):
    def nothing(*args, **kwargs):
        return mip_cpsat.EngineResult("unknown", None, 0)

    monkeypatch.setattr(mip_cpsat, "run_cpsat", nothing)
    problem = random_problem(4, n_forward=9)
    budget = brute_force(problem).saved_bytes
    plan = solve_mip(problem, budget)
    assert plan.status is Status.TIME_LIMIT and "fell back" in plan.message
    assert check_plan(problem, plan, budget=budget).valid and plan.gap is not None

    monkeypatch.setattr(mip, "warm_start", lambda *a, **k: mip.WarmStart(None, None, 0, None))
    with pytest.raises(mip.MIPTimeLimitError):
        solve_mip(problem, budget)


def test_model_presolve_drops_what_does_not_matter():
    # "dead" is read by nothing in the backward; "e" runs in either pass from free inputs
    nodes = (
        Node("x", Role.INPUT, bytes=64),
        Node("e", Role.EITHER, ("x",), bytes=32, cost=1.0),
        Node("a", Role.FORWARD, ("x", "e"), bytes=16, cost=2.0),
        Node("dead", Role.FORWARD, ("a",), bytes=16, cost=5.0),
        Node("g", Role.BACKWARD, ("a",), bytes=8),
    )
    problem = Problem(nodes)
    model = mip_model.build_model(problem)
    assert set(model.s_var) == {"a"} and set(model.r_var) == {"a"}
    assert model.free_saved == ["x"]
    assert solve_mip(problem, 0).recomputed == frozenset({"e", "a"})
    assert solve_mip(problem, 16).saved == frozenset({"a"})


def test_a_wrong_infeasible_claim_is_caught(monkeypatch):
    # CBC reports "infeasible" when its time limit cuts preprocessing short
    problem = random_problem(6, n_forward=9, view_prob=0.4)
    budget = brute_force(problem).saved_bytes
    monkeypatch.setattr(mip_milp, "run_cbc", lambda *a, **k: mip_cpsat.EngineResult("infeasible", None, None))
    plan = solve_mip(problem, budget, mip_options("cbc"))  # refuted by the fitting min-cut plan
    assert plan.status is Status.TIME_LIMIT and "infeasible" in plan.message
    assert check_plan(problem, plan, budget=budget).valid

    monkeypatch.setattr(mip, "warm_start", lambda *a, **k: mip.WarmStart(None, None, 0, None))
    plan = solve_mip(problem, budget, mip_options("cbc"))  # refuted by the least-memory solve
    assert plan.status is Status.TIME_LIMIT and "least-memory" in plan.message
    assert check_plan(problem, plan, budget=budget).valid


def test_presolve_keeps_the_optimum_on_chain_heavy_problems():
    # few backward reads: many values feed one consumer and are read by nothing, which is what
    # the dominance reductions act on
    reductions = 0
    for seed in range(60):
        rng = random.Random(seed)
        problem = random_problem(seed, n_forward=rng.randint(5, 10), n_backward=rng.randint(1, 3),
                                 max_fanin=2, view_prob=0.35, either_prob=0.15)
        every = Enumeration(problem)  # enumerated once, asked for each budget
        everything = every.best()
        if everything is None:
            continue
        model = mip_model.build_model(problem)
        reduced = mip_model.presolve(problem, model)
        reductions += reduced.merged + reduced.fixed
        low = _min_feasible_bytes(every)
        for frac in (0.0, 0.4, 1.0):
            budget = int(low + frac * (everything.saved_bytes - low))
            best = every.best(budget)
            for engine in ("cpsat", "highs"):
                plan = solve_mip(problem, budget, mip_options(engine, time_limit_s=20))
                assert check_plan(problem, plan, budget=budget).valid
                assert _close(plan.recompute_cost, best.recompute_cost), (seed, frac, engine)
                assert plan.saved_bytes == best.saved_bytes, (seed, frac, engine)
        # a saved set with the dominated savings replaced is valid, no costlier, no larger
        for _ in range(5):
            saved = [v for v in model.s_var if rng.random() < 0.5] + model.free_saved
            rec, err = recompute_closure(problem, saved)
            if err:
                continue
            norm = mip_model.normalize_saved(reduced, saved)
            rec2, err2 = recompute_closure(problem, norm)
            assert not err2
            assert problem.recompute_cost(rec2) <= problem.recompute_cost(rec) + 1e-9
            assert problem.saved_bytes(norm) <= problem.saved_bytes(saved)
    assert reductions > 50  # the reductions did fire
