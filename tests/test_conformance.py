"""opt-remat against torch's partitioner contract (what a drop-in for
``min_cut_rematerialization_partition`` must accept and honour).

Every case compiles a tiny function with opt-remat (min-cut and CP-SAT) and compares its values
and gradients with eager. Where torch's behaviour is the contract (which tags bind, what errors a
region budget raises) it is asserted against torch itself; where opt-remat chooses differently on
purpose, a comment says so.
"""

import contextlib
import functools
import warnings

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch import partitioners as tp
from torch._functorch.aot_autograd import aot_function
from torch._functorch.compilers import nop
from torch._inductor.fx_utils import get_node_storage
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import opt_remat
from opt_remat.verify import measured_saved_bytes
from solvers import check_plan

SOLVERS = ["mincut", "cpsat"]
CPSAT = {"time_limit_s": 10, "threads": 1}


pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


def _backend(solver, **kw):
    return opt_remat.backend(solver, compiler="eager", **({**CPSAT, **kw} if solver == "cpsat" else kw))


def _clone(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args]


def _run(fn, args, compiled=None, seed=0):
    """Outputs and gradients (of tensor args and module parameters) of one step of ``fn``."""
    args = _clone(args)
    module = fn if isinstance(fn, torch.nn.Module) else None
    torch.manual_seed(seed)
    out = (compiled if compiled is not None else fn)(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad).backward()
    grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if module is not None:
        grads += [p.grad for p in module.parameters()]
    return [o.detach() for o in outs if isinstance(o, torch.Tensor)], grads, args


def check_against_eager(fn, args, solver, *, dynamic=None, eager=None, **kw):
    """Compile ``fn`` with opt-remat, compare values and gradients with eager (``fn``, or
    ``eager`` where ``fn`` only runs compiled); returns the partitioner."""
    be = _backend(solver, **kw)
    ref_fn = eager if eager is not None else fn
    if isinstance(fn, torch.nn.Module):
        import copy
        ref_fn, fn = fn, copy.deepcopy(fn)
    out_e, grads_e, _ = _run(ref_fn, args)
    out_c, grads_c, _ = _run(fn, args, compiled=torch.compile(fn, backend=be, dynamic=dynamic))
    for a, b in zip(out_e + grads_e, out_c + grads_c, strict=True):
        torch.testing.assert_close(b, a)
    for rec in be.partitioner.history:
        assert check_plan(rec.problem, rec.plan).valid
        assert measured_saved_bytes(rec.fw_module, rec.num_fwd_outputs) == rec.plan.saved_bytes
    return be.partitioner


def _ops(gm, op):
    return sum(1 for n in gm.graph.nodes if n.target is op)


# ---- graphs torch accepts ------------------------------------------------------------------------

@pytest.mark.parametrize("solver", SOLVERS)
def test_views_and_mutations(solver):
    def fn(x, w, buf):
        buf.add_(1.0)  # an input mutation, kept in the graph's epilogue
        y = (x.t() @ w).relu()
        z = y.view(-1)[::2].unsqueeze(0)  # views of an activation share its storage
        # buf * 1: the mutated buffer is compared with eager's too
        return z.sin() * buf.sum(), y.transpose(0, 1).contiguous().cos(), buf * 1

    x, w = torch.randn(6, 4, requires_grad=True), torch.randn(6, 5, requires_grad=True)
    check_against_eager(fn, [x, w, torch.zeros(3)], solver)


@pytest.mark.parametrize("solver", SOLVERS)
def test_none_and_int_inputs(solver):
    # torch's partitioner accepts non-tensor placeholders (no meta['val']); this crashed before
    def fn(x, n, nothing, y):
        assert nothing is None
        return (x.sin() * n + y.cos()).tanh()

    pfn = opt_remat.partitioner(solver, **(CPSAT if solver == "cpsat" else {}))
    compiled = aot_function(fn, fw_compiler=nop, bw_compiler=nop, partition_fn=pfn)
    x, y = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    out_e, grads_e, _ = _run(lambda x, y: fn(x, 3, None, y), [x, y])
    out_c, grads_c, _ = _run(lambda x, y: compiled(x, 3, None, y), [x, y])
    torch.testing.assert_close(out_c + grads_c, out_e + grads_e)
    assert pfn.history


