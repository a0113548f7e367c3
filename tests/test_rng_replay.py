"""Random ops recomputed by replaying their RNG state: gradients equal save-all's bit for bit, the
state is counted at its real size, the solver weighs it against the mask, the floor goes down."""

import functools

import pytest
import torch
from torch._inductor import config as inductor_config

import opt_remat
from opt_remat.build import problem_from_joint
from opt_remat.capture import capture
from opt_remat.models import example_inputs, gpt2
from opt_remat.verify import compare_steps, measured_saved_bytes, save_all_backend, training_step
from solvers import Plan, Status, check_plan
from solvers.mincut import solve_mincut
from solvers.peak.candidates import frontier_plans


pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


@functools.lru_cache(maxsize=None)
def _gpt(layers=2):
    torch.manual_seed(0)
    model = gpt2(layers=layers, dropout=0.2)
    return model, example_inputs("gpt", model, batch=4)  # masks larger than a CPU generator state


def _draws(rec):
    return {n.name for n in rec.problem.nodes
            if n.role.value == "forward" and ("rand" in n.op or "dropout" in n.op or "bernoulli" in n.op)}


def _step(model, inputs, budget, decompositions="inductor", **kw):
    torch._dynamo.reset()
    be = opt_remat.backend("mincut", budget, compiler="eager", decompositions=decompositions, **kw)
    return training_step(model, inputs, be, seed=5), be.partitioner.history[-1]


@pytest.mark.parametrize("decompositions", ["inductor", None])  # rand + gt, or native_dropout
def test_replayed_dropout_gives_save_all_gradients_bitwise(decompositions):
    model, inputs = _gpt()
    ref = training_step(model, inputs, save_all_backend(decompositions), seed=5)
    for budget in (1.0, 0.5, 0.0) if decompositions else (0.0,):
        step, rec = _step(model, inputs, budget, decompositions)
        assert compare_steps(step, ref).bitwise, budget
        assert check_plan(rec.problem, rec.plan, budget=rec.budget_bytes).valid
        assert measured_saved_bytes(rec.fw_module, rec.num_fwd_outputs) == rec.plan.saved_bytes
    replayed = _draws(rec) & rec.plan.recomputed
    assert replayed, "at the smallest budget dropout should be recomputed"
    assert {f"rng_state_{r}" for r in replayed} <= rec.plan.saved
    hops = [str(n.target) for n in rec.bw_module.graph.nodes if n.op == "call_function"]
    assert sum("run_with_rng_state" in t for t in hops) == len(replayed)
    # today's floor (random ops never recomputed) is above replay's
    _, old = _step(model, inputs, 0.0, decompositions, rng_replay=False)
    assert not (_draws(old) & old.plan.recomputed)
    assert rec.plan.saved_bytes < old.plan.saved_bytes


class _DropMLP(torch.nn.Module):
    """Dropout between two layers: the few kernels inductor needs to compile for a replay."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 8)

    def forward(self, x):  # a 32 KiB dropout draw, above a 5 KiB CPU generator state
        return self.down(torch.nn.functional.dropout(torch.nn.functional.gelu(self.up(x)), 0.2))


def _drop_mlp():
    torch.manual_seed(0)
    return _DropMLP(), (torch.randn(32, 64),)


# GPT's kernels take inductor a minute to compile on 2 cores: CI runs it, the fast set the small model
@pytest.mark.parametrize("make", [_drop_mlp, pytest.param(lambda: _gpt(layers=1), marks=pytest.mark.slow,
                                                          id="gpt")])
def test_replay_under_inductor_matches_save_all(make):
    model, inputs = make()
    # inductor's own RNG draws other numbers than aten's; with fallback_random both draw aten's
    with inductor_config.patch(fallback_random=True):
        ref = training_step(model, inputs, opt_remat.backend(partition_fn=_SaveAll()), seed=5)
        torch._dynamo.reset()
        be = opt_remat.backend("mincut", 0.0)
        step = training_step(model, inputs, be, seed=5)
    rec = be.partitioner.history[-1]
    assert _draws(rec) & rec.plan.recomputed
    check = compare_steps(step, ref)
    assert check.ok and check.max_rel_error <= 1e-6, check


class _SaveAll(opt_remat.Partitioner):
    def __call__(self, gm, joint_inputs, *args, **kw):
        from torch._functorch.partitioners import default_partition
        return default_partition(gm, joint_inputs, **kw)


def _problems():
    model, inputs = _gpt()
    joint = capture(model, inputs, decompositions="inductor")
    return problem_from_joint(joint, rng_replay=True), problem_from_joint(joint, rng_replay=False)


def test_replay_lowers_smallest_saved_bytes_and_peak_and_holds_a_peak_budget():
    (prepared, replay), (_, plain) = _problems()
    states = [n for n in replay.nodes if n.op == "rng_state"]
    assert states and all(n.bytes == torch.get_rng_state().numel() and n.banned for n in states)
    assert solve_mincut(replay, 0.0).saved_bytes < solve_mincut(plain, 0.0).saved_bytes

    def min_peak(problem):  # the smallest simulated peak of the cheap plans (min-cut, checkpointing)
        return min(peak for _, peak in frontier_plans(problem))
    lowest = min_peak(replay)
    assert lowest < min_peak(plain)
    # that peak, asked of the partitioner: the plan replays dropout and gradients stay exact
    model, inputs = _gpt()
    ref = training_step(model, inputs, save_all_backend("inductor"), seed=5)
    step, rec = _step(model, inputs, None, peak_budget=lowest)
    assert rec.plan.extra["peak"] <= lowest and _draws(rec) & rec.plan.recomputed
    assert compare_steps(step, ref).bitwise


class _TwoDropouts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.big, self.small = torch.nn.Linear(256, 256), torch.nn.Linear(8, 8)

    def forward(self, x, y):  # dropout masks of 8 KiB (above a 5 KiB CPU generator state) and 32 bytes
        drop = torch.nn.functional.dropout
        return self.big(drop(x, 0.5)).sum() + self.small(drop(y, 0.5)).sum()


def test_solver_weighs_the_state_against_the_mask():
    joint = capture(_TwoDropouts(), [torch.randn(32, 256), torch.randn(4, 8)], decompositions="inductor")
    _, problem = problem_from_joint(joint)
    plan = solve_mincut(problem, 0.0)  # fewest saved bytes
    draws = sorted((n for n in problem.nodes if n.op == "aten.rand.default"), key=lambda n: -n.bytes)
    assert len(draws) == 2
    assert draws[0].name in plan.recomputed and f"rng_state_{draws[0].name}" in plan.saved
    assert draws[1].name not in plan.recomputed and f"rng_state_{draws[1].name}" not in plan.saved


def test_a_replay_without_its_state_is_an_invalid_plan():
    (_, problem), _ = _problems()
    plan = solve_mincut(problem, 0.0)
    replayed = next(r for r in plan.recomputed if problem.by_name[r].op == "aten.rand.default")
    broken = Plan(saved=plan.saved - {f"rng_state_{replayed}"}, recomputed=plan.recomputed,
                  saved_bytes=plan.saved_bytes, recompute_cost=plan.recompute_cost, solver="test",
                  status=Status.HEURISTIC)
    errors = check_plan(problem, broken).errors
    assert any(f"rng_state_{replayed}" in e and "neither saved nor recomputed" in e for e in errors), errors
