"""Baselines: valid plans, honest budgets, never better than the optimum, torch-like behaviour."""

from __future__ import annotations

import importlib.util
import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from solvers import catalog
from solvers.baselines import (dp_knapsack, greedy_knapsack, inputs_only, knapsack_baseline,
                               knapsack_setup, save_all, sqrt_checkpoint, uniform_checkpoint)
from solvers.blocks import block_boundaries
from support.brute_force import brute_force
from solvers.mincut import InfeasibleError
from solvers.options import SAVED, DpOptions
from solvers.problem import Node, Plan, Problem, Role, Status, check_plan
from support.random_problems import random_problem

BASELINES = ("save-all", "inputs-only", "greedy", "dp", "uniform", "sqrt")

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def problems(draw: st.DrawFn, *, must_recompute: bool = True, bans: bool = True) -> Problem:
    seed = draw(st.integers(0, 10**6))
    return random_problem(
        seed,
        n_forward=draw(st.integers(1, 8)),
        n_inputs=draw(st.integers(1, 2)),
        n_backward=draw(st.integers(1, 5)),
        ban_prob=draw(st.sampled_from([0.0, 0.15, 0.4])) if bans else 0.0,
        must_recompute_prob=draw(st.sampled_from([0.0, 0.2])) if must_recompute else 0.0,
        either_prob=draw(st.sampled_from([0.0, 0.2])),
        view_prob=draw(st.sampled_from([0.0, 0.2])),
        integer_costs=draw(st.booleans()),
    )


def budget_for(problem: Problem, fraction: float) -> int:
    """A budget between nothing and a bit more than save-all needs."""
    return int(round(fraction * save_all(problem).saved_bytes))


fractions = st.floats(0.0, 1.3, allow_nan=False)


def test_all_in_the_catalog() -> None:
    assert all(catalog.info(name).run is not None for name in BASELINES)


@SETTINGS
@given(problems())
def test_plans_valid_without_budget(problem: Problem) -> None:
    for name in BASELINES:
        plan = catalog.solve(problem, name)
        res = check_plan(problem, plan)
        assert res.valid, (name, res.errors)
        assert plan.solver == name and plan.budget is None
        assert plan.status is Status.HEURISTIC


@SETTINGS
@given(problems(), fractions)
def test_budget_respected_or_reported(problem: Problem, fraction: float) -> None:
    budget = budget_for(problem, fraction)
    for name in BASELINES:
        plan = catalog.solve(problem, name, budget)
        assert check_plan(problem, plan).valid, name
        assert plan.solver == name and plan.budget == budget
        if plan.status is Status.INFEASIBLE:
            assert plan.saved_bytes > budget, name  # never claims infeasible when it fits
            assert str(plan.saved_bytes) in plan.message
        else:
            assert plan.status is Status.HEURISTIC
            res = check_plan(problem, plan, budget=budget)
            assert res.valid, (name, res.errors)


@SETTINGS
@given(problems(), fractions)
def test_never_better_than_brute_force(problem: Problem, fraction: float) -> None:
    budget = budget_for(problem, fraction)
    best = brute_force(problem, budget=budget)
    for name in BASELINES:
        plan = catalog.solve(problem, name, budget)
        if plan.status is Status.INFEASIBLE:
            continue
        assert best is not None, name  # a fitting valid plan exists, so brute force finds one
        assert best.recompute_cost <= plan.recompute_cost + 1e-9, name


_HAS_MIP = importlib.util.find_spec("solvers.mip") is not None


@pytest.mark.skipif(not _HAS_MIP, reason="solvers/mip.py (the exact MIP) is not there yet")
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), fractions)
def test_never_better_than_mip(problem: Problem, fraction: float) -> None:
    budget = budget_for(problem, fraction)
    exact: Plan | None = None
    for name in BASELINES:
        plan = catalog.solve(problem, name, budget)
        if plan.status is Status.INFEASIBLE:
            continue
        if exact is None:  # a baseline fits, so the exact solver must find a fitting optimum
            exact = catalog.solve(problem, "cpsat", budget)
            assert exact.status is Status.OPTIMAL, exact.message
            assert check_plan(problem, exact, budget=budget).valid
        assert exact.recompute_cost <= plan.recompute_cost + 1e-6 * max(1.0, plan.recompute_cost), name


@SETTINGS
@given(problems(must_recompute=False))
def test_save_all_recomputes_nothing_costly(problem: Problem) -> None:
    assert all(n.saveable for n in problem.nodes)
    plan = save_all(problem)
    assert plan.recompute_cost == 0
    assert plan.recomputed == frozenset()
    assert {r for r in problem.backward_reads} <= plan.saved