@pytest.mark.parametrize("solver", SOLVERS)
def test_dynamic_shapes_and_symint_inputs(solver):
    def fn(x, w):
        n = x.shape[0]  # a SymInt under dynamic shapes, used in the backward too
        return ((x @ w).relu() * n).sum(0) / n

    w = torch.randn(4, 4, requires_grad=True)
    be = _backend(solver)
    compiled = torch.compile(fn, backend=be, dynamic=True)
    for rows in (3, 7):  # one graph serves both sizes
        x = torch.randn(rows, 4, requires_grad=True)
        out_e, grads_e, _ = _run(fn, [x, w])
        out_c, grads_c, _ = _run(fn, [x, w], compiled=compiled)
        torch.testing.assert_close(out_c + grads_c, out_e + grads_e)
    assert len(be.partitioner.history) == 1
    assert any(isinstance(n.meta.get("val"), torch.SymInt)
               for n in be.partitioner.history[0].fw_module.graph.nodes)


@pytest.mark.parametrize("solver", SOLVERS)
def test_tensor_subclass_inputs(solver):
    from torch.testing._internal.two_tensor import TwoTensor

    def fn(x, y):
        return torch.sigmoid(torch.matmul(torch.matmul(x, y), y)) * y

    a = torch.randn(4, 4)
    x = TwoTensor(a, a.clone()).requires_grad_()
    y = TwoTensor(a.clone() + 1, a.clone() + 1).requires_grad_()
    check_against_eager(fn, [x, y], solver)


@pytest.mark.parametrize("solver", SOLVERS)
def test_effect_tokens(solver):
    def fn(x):
        torch.ops.aten._print("opt-remat effect token")  # an ordered effect: threaded as a token
        return x.sin().cos() * 2

    check_against_eager(fn, [torch.randn(8, requires_grad=True)], solver)


@pytest.mark.parametrize("solver", SOLVERS)
def test_graph_breaks(solver):
    def fn(x, w):
        y = torch.tanh(x @ w)
        torch._dynamo.graph_break()
        return (y @ w).sigmoid()

    pfn = check_against_eager(fn, [torch.randn(3, 6, requires_grad=True),
                                   torch.randn(6, 6, requires_grad=True)], solver)
    assert len(pfn.history) == 2  # each graph is partitioned on its own


# ---- activation checkpointing and random ops -----------------------------------------------------

class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        h = torch.nn.functional.dropout(torch.relu(self.lin1(x)), 0.3, training=True)
        return self.lin2(h) * torch.rand_like(x)


class _Checkpointed(torch.nn.Module):
    def __init__(self, use_reentrant=False, context_fn=None):
        super().__init__()
        self.block, self.use_reentrant, self.context_fn = _Block(), use_reentrant, context_fn

    def forward(self, x):
        kw = {"context_fn": self.context_fn} if self.context_fn else {}
        return checkpoint(self.block, x.sin(), use_reentrant=self.use_reentrant, **kw).cos()


def _random_draws(rec):
    """The forward's random ops (not their backward ops, nor their RNG states)."""
    return {n for n in _random_nodes(rec)
            if rec.problem.by_name[n].role.value == "forward" and rec.problem.by_name[n].op != "rng_state"}


