"""Offload lowered by torch's own pass: plans with offloads train with the gradients of the same plan
without; the lowered forward offloads exactly the planned values; torch's contract (``should_offload``
marks, MUST_CPU_OFFLOAD / PREFER_CPU_OFFLOAD policies, ``partitioner(offload=True)``)."""

import dataclasses
import functools
from unittest import mock

import pytest
import torch
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp
from torch._inductor import config as inductor_config
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import opt_remat
from opt_remat import road
from opt_remat.build import build_problem, problem_from_joint
from opt_remat.capture import capture
from opt_remat.models import example_inputs, gpt2
from opt_remat.offload import host_link, offload_ops, offloaded_values
from opt_remat.verify import compare_steps, training_step
from solvers import Status, check_plan, plan_from_saved
from solvers.liveness import simulate_plan
from solvers.offload import offload_candidates, offload_errors, offloaded_curve

pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _mlp():
    torch.manual_seed(0)
    return _MLP(), (torch.randn(5, 8),)


@functools.cache
def _gpt():
    torch.manual_seed(0)
    model = gpt2(layers=2, dropout=0.2)
    return model, example_inputs("gpt", model, batch=2)


class _Recording(opt_remat.Partitioner):
    """Records the offload ops of each lowered pair as it is made (inductor edits its graphs later:
    on a CPU it drops the forward's copy to the same device as a no-op)."""

    def __post_init__(self):
        super().__post_init__()
        self.ops: list[tuple[list[str], list[str], set[str]]] = []

    def __call__(self, *args, **kw):
        fw, bw = super().__call__(*args, **kw)
        self.ops.append((offload_ops(fw), offload_ops(bw), offloaded_values(fw)))
        return fw, bw


class _OffloadAll(_Recording):
    """The default plan, with every saved value that can be offloaded offloaded (the solve on the
    road wrapped: the lowering of such a plan is what is tested)."""

    def __call__(self, *args, **kw):
        solve = road.solve_problem

        def offload_all(problem, *a, **k):
            plan = solve(problem, *a, **k)
            chosen = {v for v in plan.saved if not problem.by_name[v].offload_ban and problem.by_name[v].bytes > 0}
            plan = dataclasses.replace(plan, offloaded=frozenset(chosen))
            chosen -= {v for e in offload_errors(problem, plan) for v in chosen if repr(v) in e}
            return dataclasses.replace(plan, offloaded=frozenset(chosen))

        with mock.patch.object(road, "solve_problem", offload_all):
            return super().__call__(*args, **kw)

    def uuid(self):  # another plan than the plain partitioner's: not its cache entries
        return "offload-all-" + super().uuid()


def _pair(make, compiler, budget=None):
    model, inputs = make()
    cm = inductor_config.patch(fallback_random=True) if compiler == "inductor" else functorch_config.patch({})
    with cm:
        plain = opt_remat.backend("mincut", budget, compiler=compiler, decompositions="inductor")
        ref = training_step(model, inputs, plain, seed=3)
        torch._dynamo.reset()
        pfn = _OffloadAll(solver="mincut", budget=budget)
        off = training_step(model, inputs, opt_remat.backend(compiler=compiler, decompositions="inductor",
                                                           partition_fn=pfn), seed=3)
    return ref, off, plain.partitioner.history, pfn


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_mlp_offloaded_plan_trains_as_without(compiler):
    ref, off, plain, pfn = _pair(_mlp, compiler, budget=1.0)
    rec = pfn.history[-1]
    assert rec.plan.offloaded, "the MLP saves its relu: something to offload"
    assert {p.saved for p in (plain[-1].plan,)} == {rec.plan.saved}  # the same plan, but offloads
    fw_ops, bw_ops, done = pfn.ops[-1]
    assert done == set(rec.plan.offloaded)
    assert sorted(fw_ops) == sorted(f"cpu_offload_{v}" for v in rec.plan.offloaded)
    assert sorted(bw_ops) == sorted(f"gpu_reload_{v}" for v in rec.plan.offloaded)
    check = compare_steps(off, ref)
    assert check.ok and check.bitwise, check