@SETTINGS
@given(problems())
def test_inputs_only_recomputes_the_most(problem: Problem) -> None:
    io = inputs_only(problem)
    # every valid plan's recomputed set lies inside the full recompute closure
    for name in BASELINES:
        plan = catalog.solve(problem, name)
        assert plan.recomputed <= io.recomputed, name
        assert plan.recompute_cost <= io.recompute_cost + 1e-9, name
    # and inputs-only saves only what cannot be recomputed (random problems never tag a value
    # both banned and must-recompute, so everything recomputable is recomputable with its inputs)
    assert all(not problem.can_recompute(s) for s in io.saved)


@SETTINGS
@given(problems(bans=False))
def test_inputs_only_saves_no_more_than_save_all(problem: Problem) -> None:
    assert inputs_only(problem).saved_bytes <= save_all(problem).saved_bytes


def test_inputs_only_can_save_more_with_bans() -> None:
    """Why the property above needs no bans: a banned value can be bigger than its result."""
    p = Problem((
        Node("x", Role.INPUT, bytes=16),
        Node("big", Role.FORWARD, ("x",), bytes=1000, cost=1.0, banned=True),
        Node("small", Role.FORWARD, ("big",), bytes=10, cost=1.0),
        Node("g", Role.BACKWARD, ("small",), bytes=10),
    ))
    assert save_all(p).saved_bytes == 10
    assert inputs_only(p).saved_bytes == 1000


# ---- knapsack ---------------------------------------------------------------------------------

knap_items = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 20)), min_size=0, max_size=9)


def _best_knapsack_value(weights: list[float], values: list[float], capacity: float) -> float:
    best = 0.0
    for r in range(len(weights) + 1):
        for combo in itertools.combinations(range(len(weights)), r):
            if sum(weights[i] for i in combo) <= capacity:
                best = max(best, sum(values[i] for i in combo))
    return best


@settings(max_examples=200, deadline=None)
@given(knap_items, st.integers(0, 120))
def test_knapsacks_fit_and_dp_is_exact_on_integers(items: list[tuple[int, int]], cap: int) -> None:
    weights = [float(w) for w, _ in items]
    values = [float(v) for _, v in items]
    g = greedy_knapsack(weights, values, cap)
    d = dp_knapsack(weights, values, cap, unit=1.0)
    assert sum(weights[i] for i in g) <= cap
    assert sum(weights[i] for i in d) <= cap
    assert math.isclose(sum(values[i] for i in d), _best_knapsack_value(weights, values, cap))
    assert sum(values[i] for i in d) >= sum(values[i] for i in g)
    coarse = dp_knapsack(weights, values, cap, unit=7.0)  # coarse buckets never overshoot
    assert sum(weights[i] for i in coarse) <= cap


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=12, unique=True),
       st.data())
def test_greedy_and_dp_keep_all_when_loose(weights: list[int], data: st.DataObject) -> None:
    values = data.draw(st.lists(st.floats(0.01, 100), min_size=len(weights), max_size=len(weights)))
    cap = float(sum(weights)) + data.draw(st.integers(0, 100))
    unit = data.draw(st.sampled_from([1.0, 333.3, 10_000.0]))
    everything = list(range(len(weights)))
    assert greedy_knapsack(weights, values, cap) == everything
    assert dp_knapsack(weights, values, cap, unit=unit) == everything


@SETTINGS
@given(problems())
def test_greedy_and_dp_plans_agree_when_loose(problem: Problem) -> None:
    max_plan, min_plan, items = knapsack_setup(problem)
    weights = [problem.save_weight(s) for s in items]
    assume(len(set(weights)) == len(weights))
    budget = int(min_plan.saved_bytes + sum(weights))
    g = catalog.solve(problem, "greedy", budget)
    d = catalog.solve(problem, "dp", budget)
    assert (g.saved, g.recomputed) == (d.saved, d.recomputed)
    if max_plan.saved_bytes > budget:
        assert g.extra["kept"] == sorted(items, key=problem.index.__getitem__)


@SETTINGS
@given(problems(), fractions, st.sampled_from([1, 3, 50, 10_000]))
def test_dp_quantization_option(problem: Problem, fraction: float, quantization: int) -> None:
    budget = budget_for(problem, fraction)
    plan = catalog.solve(problem, "dp", budget, DpOptions(quantization=quantization))
    assert check_plan(problem, plan).valid
    assert plan.status is Status.INFEASIBLE or check_plan(problem, plan, budget=budget).valid


def test_knapsack_without_budget_is_memory_max_plan() -> None:
    p = random_problem(3, n_forward=10)
    max_plan, _, _ = knapsack_setup(p)
    for solver in ("greedy", "dp"):
        plan = knapsack_baseline(p, None, solver=solver)
        assert plan.saved == max_plan.saved and plan.recompute_cost == max_plan.recompute_cost


# ---- checkpointing ----------------------------------------------------------------------------