def _random_nodes(rec):
    return {n.name for n in rec.problem.nodes if "rand" in n.op or "dropout" in n.op or "bernoulli" in n.op}


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_region_with_dropout(solver, use_reentrant):
    torch.manual_seed(0)
    model = _Checkpointed(use_reentrant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pfn = check_against_eager(model, [torch.randn(8, 16, requires_grad=True)], solver)
    rec = pfn.history[-1]
    # as torch does, the region's random ops are recomputed by replaying their RNG state: the tags
    # bind, the states are saved, and the gradients are eager's (checked above)
    random = _random_draws(rec)
    assert random and random <= rec.plan.recomputed
    assert {f"rng_state_{r}" for r in random} <= rec.plan.saved
    assert not [w for w in caught if "tagged to be recomputed" in str(w.message)]


@pytest.mark.parametrize("solver", SOLVERS)
def test_checkpoint_region_with_dropout_without_replay(solver):
    torch.manual_seed(0)
    model = _Checkpointed(False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pfn = check_against_eager(model, [torch.randn(8, 16, requires_grad=True)], solver, rng_replay=False)
    rec = pfn.history[-1]
    # rng_replay=False never recomputes random ops: the conflict with the checkpoint's tags
    # resolves to saving dropout's outputs, said once, naming the op
    assert _random_nodes(rec) and not (_random_nodes(rec) & rec.plan.recomputed)
    notes = [str(w.message) for w in caught if "tagged to be recomputed" in str(w.message)]
    assert len([n for n in notes if "native_dropout " in n]) == 1, notes
    # the rest of the region is still recomputed, as the checkpoint asks
    assert any("addmm" in rec.problem.by_name[r].op or "relu" in rec.problem.by_name[r].op
               for r in rec.plan.recomputed)


def _policy(must_save=(), must_recompute=()):
    def policy(ctx, op, *args, **kwargs):
        if op in must_save:
            return CheckpointPolicy.MUST_SAVE
        if op in must_recompute:
            return CheckpointPolicy.MUST_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE
    return functools.partial(create_selective_checkpoint_contexts, policy)


@pytest.mark.parametrize("solver", SOLVERS)
def test_selective_checkpoint_policy_around_random_ops(solver):
    torch.manual_seed(0)
    # a policy asking to recompute the random ops themselves
    policy = _policy(must_save=(torch.ops.aten.addmm.default,),
                     must_recompute=(torch.ops.aten.native_dropout.default, torch.ops.aten.rand_like.default))
    model = _Checkpointed(context_fn=policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pfn = check_against_eager(model, [torch.randn(8, 16, requires_grad=True)], solver)
    rec = pfn.history[-1]
    # the random ops the policy asks to recompute are, by replay (eager's gradients, checked above)
    random = _random_draws(rec)
    assert random and random <= rec.plan.recomputed
    addmms = {n.name for n in rec.problem.nodes if "addmm" in n.op}
    assert addmms and not (addmms & rec.plan.recomputed)


# ---- which tags bind: torch's own test cases ------------------------------------------------------

def _mm_counts(partition_fn, context_fn):
    """(forward, backward) aten.mm counts of sigmoid(x @ x) in a checkpoint with ``context_fn``."""
    graphs = {}

    def keep(name):
        def compiler(gm, _):
            graphs[name] = gm
            return gm
        return compiler

    be = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"), partition_fn=partition_fn)
    fn = lambda x: checkpoint(lambda x: torch.sigmoid(torch.matmul(x, x)), x,  # noqa: E731
                              use_reentrant=False, context_fn=context_fn)
    x = torch.randn(4, 4, requires_grad=True)
    out_e, grads_e, _ = _run(fn, [x])
    torch._dynamo.reset()
    out_c, grads_c, _ = _run(fn, [x], compiled=torch.compile(fn, backend=be, fullgraph=True))
    torch.testing.assert_close(out_c + grads_c, out_e + grads_e)
    return _ops(graphs["fw"], torch.ops.aten.mm.default), _ops(graphs["bw"], torch.ops.aten.mm.default)


@pytest.mark.parametrize("solver", SOLVERS)
def test_must_tags_bind_as_in_torch(solver):
    kw = CPSAT if solver == "cpsat" else {}
    for ctx in (_policy(must_recompute=(torch.ops.aten.mm.default,)),
                _policy(must_save=(torch.ops.aten.mm.default,))):
        ours = _mm_counts(opt_remat.partitioner(solver, **kw), ctx)
        assert ours == _mm_counts(tp.min_cut_rematerialization_partition, ctx)
    # MUST_RECOMPUTE: 1 mm in the forward, 1 recomputed + 2 gradient mms; MUST_SAVE: 1 and 2
    assert _mm_counts(opt_remat.partitioner(solver, **kw),
                      _policy(must_recompute=(torch.ops.aten.mm.default,))) == (1, 3)


class _HookedRegion(torch.nn.Module):
    """torch's case: a checkpointed region's output with a backward hook, read by a layer norm."""

    class Sub(torch.nn.Module):
        def forward(self, x):
            y = torch.matmul(x, x)
            return y * y

    def __init__(self, hook):
        super().__init__()
        self.sub, self.norm = self.Sub(), torch.nn.LayerNorm(4)
        if hook:
            self.sub.register_forward_hook(lambda m, a, out: (out.register_hook(lambda g: g), out)[1])

    def forward(self, x):
        return self.norm(checkpoint(self.sub, x, use_reentrant=False))


def _saved_names(partition_fn, hook):
    """Names the forward hands to the backward (primals left out), under compiled autograd."""
    saved = {}

    def fw(gm, _):
        outs = gm.graph.find_nodes(op="output")[0].args[0]
        inputs = {get_node_storage(p) for p in gm.graph.find_nodes(op="placeholder")}
        # inputs and views of them cost nothing to save
        saved["names"] = {str(o) for o in outs[1:] if get_node_storage(o) not in inputs}
        return gm

    from torch._inductor.decomposition import select_decomp_table
    be = aot_autograd(fw_compiler=fw, bw_compiler=nop, partition_fn=partition_fn,
                      decompositions=select_decomp_table())
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = _HookedRegion(hook), torch.ones(4, 4, requires_grad=True)
    ref = _HookedRegion(hook)
    ref.load_state_dict(model.state_dict())
    ref(x).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    bw_compile = lambda gm: torch.compile(gm, backend="eager")  # noqa: E731
    with torch._dynamo.compiled_autograd._enable(bw_compile):
        out = torch.compile(model, backend=be, fullgraph=True)(x2)
        out.sum().backward()
    torch.testing.assert_close(out, ref(x))
    torch.testing.assert_close(x2.grad, x.grad)
    return saved["names"]


@pytest.mark.parametrize("solver", SOLVERS)
def test_hooked_region_output_is_saved_as_torch_saves_it(solver):
    theirs = _saved_names(tp.min_cut_rematerialization_partition, hook=True)
    assert theirs - _saved_names(tp.min_cut_rematerialization_partition, hook=False) == {"mul"}
    if solver == "mincut":
        ours = _saved_names(opt_remat.partitioner("mincut"), hook=True)
        assert ours == theirs  # the hooked `mul`; the norm is recomputed from it
    else:
        # CP-SAT without a budget returns the fastest plan: it also keeps the norm's values (more
        # bytes, no recompute) on purpose; under torch's budget it saves what torch saves
        with torch._functorch.config.patch(activation_memory_budget=0.5):
            assert _saved_names(opt_remat.partitioner("cpsat", **CPSAT), hook=True) == theirs


# ---- budgets: torch's settings --------------------------------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 8))


def _bytes(pfn):
    rec = pfn.history[-1]
    return rec.plan.saved_bytes


@pytest.mark.parametrize("solver", SOLVERS)
def test_global_activation_memory_budget_is_honoured(solver):
    x = torch.randn(16, 32, requires_grad=True)
    full = _bytes(check_against_eager(_mlp(), [x], solver, budget=1.0))
    with torch._functorch.config.patch(activation_memory_budget=0.0):
        ours = _bytes(check_against_eager(_mlp(), [x], solver))
        torch._dynamo.reset()
        theirs = _bytes(check_against_eager(_mlp(), [x], "torch"))
    assert ours < full and ours <= theirs
    # the same budget passed explicitly gives the same plan
    torch._dynamo.reset()
    assert _bytes(check_against_eager(_mlp(), [x], solver, budget=0.0)) == ours


def test_explicit_budget_wins_and_says_so_once(caplog):
    x = torch.randn(16, 32, requires_grad=True)
    with torch._functorch.config.patch(activation_memory_budget=0.0), caplog.at_level("WARNING", "opt_remat"):
        be = _backend("mincut", budget=1.0)
        for _ in range(2):
            torch._dynamo.reset()
            _run(_mlp(), [x], compiled=torch.compile(_mlp(), backend=be))
    notes = [r for r in caplog.records if "settings" in r.getMessage() and "ignored" in r.getMessage()]
    assert len(notes) == 1 and "budget=1.0" in notes[0].getMessage() and notes[0].name == "opt_remat"
    assert _bytes(be.partitioner) > 0


def _region(budget_a, budget_b=None, cover_all=True, annotate=True):
    """The MLP's step under one or two region budgets (``annotate=False``: the same, unannotated,
    for eager, where torch refuses region budgets)."""
    mlp = _mlp()
    region = (torch.autograd.graph.region_activation_memory_budget if annotate
              else lambda b: contextlib.nullcontext())

    def fn(x):
        if not cover_all:
            x = mlp[0](x)  # outside any region
        with region(budget_a):
            y = mlp[0 if cover_all else 1:3](x)
        with region(budget_a if budget_b is None else budget_b):
            return mlp[3:](y)
    return fn


@pytest.mark.parametrize("solver", SOLVERS)
def test_region_budget_is_honoured(solver):
    x = torch.randn(16, 32, requires_grad=True)
    ours = _bytes(check_against_eager(_region(0.0), [x], solver, eager=_region(0.0, annotate=False)))
    torch._dynamo.reset()
    with torch._functorch.config.patch(activation_memory_budget=0.0):
        assert ours == _bytes(check_against_eager(_mlp(), [x], solver))


@pytest.mark.parametrize("case, message", [
    (dict(budget_a=0.0, budget_b=0.5), "conflicting budgets"),
    (dict(budget_a=0.0, cover_all=False), "must cover the entire forward"),
])
def test_region_budget_errors_are_torchs(case, message):
    x = torch.randn(16, 32, requires_grad=True)
    for partition_fn in (tp.min_cut_rematerialization_partition, opt_remat.partitioner()):
        torch._dynamo.reset()
        fn = _region(**case)
        be = aot_autograd(fw_compiler=boxed_nop, partition_fn=partition_fn)
        with pytest.raises(Exception, match=message):
            torch.compile(fn, backend=be)(x).sum().backward()
