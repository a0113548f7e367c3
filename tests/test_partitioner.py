"""Real models through torch.compile: opt-remat's partitions give save-all's loss and gradients."""

import functools

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.compilers import nop
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import opt_remat
from opt_remat.models import example_inputs, gpt2, llama, mlp, resnet
from opt_remat.verify import compare_steps, measured_saved_bytes, save_all_backend, training_step
from solvers import check_plan

MODELS = {
    "mlp": functools.partial(mlp),
    "gpt-dropout": functools.partial(gpt2, dropout=0.2),
    "llama": functools.partial(llama),
    "resnet-bn": functools.partial(resnet),
}


def _model(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    return model, example_inputs(name, model)


pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


@pytest.mark.parametrize("decompositions", [None, "inductor"])
@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_match_save_all(name, decompositions):
    model, inputs = _model(name)
    be = opt_remat.backend("mincut", compiler="eager", decompositions=decompositions)
    ours = training_step(model, inputs, be, seed=1)
    ref = training_step(model, inputs, save_all_backend(decompositions), seed=1)
    check = compare_steps(ours, ref)
    assert check.ok and check.max_rel_error <= 1e-6, check
    assert check.bitwise  # same ops in the same order: bitwise equal
    record = be.partitioner.history[-1]
    assert check_plan(record.problem, record.plan).valid
    assert record.plan.recomputed, "the min-cut should recompute something on these models"
    # what the forward graph really hands to the backward is what the plan predicted
    assert measured_saved_bytes(record.fw_module, record.num_fwd_outputs) == record.plan.saved_bytes


def test_partition_record_prints_a_short_summary():
    from solvers.budget import format_bytes
    model, inputs = _model("llama")
    be = opt_remat.backend("mincut", 0.5, compiler="eager")
    training_step(model, inputs, be)
    rec = be.partitioner.history[-1]
    text = str(rec)
    assert text == repr(rec) and "\n" not in text and len(text) < 250
    assert (f"saves {len(rec.plan.saved)} values, {format_bytes(rec.plan.saved_bytes)}" in text
            and f"recomputes {len(rec.plan.recomputed)}" in text and "mincut" in text)
    # the full data is still there
    assert rec.plan.saved and rec.fw_module.graph is not None and len(rec.problem.nodes) > 50


def test_random_ops_are_never_recomputed_without_replay():
    model, inputs = _model("gpt-dropout")
    be = opt_remat.backend("mincut", compiler="eager", decompositions="inductor", lam=0.0, rng_replay=False)
    training_step(model, inputs, be)
    record = be.partitioner.history[-1]
    random_nodes = {n.name for n in record.problem.nodes if "rand" in n.op or "dropout" in n.op}
    assert random_nodes, "the GPT graph should contain random ops"
    assert not (random_nodes & record.plan.recomputed)
    bw_ops = {str(n.target) for n in record.bw_module.graph.nodes if n.op == "call_function"}
    assert not any("rand" in op or "bernoulli" in op for op in bw_ops)


def test_drop_in_partition_fn_for_aot_autograd():
    model, inputs = _model("llama")
    pfn = opt_remat.partitioner(solver="mincut")
    be = aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=pfn)
    check = compare_steps(training_step(model, inputs, be), training_step(model, inputs, save_all_backend()))
    assert check.bitwise and pfn.history


# inductor compiles GPT's kernels for a minute on 2 cores: CI runs it; dropout under inductor stays
# in the fast set through tests/test_rng_replay.py
@pytest.mark.parametrize("name", [pytest.param("gpt-dropout", marks=pytest.mark.slow), "mlp"])
def test_inductor_backend_matches_save_all(name):
    model, inputs = _model(name)
    from torch._inductor import config as inductor_config
    with inductor_config.patch(fallback_random=True):
        be = opt_remat.backend("mincut")  # inductor by default
        ours = training_step(model, inputs, be, seed=3)
        torch._dynamo.reset()
        ref = training_step(model, inputs, opt_remat.backend(partition_fn=_default_partition()), seed=3)
    check = compare_steps(ours, ref)
    assert check.ok and check.max_rel_error <= 1e-5, check
    assert be.partitioner.history


def _default_partition():
    """A partitioner-shaped wrapper around torch's save-all, to run it under inductor too."""
    from torch._functorch.partitioners import default_partition

    class SaveAll(opt_remat.Partitioner):
        def __call__(self, gm, joint_inputs, *args, **kw):
            return default_partition(gm, joint_inputs, **kw)
    return SaveAll()


def test_selective_checkpoint_tags_are_respected():
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def policy(ctx, op, *args, **kwargs):
        if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.MUST_RECOMPUTE

    class Tagged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = lin1, lin2

        def forward(self, x):
            def body(x):
                return self.lin2(torch.sin(self.lin1(x)).cos())
            return checkpoint(body, x, use_reentrant=False,
                              context_fn=functools.partial(create_selective_checkpoint_contexts, policy))

    model, x = Tagged(), torch.randn(8, 32, requires_grad=True)
    be = opt_remat.backend("mincut", compiler="eager", lam=1e30)  # recompute cost dominates: save all it may
    check = compare_steps(training_step(model, (x,), be), training_step(model, (x,), save_all_backend()))
    assert check.max_rel_error <= 1e-6
    rec = be.partitioner.history[-1]
    tagged_recompute = {n.name for n in rec.problem.nodes if n.must_recompute}
    tagged_save = {n.name for n in rec.problem.nodes if n.banned and "mm" in n.op}
    assert tagged_recompute and tagged_save
    assert not (tagged_recompute & rec.plan.saved)
    assert not (tagged_save & rec.plan.recomputed)