@pytest.mark.parametrize("compiler", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_gpt_with_dropout_offloaded_plan_trains_as_without(compiler):
    ref, off, plain, pfn = _pair(_gpt, compiler, budget=0.5)
    rec = pfn.history[-1]
    assert len(rec.plan.offloaded) >= 4
    assert rec.plan.saved == plain[-1].plan.saved
    assert check_plan(rec.problem, rec.plan).valid
    fw_ops, _, done = pfn.ops[-1]
    assert done == set(rec.plan.offloaded) and len(fw_ops) == len(done)
    check = compare_steps(off, ref)
    assert check.ok and (check.bitwise if compiler == "eager" else check.max_rel_error <= 1e-6), check


def _marked_partition(inner, ops=(torch.ops.aten.relu.default,)):
    """A partition_fn that marks the joint graph's ``ops`` ``should_offload`` (as a graph pass
    would) before ``inner`` partitions it."""
    def partition(joint, inputs, **kw):
        for n in joint.graph.nodes:
            if n.target in ops:
                n.meta["should_offload"] = True
        return inner(joint, inputs, **kw)
    return partition


def _aot(partition_fn, seen, decompositions=None):
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    def fw(gm, example):
        seen.append(offload_ops(gm))
        return boxed_nop(gm, example)
    return aot_autograd(fw_compiler=fw, bw_compiler=boxed_nop, partition_fn=partition_fn,
                        decompositions=decompositions or {})


def test_should_offload_marks_offload_what_torch_offloads():
    model, inputs = _mlp()
    ref = training_step(model, inputs, "aot_eager", seed=1)
    results = {}
    for name, inner in (("torch", tp.min_cut_rematerialization_partition), ("opt-remat", opt_remat.partitioner())):
        seen: list = []
        with functorch_config.patch(enable_activation_offloading=True):
            torch._dynamo.reset()
            step = training_step(model, inputs, _aot(_marked_partition(inner), seen), seed=1)
        assert compare_steps(step, ref).bitwise, name
        results[name] = seen[-1]
    assert results["opt-remat"] == results["torch"] == ["cpu_offload_relu"]
    # without torch's flag the marks ask for nothing, as with torch's partitioner
    seen = []
    torch._dynamo.reset()
    training_step(model, inputs, _aot(_marked_partition(opt_remat.partitioner()), seen), seed=1)
    assert seen[-1] == []


def test_should_offload_marks_on_gpt_matmuls():
    """Marks on every matmul of GPT with dropout: opt-remat offloads each marked value its plan
    saves, the rule torch's partitioner applies to its own plan; the plans differ (torch saves
    views of some marked values, which its pass then refuses; opt-remat never recomputes a marked
    value), and what both save, both offload."""
    from torch._inductor.decomposition import select_decomp_table
    model, inputs = _gpt()
    mms = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
    got = {}
    for name, inner in (("torch", tp.min_cut_rematerialization_partition), ("opt-remat", _Recording())):
        seen: list = []
        with functorch_config.patch(enable_activation_offloading=True):
            torch._dynamo.reset()
            step = training_step(model, inputs, _aot(_marked_partition(inner, mms), seen, select_decomp_table()),
                                 seed=1)
        got[name] = (set(seen[-1]), step)
    assert compare_steps(got["torch"][1], got["opt-remat"][1]).bitwise
    rec = inner.history[-1]
    assert got["opt-remat"][0] == {f"cpu_offload_{v}" for v in rec.plan.offloaded}
    both = {o for o in got["torch"][0] if o.removeprefix("cpu_offload_") in rec.plan.saved}
    assert both and both <= got["opt-remat"][0]
    assert {n.name for n in rec.problem.nodes if n.op.startswith(("aten.mm", "aten.addmm", "aten.bmm"))
            and n.role.value == "forward"} & rec.plan.saved == rec.plan.offloaded


def _sac(model, tag):
    def policy(ctx, op, *args, **kw):
        return tag if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False,
                              context_fn=functools.partial(create_selective_checkpoint_contexts, policy))
    return Wrapped()


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_must_cpu_offload_policy_offloads_the_mm_outputs(compiler):
    model, inputs = _mlp()
    wrapped = _sac(model, CheckpointPolicy.MUST_CPU_OFFLOAD)
    ref = training_step(wrapped, inputs, "eager", seed=1)
    pfn = _Recording()
    step = training_step(wrapped, inputs, opt_remat.backend(compiler=compiler, partition_fn=pfn), seed=1)
    rec = pfn.history[-1]
    mms = {n.name for n in rec.problem.nodes if n.op == "aten.mm.default" and n.role.value == "forward"}
    # the first layer's output: relu (PREFER_RECOMPUTE) is recomputed from it; the second's is unused
    assert rec.plan.offloaded == mms & rec.plan.saved == {"mm"}
    assert pfn.ops[-1][2] == set(rec.plan.offloaded)
    check = compare_steps(step, ref)
    assert check.ok and check.max_rel_error <= 1e-6, check


def test_prefer_cpu_offload_is_never_recomputed_and_offloaded_with_offload_true():
    model, inputs = _mlp()
    wrapped = _sac(model, CheckpointPolicy.PREFER_CPU_OFFLOAD)
    ref = training_step(wrapped, inputs, "eager", seed=1)
    got = {}
    for offload in (False, True):
        torch._dynamo.reset()
        pfn = _Recording(solver="mincut", budget=0.0, offload=offload)  # the least bytes: recompute all it may
        step = training_step(wrapped, inputs, opt_remat.backend(compiler="eager", partition_fn=pfn), seed=1)
        assert compare_steps(step, ref).max_rel_error <= 1e-6
        rec = pfn.history[-1]
        mms = {n.name for n in rec.problem.nodes if n.op == "aten.mm.default" and n.role.value == "forward"}
        assert not mms & rec.plan.recomputed
        got[offload] = (rec.plan.offloaded, pfn.ops[-1][2], mms & rec.plan.saved)
    assert got[False][0] == got[False][1] == frozenset()
    assert got[True][0] == got[True][1] == got[True][2] and got[True][0]


