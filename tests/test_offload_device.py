"""Offload under a device budget (``device_memory=`` with ``training=``): the one peak branch of the
road solves on the rank's problem and hands its plan to the offload choice on that same problem;
the plan offloads, fits the device by the offload-aware simulation of the rank's memory, and
trains with the gradients of the same plan without offload."""

import dataclasses
from unittest import mock

import pytest
import torch

import opt_remat
from opt_remat import road
from opt_remat.models import example_inputs, gpt2
from opt_remat.offload import offloaded_values
from opt_remat.verify import compare_steps, training_step
from solvers import check_plan
from solvers.liveness import simulate_plan
from solvers.offload import offload_errors, offloaded_curve
from solvers.rank_memory import with_rank_memory

pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py

DEVICE = {"name": "slow", "peak_flops": 1e9, "bandwidth": 1e9, "host_bandwidth": 1e9}
TRAINING = {"sharding": "fsdp", "ranks": 2, "optimizer": "adamw"}
OFFLOAD = {"min_bytes": 1}


def _step(model, inputs, pfn, seed=3):
    return training_step(model, inputs, opt_remat.backend(compiler="eager", partition_fn=pfn), seed=seed)


def _device_between(model, inputs) -> int:
    """Device memory between the rank's least peak and its peak saving everything the backward reads."""
    pfn = opt_remat.partitioner(device=DEVICE, training=TRAINING, offload=OFFLOAD)
    _step(model, inputs, pfn, seed=1)
    rec = pfn.history[-1]
    rank = with_rank_memory(rec.problem, pfn.request.rank_setup)
    top = simulate_plan(rank, [n for n in rank.backward_reads if rank.can_save(n)]).peak
    torch._dynamo.reset()
    return int(top * 0.97)


@pytest.mark.parametrize("solver", [None, "cpsat"])
def test_device_budget_with_offload_offloads_fits_and_trains_as_without(solver):
    torch.manual_seed(0)
    model = gpt2(layers=2, dropout=0.0)
    inputs = example_inputs("gpt", model, batch=2)
    device = _device_between(model, inputs)
    kw = {"device": DEVICE, "training": TRAINING, "device_memory": device, "solver": solver}
    if solver == "cpsat":
        kw["options"] = {"time_limit_s": 20}
    plain = opt_remat.Partitioner(**kw)
    _step(model, inputs, plain)
    torch._dynamo.reset()
    done: list[set[str]] = []

    class Lowered(opt_remat.Partitioner):
        def __call__(self, *args, **kwargs):
            fw, bw = super().__call__(*args, **kwargs)
            done.append(offloaded_values(fw))
            return fw, bw

    pfn = Lowered(**kw, offload=OFFLOAD)
    off = _step(model, inputs, pfn)
    rec = pfn.history[-1]
    link = road.offload_link(pfn.request)
    assert rec.plan.offloaded, "a tight device on a slow link: offload is chosen"
    assert done[-1] == set(rec.plan.offloaded)
    assert check_plan(rec.problem, rec.plan).valid and not offload_errors(rec.problem, rec.plan, link)
    rank = with_rank_memory(rec.problem, pfn.request.rank_setup)
    curve, _ = offloaded_curve(rank, rec.plan.saved, rec.plan.offloaded, link)
    assert curve.peak <= device  # the rank's whole memory, with the offloads
    if solver == "cpsat":
        assert "offload_program" in rec.plan.extra  # the program ran
    torch._dynamo.reset()
    fixed = dataclasses.replace(rec.plan, offloaded=frozenset())
    with mock.patch.object(road, "solve_problem", lambda *a, **k: fixed):
        same = opt_remat.Partitioner(**kw)
        ref = _step(model, inputs, same)
    assert same.history[-1].plan.saved == rec.plan.saved
    check = compare_steps(off, ref)
    assert check.ok and check.bitwise, check


def test_the_road_keeps_the_plan_of_less_added_time_of_the_chooser_and_the_program():
    from support.random_problems import random_problem

    from opt_remat.request import make_request
    from solvers.baselines import save_all
    from solvers.offload_plan import offload_cost

    ran = took = 0
    for seed in range(8):
        problem = random_problem(seed, n_forward=12, n_backward=9, view_prob=0.2)
        peak = int(simulate_plan(problem, save_all(problem).saved).peak * 0.8)
        request = make_request("cpsat", peak_budget=peak, options={"time_limit_s": 10}, device=DEVICE,
                               offload=OFFLOAD)
        try:
            plan = road.solve_problem(problem, request, None)
        except opt_remat.errors.PeakBudgetError:
            continue
        link = road.offload_link(request)
        cost = offload_cost(problem, plan.saved, plan.offloaded, link)
        assert cost.peak <= peak and cost.added_s == pytest.approx(plan.extra["offload"]["added_s"]), seed
        program = plan.extra["offload_program"]
        ran += 1
        if "greedy" in plan.extra:  # the program's plan, kept for adding less time than the chooser's
            took += 1
            greedy = plan.extra["greedy"]
            assert greedy is None or cost.added_s < greedy["added_s"], seed
        elif program.get("fitted"):
            assert cost.added_s <= program["added_s"], seed
    assert ran >= 4
