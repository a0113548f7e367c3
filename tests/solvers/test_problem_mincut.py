"""The problem model, the checker and the min-cut, against brute force on random small DAGs."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from solvers import InfeasibleError, Node, Plan, Problem, ProblemError, Role, Status, check_plan
from support.brute_force import brute_force
from solvers.budget import Fraction, parse_budget
from solvers.mincut import cut_objective, mincut_under_budget, solve_mincut
from support.random_problems import random_problem


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 9), lam=st.sampled_from([0.0, 0.3, 1.0, 4.0, 50.0]))
def test_mincut_is_exact_against_brute_force(seed, n, lam):
    problem = random_problem(seed, n_forward=n)
    best = brute_force(problem, lam=lam)
    if best is None:
        with pytest.raises(InfeasibleError):
            solve_mincut(problem, lam)
        return
    for backend in ("ortools", "networkx"):
        plan = solve_mincut(problem, lam, backend=backend)
        assert check_plan(problem, plan).valid, check_plan(problem, plan).errors
        assert cut_objective(problem, plan, lam) == pytest.approx(best.objective, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_mincut_float_costs_agree_between_backends(seed):
    problem = random_problem(seed, n_forward=30, n_backward=20, integer_costs=False)
    try:
        a = solve_mincut(problem, 7.5, backend="ortools")
    except InfeasibleError:
        return
    b = solve_mincut(problem, 7.5, backend="networkx")
    assert a.objective == pytest.approx(b.objective, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), frac=st.floats(0, 1))
def test_mincut_budget_search_respects_budget(seed, frac):
    problem = random_problem(seed, n_forward=8)
    if brute_force(problem, lam=0.0) is None:
        return
    lo = solve_mincut(problem, 1e-9).saved_bytes
    hi = problem.saved_bytes(n for n in problem.backward_reads if problem.can_save(n))
    budget = int(lo + frac * max(hi - lo, 0))
    plan = mincut_under_budget(problem, budget)
    assert check_plan(problem, plan, budget=budget).valid
    exact = brute_force(problem, budget=budget)
    assert exact is not None and exact.recompute_cost <= plan.recompute_cost + 1e-9


def test_mincut_budget_below_minimum_names_it():
    problem = random_problem(3, n_forward=8)
    least = solve_mincut(problem, 1e-9).saved_bytes
    if least == 0:
        pytest.skip("this problem needs no memory")
    with pytest.raises(InfeasibleError, match=str(least)):
        mincut_under_budget(problem, least - 1)


def chain() -> Problem:
    # x -> a -> b -> c ; backward reads a, b, c. a is banned (say, dropout).
    return Problem((
        Node("x", Role.INPUT, bytes=100),
        Node("a", Role.FORWARD, ("x",), bytes=40, cost=1.0, banned=True),
        Node("b", Role.FORWARD, ("a",), bytes=40, cost=2.0),
        Node("bv", Role.FORWARD, ("b",), bytes=40, storage="b"),  # a view of b
        Node("c", Role.FORWARD, ("bv",), bytes=40, cost=3.0),
        Node("g", Role.BACKWARD, ("a", "bv", "c"), bytes=4),
    ))


def test_checker_catches_invalid_plans():
    p = chain()
    ok = Plan(frozenset({"a", "b"}), frozenset({"bv", "c"}), 40 + 40, 3.0, "hand", Status.FEASIBLE)
    assert check_plan(p, ok).valid
    bad = Plan(frozenset({"b"}), frozenset({"a", "bv", "c"}), 40, 4.0, "hand", Status.FEASIBLE)
    res = check_plan(p, bad)
    assert not res.valid and any("'a'" in e for e in res.errors)
    missing = Plan(frozenset({"a"}), frozenset({"c"}), 40, 3.0, "hand", Status.FEASIBLE)
    assert not check_plan(p, missing).valid
    over = check_plan(p, ok, budget=79)
    assert not over.valid and "exceed" in over.errors[-1]


def test_views_share_storage_and_inputs_are_free():
    p = chain()
    assert p.saved_bytes({"b", "bv"}) == 40
    assert p.saved_bytes({"x", "a"}) == 40
    assert Problem(p.nodes, count_input_bytes=True).saved_bytes({"x", "a"}) == 140


def test_problem_rejects_cycles_and_backward_into_forward():
    with pytest.raises(ProblemError, match="topological"):
        Problem((Node("a", Role.FORWARD, ("b",)), Node("b", Role.FORWARD, ("a",))))
    with pytest.raises(ProblemError, match="reads backward"):
        Problem((Node("g", Role.BACKWARD), Node("a", Role.FORWARD, ("g",))))


def test_lam_trades_memory_for_recompute():
    p = random_problem(11, n_forward=40, n_backward=30)
    plans = [solve_mincut(p, lam) for lam in (0.0, 1.0, 10.0, 1e6)]
    assert all(a.saved_bytes <= b.saved_bytes for a, b in zip(plans, plans[1:]))
    assert all(a.recompute_cost >= b.recompute_cost for a, b in zip(plans, plans[1:]))


@pytest.mark.parametrize("text,expected", [
    ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5GiB", int(1.5 * 2**30)), ("1000", 1000), (123, 123),
])
def test_parse_budget_bytes(text, expected):
    assert parse_budget(text) == expected


def test_parse_budget_fractions_and_errors():
    assert isinstance(parse_budget(0.5), Fraction)
    for bad in ("lots", "12 parsecs", -5, 1.5, -0.1, math.nan, True):
        with pytest.raises(ValueError):
            parse_budget(bad)


def test_recompute_cost_does_not_depend_on_order():
    # the order of a set of names follows string hashing, which differs per process: the parallel
    # runner's workers once reported a plan cost 1 ulp apart from the sequential run
    problem = random_problem(3, n_forward=12, integer_costs=False)
    names = [n.name for n in problem.candidates if problem.recompute_cost_of(n.name) > 0]
    costs = {v: c for v, c in zip(names, [1.0] + [1e-16] * (len(names) - 1))}
    problem = problem.with_nodes([replace(n, cost=costs.get(n.name, n.cost)) for n in problem.nodes])
    forward_sum = problem.recompute_cost(names)
    assert forward_sum == problem.recompute_cost(list(reversed(names)))
    assert forward_sum == math.fsum(costs.values())


def test_derived_data_is_computed_once_per_problem_and_not_compared():
    problem = random_problem(3, n_forward=6)
    calls = []

    def make(p):
        calls.append(p)
        return len(p.nodes)

    assert problem.derived("test.count", make) == len(problem.nodes)
    assert problem.derived("test.count", make) == len(problem.nodes)
    assert calls == [problem]
    assert problem.derived("test.none", lambda p: None) is None  # None is kept too
    assert problem.derived("test.none", make) is None
    # a new problem object derives its own; equality ignores what was derived
    other = problem.with_nodes(problem.nodes)
    assert other == problem and other.derived("test.count", make) == len(other.nodes) and len(calls) == 2
    assert replace(problem) == problem and replace(problem).derived("test.count", make) == len(problem.nodes)
    assert len(calls) == 3


def test_no_module_writes_into_a_problem_outside_its_own():
    """Derived data goes through ``Problem.derived``: no other module reaches into ``__dict__``."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    offenders = [str(p.relative_to(root)) for folder in ("solvers", "opt_remat")
                 for p in (root / folder).rglob("*.py")
                 if p.name != "problem.py" and "problem.__dict__" in p.read_text()]
    assert offenders == []