def _joint_graph_of(f, *inputs):
    """The joint graph AOTAutograd hands to a partitioner, and its num_fwd_outputs."""
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import default_partition
    seen = {}

    def catch(joint, joint_inputs, **kw):
        seen["joint"], seen["num_fwd_outputs"] = joint, kw["num_fwd_outputs"]
        return default_partition(joint, joint_inputs, **kw)
    aot_function(f, fw_compiler=nop, bw_compiler=nop, partition_fn=catch)(*inputs).sum().backward()
    return seen["joint"], seen["num_fwd_outputs"]


def test_node_without_metadata_is_named_in_the_error():
    joint, nfo = _joint_graph_of(lambda x: torch.sin(x).cos(), torch.randn(4, requires_grad=True))
    victim = next(n for n in joint.graph.nodes if n.op == "call_function")
    del victim.meta["val"]
    with pytest.raises(opt_remat.GraphError, match=victim.name):
        opt_remat.build_problem(joint, num_fwd_outputs=nfo)


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="unknown solver"):
        opt_remat.partitioner(solver="gurobi")
    with pytest.raises(ValueError, match="parse budget"):
        opt_remat.partitioner(budget="lots")
    with pytest.raises(ValueError, match="device profile"):
        opt_remat.partitioner(device="tpu9000")
    with pytest.raises(ValueError, match="compiler"):
        opt_remat.backend(compiler="tvm")
    # refused when made, not as torch's BackendCompilerFailed on the first call
    with pytest.raises(ValueError, match="'greedy' has no peak-budget mode.*'cpsat'"):
        opt_remat.backend("greedy", peak_budget="1MiB")


def test_misspelled_solver_option_fails_when_made():
    with pytest.raises(ValueError, match="unknown option 'time_limt_s' for solver 'cpsat'.*time_limit_s"):
        opt_remat.partitioner("cpsat", time_limt_s=3)
    with pytest.raises(ValueError, match="unknown option 'lam'.*cpsat"):
        opt_remat.backend("cpsat", lam=0.5)
    with pytest.raises(ValueError, match="threads=-1.*>= 0"):
        opt_remat.backend("cpsat", compiler="eager", threads=-1)
    with pytest.raises(ValueError, match="expected one of \\['cbc', 'highs'\\]"):
        opt_remat.partitioner("milp", backend="gurobi")
    opt_remat.partitioner("cpsat", peak_budget="1MiB", gap=0.02)  # the peak search's own options
    opt_remat.partitioner("mincut", lam="auto")
    with pytest.raises(ValueError, match="unknown option 'time_limt_s' for the default path.*time_limit_s"):
        opt_remat.partitioner(budget=0.5, time_limt_s=3)
    opt_remat.partitioner(budget=0.5, time_limit_s=2, backend="networkx")  # cpsat's and mincut's
    # an option the solver takes, but not under the budget given, is refused, never dropped
    with pytest.raises(ValueError, match="'lam' is not taken by the default path.*saved-bytes.*backend"):
        opt_remat.partitioner(budget=0.5, lam=0.1)
    with pytest.raises(ValueError, match="'symmetry' of solver 'cpsat' does not apply under a peak budget; "
                                         "there it takes: time_limit_s, threads, seed, gap"):
        opt_remat.partitioner("cpsat", peak_budget="1MiB", symmetry="warm")
    with pytest.raises(ValueError, match="'gap' of solver 'cpsat' does not apply under a saved-bytes budget"):
        opt_remat.partitioner("cpsat", budget=0.5, gap=0.01)


def _dropout_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 8)), torch.randn(4, 8)


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_budget_error_is_caught_around_the_compiled_call(compiler):
    model, x = _dropout_mlp()
    compiled = torch.compile(model, backend=opt_remat.backend("mincut", 16, compiler=compiler,
                                                              count_input_bytes=True))
    with pytest.raises(opt_remat.BudgetError) as info:
        compiled(x).sum().backward()
    err = info.value
    assert err.budget == 16 and err.min_feasible_bytes > 16
    assert str(err).startswith("budget 16 B") and "TORCHDYNAMO" not in str(err)


def test_unwrap_finds_the_budget_error_inside_torchs_wrapping():
    model, x = _dropout_mlp()
    pfn = opt_remat.partitioner("mincut", 16, count_input_bytes=True)
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=pfn))
    with pytest.raises(Exception) as info:  # a user's own backend: torch wraps the error
        compiled(x).sum().backward()
    assert not isinstance(info.value, opt_remat.BudgetError)
    assert isinstance(opt_remat.unwrap(info.value), opt_remat.BudgetError)
    other = RuntimeError("not ours")
    assert opt_remat.unwrap(other) is other