def test_offload_bans_follow_torchs_pass():
    model, inputs = _gpt()
    pfn = opt_remat.partitioner()
    training_step(model, inputs, opt_remat.backend(compiler="eager", partition_fn=pfn), seed=1)
    problem = pfn.history[-1].problem
    bans = {n.name: n.offload_ban for n in problem.nodes}
    assert all(bans[n.name].startswith(("a graph input", "computed in the backward"))
               for n in problem.nodes if n.role.value in ("input", "backward"))
    views = [n for n in problem.nodes if n.role.value == "forward" and n.storage is not None]
    assert views and all(bans[n.name] for n in views)
    assert all(bans[o] for o in problem.forward_outputs)
    assert any(n.role.value == "forward" and not bans[n.name] for n in problem.nodes)


def test_partitioner_accepts_offload():
    assert opt_remat.partitioner(offload=True).offload is True
    assert opt_remat.partitioner().uuid() != opt_remat.partitioner(offload=True).uuid()


def test_backward_times_on_request_and_the_model_on_a_real_plan():
    model, inputs = _gpt()
    joint = capture(lambda: model, inputs)
    prepared, problem = problem_from_joint(joint)
    backward = [n for n in problem.nodes if n.role.value == "backward" and n.op.startswith("aten.mm")]
    assert backward and all(n.cost == 0.0 for n in backward)  # off by default: the build stays as fast
    timed = build_problem(prepared.module, num_fwd_outputs=prepared.num_fwd_outputs, backward_costs=True)
    assert all(timed.by_name[n.name].cost > 0 for n in backward)
    saved = {n.name for n in timed.candidates if timed.can_save(n.name)} & timed.backward_reads
    plan = plan_from_saved(timed, saved, solver="test", status=Status.HEURISTIC)
    link = host_link("h100", min_bytes=1)
    chosen = set(offload_candidates(timed, link)) & plan.saved
    assert chosen
    curve, tl = offloaded_curve(timed, plan.saved, chosen, link)
    assert curve.peak <= simulate_plan(timed, plan.saved).peak
    assert tl.host_bytes == sum(timed.storage_size[v] for v in chosen) and tl.exposed_s >= 0


def _hf_llama():
    transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      max_position_embeddings=64, num_attention_heads=4, num_key_value_heads=4)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = transformers.LlamaForCausalLM(config)

        def forward(self, idx):
            return self.model(input_ids=idx, labels=idx).loss

    torch.manual_seed(0)
    return Step(), (torch.randint(0, 128, (2, 32)),)


@pytest.mark.hf
@pytest.mark.parametrize("compiler", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_hf_llama_offloaded_plan_trains_as_without(compiler):
    ref, off, plain, pfn = _pair(_hf_llama, compiler, budget=0.5)
    rec = pfn.history[-1]
    assert len(rec.plan.offloaded) >= 4 and rec.plan.saved == plain[-1].plan.saved
    assert pfn.ops[-1][2] == set(rec.plan.offloaded)
    check = compare_steps(off, ref)
    assert check.ok and (check.bitwise if compiler == "eager" else check.max_rel_error <= 1e-6), check


def test_the_separate_stream_path_per_torchs_config():
    """With ``activation_offload_separate_stream`` and sink-wait, torch's pass inserts the async ops
    for exactly the planned values, the offload waits just before the forward's output (graphs
    only: the async ops need an accelerator to run; prefetch times ops on one)."""
    model, inputs = _gpt()
    joint = capture(lambda: model, inputs)
    pfn = _OffloadAll(solver="mincut", budget=1.0)
    with functorch_config.patch(activation_offload_separate_stream=True, activation_offload_sink_wait=True):
        fw, bw = pfn(joint.copy().module, None, num_fwd_outputs=joint.num_fwd_outputs)
    planned = pfn.history[-1].plan.offloaded
    assert planned and offloaded_values(fw) == set(planned)
    calls = [n for n in fw.graph.nodes if n.op == "call_function"]
    offloads = {n.args[0].name for n in calls if n.target is torch.ops.ao.offload.default}
    waits = [n for n in calls if n.target is torch.ops.ao.wait_tensor.default]
    assert offloads == set(planned) and len(waits) == len(planned)
    assert calls[-len(waits):] == waits  # sunk to the end of the forward
    reloads = [n for n in bw.graph.nodes if n.target is torch.ops.ao.reload.default]
    assert {n.args[0].name.removeprefix("cpu_offload_") for n in reloads} == set(planned)
