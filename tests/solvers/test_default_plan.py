"""The default path under a saved-bytes budget (``choose_default_plan``: HiGHS, min-cut as the
fallback) against independent methods: brute force on small problems, CP-SAT on mid-size ones."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from support.brute_force import Enumeration
from support.random_problems import random_problem

import opt_remat.solve as solve_stage
from solvers import Status, check_plan
from solvers.catalog import solve
from solvers.options import CpsatOptions


def _budget(problem, share: float) -> int:
    lo = solve(problem, "inputs-only").saved_bytes
    hi = problem.saved_bytes(n for n in problem.backward_reads if problem.can_save(n))
    return lo + int(share * (hi - lo))


@pytest.mark.parametrize("seed", [0, 1])
def test_default_is_the_exact_optimum_where_mincut_is_not(seed):
    problem = random_problem(seed, n_forward=300, n_backward=300, n_inputs=8)
    budget = _budget(problem, 1 / 3)
    cut = solve(problem, "mincut", budget)
    exact = solve(problem, "cpsat", budget, CpsatOptions(time_limit_s=60))
    assert exact.status is Status.OPTIMAL
    assert cut.recompute_cost > exact.recompute_cost  # else this problem shows nothing
    plan = solve_stage.choose_default_plan(problem, budget, {})
    again = solve_stage.choose_default_plan(problem, budget, {})
    assert check_plan(problem, plan, budget=budget).valid
    assert plan.status is Status.OPTIMAL
    # integer costs: both engines are exact, and both break ties by the least saved bytes
    assert (plan.recompute_cost, plan.saved_bytes) == (exact.recompute_cost, exact.saved_bytes)
    assert again.saved == plan.saved  # deterministic


@pytest.mark.parametrize("seed", range(6))
def test_default_matches_brute_force_on_small_problems(seed):
    problem = random_problem(seed, n_forward=9, view_prob=0.3)
    every = Enumeration(problem)
    for share in (0.0, 0.3, 0.7):
        budget = _budget(problem, share)
        best = every.best(budget)
        plan = solve_stage.choose_default_plan(problem, budget, {})
        assert check_plan(problem, plan, budget=budget).valid
        # ties broken by the least saved bytes on both sides
        assert plan.recompute_cost == pytest.approx(best.recompute_cost, abs=1e-12)
        assert plan.saved_bytes == best.saved_bytes


def test_a_failing_search_falls_back_to_mincut_and_says_so(monkeypatch):
    problem = random_problem(0, n_forward=40, n_backward=40, n_inputs=4)
    budget = _budget(problem, 0.3)
    cut = solve(problem, "mincut", budget)

    def crash(*args, **kwargs):
        raise RuntimeError("solver crashed")

    monkeypatch.setattr(solve_stage, "solve_mip", crash)
    with pytest.warns(UserWarning, match="exact search failed.*solver crashed.*min-cut"):
        plan = solve_stage.choose_default_plan(problem, budget, {})
    assert plan.saved == cut.saved and "exact search failed" in plan.message
    assert check_plan(problem, plan, budget=budget).valid


def test_a_search_stopped_by_its_limits_keeps_the_better_plan(monkeypatch):
    problem = random_problem(1, n_forward=300, n_backward=300, n_inputs=8)
    budget = _budget(problem, 1 / 3)
    cut = solve(problem, "mincut", budget)
    exact = solve(problem, "cpsat", budget, CpsatOptions(time_limit_s=60))
    poor = solve(problem, "inputs-only")
    assert poor.saved_bytes <= budget and poor.recompute_cost > cut.recompute_cost > exact.recompute_cost
    for found, want in ((poor, cut), (exact, exact)):
        stopped = dataclasses.replace(found, status=Status.TIME_LIMIT,
                                      message="time limit reached; best plan found")
        monkeypatch.setattr(solve_stage, "solve_mip", lambda *a, _p=stopped, **k: _p)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a search stopped by a limit is no failure to warn of
            plan = solve_stage.choose_default_plan(problem, budget, {})
        assert plan.saved == want.saved and check_plan(problem, plan, budget=budget).valid
        assert "time limit reached" in plan.message  # says where the search stopped
