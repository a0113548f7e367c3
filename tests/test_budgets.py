"""Memory budgets on real models: measured saved bytes fit the budget and equal the prediction,
gradients equal save-all's (dropout included), infeasible budgets are named."""

import functools

import pytest
import torch

import opt_remat
from opt_remat.models import example_inputs, gpt2, llama
from opt_remat.verify import compare_steps, measured_saved_bytes, save_all_backend, training_step
from solvers import check_plan


pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


@functools.lru_cache(maxsize=None)
def _setup(name):
    torch.manual_seed(0)
    model = gpt2(layers=2, dropout=0.2) if name == "gpt" else llama(layers=2)
    inputs = example_inputs(name, model)
    ref = training_step(model, inputs, save_all_backend("inductor"), seed=5)
    return model, inputs, ref


def _step(model, inputs, solver, budget, **options):
    torch._dynamo.reset()
    be = opt_remat.backend(solver, budget, compiler="eager", decompositions="inductor", **options)
    step = training_step(model, inputs, be, seed=5)
    return step, be.partitioner.history[-1]


_SLOW = pytest.mark.slow  # the fast set keeps each solver and each model once; CI runs every pair


@pytest.mark.parametrize("name,solver,options", [
    ("gpt", "milp", {"backend": "highs"}), ("gpt", "mincut", {}), ("llama", "cpsat", {"time_limit_s": 30}),
    pytest.param("gpt", "cpsat", {"time_limit_s": 30}, marks=_SLOW),
    pytest.param("llama", "milp", {"backend": "highs"}, marks=_SLOW),
    pytest.param("llama", "mincut", {}, marks=_SLOW),
])
def test_budgets_hold_and_gradients_match(name, solver, options):
    model, inputs, ref = _setup(name)
    for budget in (0.8, 0.3, 0.05):
        step, rec = _step(model, inputs, solver, budget, **options)
        assert rec.budget_bytes is not None
        measured = measured_saved_bytes(rec.fw_module, rec.num_fwd_outputs)
        assert measured == rec.plan.saved_bytes <= rec.budget_bytes, (budget, measured, rec.plan)
        assert check_plan(rec.problem, rec.plan, budget=rec.budget_bytes).valid
        check = compare_steps(step, ref)
        assert check.ok and check.max_rel_error <= 1e-6, (budget, check)


def test_exact_solvers_never_recompute_more_than_mincut_or_torch():
    model, inputs, _ = _setup("gpt")
    _, torch_rec = _step(model, inputs, "torch", 0.5)
    bytes_torch = torch_rec.plan.saved_bytes
    _, ours = _step(model, inputs, "cpsat", bytes_torch, time_limit_s=30)
    _, cut = _step(model, inputs, "mincut", bytes_torch)
    assert ours.plan.saved_bytes <= bytes_torch
    assert ours.plan.recompute_cost <= cut.plan.recompute_cost + 1e-15
    # torch's budget path recomputes dropout's random op; opt-remat never does
    assert torch_rec.plan.extra["recomputes_banned"]
    assert not any(n in ours.plan.recomputed for n in torch_rec.plan.extra["recomputes_banned"])


def test_torch_baseline_at_full_budget_is_torch_and_correct():
    model, inputs, ref = _setup("gpt")
    step, rec = _step(model, inputs, "torch", 1.0)
    assert compare_steps(step, ref).max_rel_error <= 1e-6
    assert measured_saved_bytes(rec.fw_module, rec.num_fwd_outputs) == rec.plan.saved_bytes


@pytest.mark.parametrize("solver", ["cpsat", "mincut"])
def test_infeasible_budget_names_the_smallest_feasible(solver):
    model, inputs, _ = _setup("gpt")
    with pytest.raises(Exception) as info:
        _step(model, inputs, solver, 1)
    err = info.value
    while err is not None and not isinstance(err, opt_remat.BudgetError):
        err = err.__cause__ or getattr(err, "inner_exception", None)
    assert isinstance(err, opt_remat.BudgetError), info.value
    assert err.min_feasible_bytes > 1 and str(err.min_feasible_bytes) in str(err)
    _, rec = _step(model, inputs, solver, err.min_feasible_bytes)  # and that budget is feasible
    assert rec.plan.saved_bytes <= err.min_feasible_bytes


@pytest.mark.parametrize("name", ["gpt", "llama", "resnet"])
def test_default_solver_under_a_budget_is_near_the_exact_optimum(name):
    from opt_remat.models import resnet
    from opt_remat.solve import choose_plan

    torch.manual_seed(0)
    model = resnet() if name == "resnet" else _setup(name)[0]
    inputs = example_inputs(name, model)
    for fraction in (0.5, 0.2):
        torch._dynamo.reset()
        be = opt_remat.backend(budget=fraction, compiler="eager", decompositions="inductor")
        training_step(model, inputs, be, seed=5)
        rec = be.partitioner.history[-1]
        assert check_plan(rec.problem, rec.plan, budget=rec.budget_bytes).valid
        exact = choose_plan(rec.problem, "cpsat", rec.budget_bytes, {"time_limit_s": 30})
        assert exact.status.value == "optimal"
        assert rec.plan.recompute_cost <= 1.05 * exact.recompute_cost + 1e-15, (fraction, rec.plan.solver)
        if fraction != 0.5:  # one compile per model shows it
            continue
        # named, min-cut stays the pure min-cut search
        torch._dynamo.reset()
        be = opt_remat.backend("mincut", fraction, compiler="eager", decompositions="inductor")
        training_step(model, inputs, be, seed=5)
        assert be.partitioner.history[-1].plan.solver == "mincut"


def test_byte_columns_keep_one_unit():
    from solvers.budget import column_unit, format_bytes

    def column(values):
        unit = column_unit(values)
        return [format_bytes(v, unit) for v in values]

    assert format_bytes(1014 * 1024) == "1014.00 KiB" and format_bytes(1.01 * 2**20) == "1.01 MiB"
    assert column([1014 * 1024, 1.01 * 2**20, None, 0]) == ["0.99 MiB", "1.01 MiB", "-", "0 B"]
    assert column([12, 1000]) == ["12 B", "1000 B"] and format_bytes(3 * 2**30, "MiB") == "3072.00 MiB"
    # a count that would read 0.00 in the column's unit is shown in its own, never as zero
    assert column([1024, 2**30]) == ["1.00 KiB", "1.00 GiB"]


def test_one_rule_for_times_and_axes():
    from solvers.budget import byte_axis, column_time_unit, format_seconds, time_axis
    assert format_seconds(946e-9) == "946 ns" and format_seconds(946e-9, "us") == "0.946 us"
    assert format_seconds(0) == "0 s" and format_seconds(None) == "-" and format_seconds(float("nan")) == "-"
    assert column_time_unit([946e-9, 2e-6, None]) == "us" and time_axis([3e-3, 1e-5]) == ("ms", 1e-3)
    assert byte_axis([100, 3 * 2**20, None]) == ("MiB", 2.0**20) and byte_axis([]) == ("B", 1.0)