def _chain(n: int) -> Problem:
    """x -> f0 -> ... -> f{n-1} (the loss); the backward reads every forward value."""
    nodes = [Node("x", Role.INPUT, bytes=64)]
    prev = "x"
    for i in range(n):
        nodes.append(Node(f"f{i}", Role.FORWARD, (prev,), bytes=100 + i, cost=1.0 + i))
        prev = f"f{i}"
    nodes += [Node(f"g{i}", Role.BACKWARD, (f"f{i}",), bytes=8) for i in range(n - 1)]
    return Problem(tuple(nodes), name=f"chain-{n}")


def test_chain_boundaries_and_uniform() -> None:
    p = _chain(9)
    bounds, mode = block_boundaries(p)
    assert mode == "dominators" and bounds == [f"f{i}" for i in range(8)]
    plan = uniform_checkpoint(p, None)
    assert plan.extra["checkpoints"] == ["f1", "f3", "f5", "f7"]
    assert plan.saved == {"x", "f1", "f3", "f5", "f7"}  # f0 recomputes from the (free) input
    sq = sqrt_checkpoint(p, None)  # ceil(sqrt(8)) = 3
    assert sq.extra["every"] == 3 and sq.extra["checkpoints"] == ["f2", "f5"]
    every1 = uniform_checkpoint(p, None, every=1)
    assert every1.recompute_cost == 0


def test_chain_skip_connection_is_not_a_boundary() -> None:
    nodes = [Node("x", Role.INPUT, bytes=8),
             Node("a", Role.FORWARD, ("x",), bytes=8, cost=1),
             Node("b", Role.FORWARD, ("a",), bytes=8, cost=1),
             Node("c", Role.FORWARD, ("a", "b"), bytes=8, cost=1),  # residual around b
             Node("d", Role.FORWARD, ("c",), bytes=8, cost=1),
             Node("gd", Role.BACKWARD, ("b", "c"), bytes=8)]
    bounds, mode = block_boundaries(Problem(tuple(nodes)))
    assert (bounds, mode) == (["a", "c"], "dominators")


@SETTINGS
@given(problems(), fractions)
def test_uniform_picks_best_spacing_under_budget(problem: Problem, fraction: float) -> None:
    budget = budget_for(problem, fraction)
    plan = uniform_checkpoint(problem, budget)
    n = plan.extra["n_boundaries"]
    assert isinstance(n, int)
    others = [uniform_checkpoint(problem, budget, every=k) for k in range(1, n + 2)]
    fitting = [o for o in others if o.saved_bytes <= budget]
    if fitting:
        assert plan.status is Status.HEURISTIC
        assert plan.recompute_cost == min(o.recompute_cost for o in fitting)
    else:
        assert plan.status is Status.INFEASIBLE
        assert plan.saved_bytes == min(o.saved_bytes for o in others)


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="every=0.*expected an integer >= 1"):
        catalog.check_options("uniform", {"every": 0}, [SAVED])
    with pytest.raises(ValueError, match="quantization=0.*expected an integer >= 1"):
        catalog.check_options("dp", {"quantization": 0}, [SAVED])


def test_walks_avoid_values_nothing_can_provide() -> None:
    """``x`` can be neither saved nor recomputed: every baseline must save ``f`` instead."""
    p = Problem((
        Node("in", Role.INPUT, bytes=8),
        Node("x", Role.FORWARD, ("in",), bytes=8, cost=1, banned=True, must_recompute=True),
        Node("f", Role.FORWARD, ("x",), bytes=8, cost=1),
        Node("h", Role.FORWARD, ("f",), bytes=8, cost=1),
        Node("g", Role.BACKWARD, ("f", "h"), bytes=8),
    ))
    for name in BASELINES:
        plan = catalog.solve(p, name)
        assert check_plan(p, plan).valid, name
        assert "f" in plan.saved, name


@st.composite
def awkward_problems(draw: st.DrawFn) -> Problem:
    """Random problems with some values unsaveable, or both banned and must-recompute."""
    base = draw(problems())
    nodes = []
    for n in base.nodes:
        if n.role is Role.FORWARD:
            tag = draw(st.sampled_from(["", "", "", "unsaveable", "stuck"]))
            if tag == "unsaveable":
                n = replace(n, saveable=False)
            elif tag == "stuck":
                n = replace(n, banned=True, must_recompute=True)
        nodes.append(n)
    return base.with_nodes(nodes)


@SETTINGS
@given(awkward_problems())
def test_feasibility_agrees_with_brute_force(problem: Problem) -> None:
    best = brute_force(problem)
    for name in BASELINES:
        if best is None:
            with pytest.raises(InfeasibleError):
                catalog.solve(problem, name)
        else:
            plan = catalog.solve(problem, name)
            assert check_plan(problem, plan).valid, name


def test_infeasible_problem_raises() -> None:
    p = Problem((
        Node("x", Role.INPUT, bytes=8),
        Node("r", Role.FORWARD, ("x",), bytes=8, cost=1, banned=True, must_recompute=True),
        Node("g", Role.BACKWARD, ("r",), bytes=8),
    ))
    for name in BASELINES:
        with pytest.raises(InfeasibleError):
            catalog.solve(p, name)
