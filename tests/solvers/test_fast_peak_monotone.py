"""The fast default's refusals are monotone in the peak budget, one call each, nothing
remembered (``solvers.fast_peak._lowest_met``): on many random problems over a grid of budgets,
the budgets met form an upward-closed set, a refusal names a peak that is met, and every plan
fits the simulated step. Seed 14 of ``random_problem`` (12 forward values) refused a budget between
two it met before the refusal rule."""

import pytest
from support.random_problems import random_problem, repeated_problem

from solvers.baselines import save_all
from solvers.fast_peak import fast_peak_plan
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.peak import PeakInfeasibleError

GRID = 9


def _met(problem, budgets):
    """Per budget: (True, the plan's simulated peak) or (False, the smallest peak the refusal names)."""
    out = []
    for b in budgets:
        try:
            plan = fast_peak_plan(problem, b)
        except PeakInfeasibleError as exc:
            out.append((False, exc.min_peak))
            continue
        assert simulate_plan(problem, plan.saved).peak == plan.extra["peak"] <= b
        out.append((True, plan.extra["peak"]))
    return out


def _check(problem, budgets):
    met = _met(problem, budgets)
    flags = [m for m, _ in met]
    assert flags == sorted(flags), (problem.name, budgets, met)  # upward closed
    for b, (m, named) in zip(budgets, met):
        if not m:  # the peak a refusal names is above its budget and met, as every budget above it
            assert named is not None and named > b, (problem.name, b, named)
            assert all(ok for b2, (ok, _) in zip(budgets, met) if b2 >= named), (problem.name, named, met)
    refused = [named for m, named in met if not m]
    if refused:
        assert fast_peak_plan(problem, min(refused)).extra["peak"] <= min(refused)


def _grid(problem, n=GRID):
    floor, top = peak_lower_bound(problem), simulate_plan(problem, save_all(problem).saved).peak
    return sorted({int(floor + i * (top - floor) / (n - 1)) for i in range(n)})


@pytest.mark.parametrize("family", ["random", "repeated"])
def test_the_budgets_met_are_upward_closed_on_many_problems(family):
    for seed in range(20):
        p = (random_problem(seed, n_forward=9) if family == "random"
             else repeated_problem(seed, layers=4, per_layer=4))
        _check(p, _grid(p))


def test_the_problem_that_once_refused_between_two_budgets_met():
    p = random_problem(14, n_forward=12)
    _check(p, _grid(p, 21))
    for seed in (18, 26):  # the layered ones where the relaxation's plans once missed a looser budget
        q = repeated_problem(seed, layers=5, per_layer=5)
        _check(q, _grid(q, 21))


def test_the_same_plan_whatever_was_solved_before_on_the_problem():
    """The refusal plans are made once per problem, part by part as budgets need them: a budget's
    plan is the same on a fresh problem and after a sweep of tighter budgets made more parts."""
    compared = 0
    for seed in range(10):
        fresh = [random_problem(seed, n_forward=9), repeated_problem(seed, layers=4, per_layer=4)]
        swept = [random_problem(seed, n_forward=9), repeated_problem(seed, layers=4, per_layer=4)]
        for p, q in zip(fresh, swept):
            budgets = _grid(q)
            _met(q, budgets)  # every budget, tightest first: the most parts
            for b in budgets[len(budgets) // 3:2 * len(budgets) // 3]:
                try:
                    one = fast_peak_plan(p, b)
                except PeakInfeasibleError:
                    continue
                other = fast_peak_plan(q, b)
                assert (one.saved, one.recompute_cost) == (other.saved, other.recompute_cost), (p.name, b)
                compared += 1
    assert compared >= 15
