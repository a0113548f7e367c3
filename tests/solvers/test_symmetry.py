"""Repeated-layer detection and the tied solve: positions found on graphs built from one block,
the tied problem solved alike by two engines, and the tied plan as a warm start keeping the
brute-force optimum."""

import math
import pickle

import pytest
from support.brute_force import Enumeration
from support.random_problems import repeated_problem

from solvers import check_plan
from solvers.catalog import check_options
from solvers.mip import solve_mip
from solvers.mip_model import build_model, presolve, tie
from solvers.options import SAVED, CpsatOptions, MilpOptions
from solvers.symmetry import find_repeated


def _options(engine, **options):
    return CpsatOptions(**options) if engine == "cpsat" else MilpOptions(backend=engine, **options)


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_groups_are_one_position_across_layers(seed):
    problem = repeated_problem(seed, layers=8, per_layer=6)
    sym = find_repeated(problem)
    assert len(sym.groups) == 6  # every position of the block, each in its own group
    for group in sym.groups:
        assert len({name.split("_")[1] for name in group}) == 1  # one position
        assert len({name.split("_")[0] for name in group}) == len(group)  # different layers
    assert 5 <= sym.layers <= 8  # layers next to the ends may look different


def test_ties_on_unstructured_graphs_still_give_valid_plans():
    # random graphs have no repeated blocks: nothing (or little, by chance) is tied, and the
    # answer stays a valid plan within the budget, optimal when nothing was tied
    from support.random_problems import random_problem
    for seed in range(30):
        problem = random_problem(seed, n_forward=10, view_prob=0.2)
        every = Enumeration(problem)  # enumerated once, asked for each budget
        everything = every.best()
        if everything is None:
            continue
        budget = everything.saved_bytes // 2
        best = every.best(budget)
        if best is None:
            continue
        plan = solve_mip(problem, budget, _options("cpsat", symmetry="tie", time_limit_s=10))
        assert check_plan(problem, plan, budget=budget).valid
        assert plan.recompute_cost >= best.recompute_cost - 1e-9
        if not find_repeated(problem).groups:
            assert _close(plan.recompute_cost, best.recompute_cost)


# four seeds in the fast set, all ten in CI
@pytest.mark.parametrize("seed", [*range(4), *(pytest.param(s, marks=pytest.mark.slow) for s in range(4, 10))])
def test_tied_and_warm_solves_against_brute_force(seed):
    problem = repeated_problem(seed, layers=4, per_layer=3, reads=2)
    every = Enumeration(problem)  # enumerated once, asked for each budget
    everything = every.best()
    if everything is None:
        pytest.skip("no valid plan for this block")
    for budget in (int(0.3 * everything.saved_bytes), int(0.6 * everything.saved_bytes),
                   everything.saved_bytes):
        best = every.best(budget)
        if best is None:
            continue
        tied_costs = set()
        for engine in ("cpsat", "highs"):
            warm = solve_mip(problem, budget, _options(engine, symmetry="warm", time_limit_s=20))
            assert check_plan(problem, warm, budget=budget).valid
            assert _close(warm.recompute_cost, best.recompute_cost)
            assert warm.saved_bytes == best.saved_bytes
            tied = solve_mip(problem, budget, _options(engine, symmetry="tie", time_limit_s=20))
            assert check_plan(problem, tied, budget=budget).valid
            assert tied.recompute_cost >= best.recompute_cost - 1e-9
            assert tied.status.value != "optimal"  # optimal for the tied problem only
            if "tie_cost" in tied.extra:
                tied_costs.add(round(tied.extra["tie_cost"], 9))
        assert len(tied_costs) <= 1  # both engines solve the tied problem exactly


def test_unknown_symmetry_is_a_clear_error():
    with pytest.raises(ValueError, match="symmetry"):
        check_options("cpsat", {"symmetry": "layers"}, [SAVED])


def test_real_llama_layers_are_found(tmp_path):
    torch = pytest.importorskip("torch")
    from opt_remat.build import problem_from_joint
    from opt_remat.capture import capture
    from opt_remat.models import Llama

    _, problem = problem_from_joint(capture(lambda: Llama(layers=4, d_model=32, heads=2, seq=16),
                                            (torch.zeros(1, 16, dtype=torch.long),), meta=True))
    sym = find_repeated(problem)
    assert sym.layers == 4 and sym.covered >= 0.6 * len(problem.candidates)
    model = presolve(problem, build_model(problem))
    assert tie(model, sym.groups).num_vars < 0.5 * model.num_vars
    budget = solve_mip(problem, None, _options("highs")).saved_bytes // 2
    full = solve_mip(problem, budget, _options("highs"))
    warm = solve_mip(problem, budget, _options("highs", symmetry="warm"))
    assert _close(warm.recompute_cost, full.recompute_cost)
    tied = solve_mip(problem, budget, _options("highs", symmetry="tie"))
    assert check_plan(problem, tied, budget=budget).valid
    pickle.dumps(tied)  # plans stay plain data
