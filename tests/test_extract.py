"""The fast paths make exactly what torch's partitioner makes: the extraction (``opt_remat.extract``)
its forward and backward graphs, ``prepare_joint`` its DCE and CSE, ``classify`` its ``NodeInfo``.

Each case runs a conformance or model case with every lowering done both ways: the fast path's
forward and backward must have torch's code (names, order, ops, arguments, output layout) and
output descriptors, and the fast path must really have been taken where it applies.
"""

import pytest
import torch

from torch._functorch import partitioners as tp
from torch._inductor import config as inductor_config

import opt_remat.api as api
import opt_remat.extract as extract
import opt_remat.lower as lower
import opt_remat.road as road
import test_conformance as conf  # tests/ is on sys.path (pytest's default import mode)
from opt_remat.capture import capture_graphs
from opt_remat.models import example_inputs, gpt2, llama
from opt_remat.prepare import classify, prepare_joint
from opt_remat.verify import compare_steps, save_all_backend, training_step

pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


def _same(fast, ref):
    for a, b in zip(fast, ref, strict=True):
        assert a.code == b.code
        out_a, out_b = a.graph.find_nodes(op="output")[0], b.graph.find_nodes(op="output")[0]
        assert repr(out_a.meta.get("desc")) == repr(out_b.meta.get("desc"))
        assert [n.meta.get("autograd_backward") for n in a.graph.nodes] == \
               [n.meta.get("autograd_backward") for n in b.graph.nodes]
        assert [n.meta.get("val") is not None for n in a.graph.nodes] == \
               [n.meta.get("val") is not None for n in b.graph.nodes]


@pytest.fixture
def cross_check(monkeypatch):
    """Every lowering compared with torch's; returns how many took the fast path and fell back."""
    taken = {"fast": 0, "fallback": 0}
    real_extract = lower.extract_fwd_bwd

    def extract(*args, **kwargs):
        out = real_extract(*args, **kwargs)
        taken["fast" if out is not None else "fallback"] += 1
        return out

    def lower_both(joint_module, plan, **kwargs):
        fast = lower.lower_plan(joint_module, plan, **kwargs)
        _same(fast, lower.lower_plan(joint_module, plan, fast=False, **kwargs))
        return fast

    monkeypatch.setattr(lower, "extract_fwd_bwd", extract)
    monkeypatch.setattr(road, "lower_plan", lower_both)
    return taken


CASES = {
    "views_and_mutations": lambda: conf.test_views_and_mutations("mincut"),
    "none_and_int_inputs": lambda: conf.test_none_and_int_inputs("mincut"),
    "dynamic_shapes": lambda: conf.test_dynamic_shapes_and_symint_inputs("mincut"),
    "tensor_subclass": lambda: conf.test_tensor_subclass_inputs("mincut"),
    "effect_tokens": lambda: conf.test_effect_tokens("mincut"),
    "graph_breaks": lambda: conf.test_graph_breaks("mincut"),
    "checkpoint_dropout_replayed": lambda: conf.test_checkpoint_region_with_dropout("mincut", False),
    "selective_checkpoint": lambda: conf.test_selective_checkpoint_policy_around_random_ops("mincut"),
    "must_tags": lambda: conf.test_must_tags_bind_as_in_torch("mincut"),
    "region_budget": lambda: conf.test_region_budget_is_honoured("mincut"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fast_extraction_is_torchs(case, cross_check):
    CASES[case]()
    assert cross_check["fast"] >= 1 and cross_check["fallback"] == 0


@pytest.mark.parametrize("budget", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("name", ["llama", "gpt-dropout"])
def test_fast_extraction_is_torchs_on_models_under_budgets(name, budget, cross_check):
    torch.manual_seed(0)
    model = llama() if name == "llama" else gpt2(layers=2, dropout=0.2)
    inputs = example_inputs(name.split("-")[0], model)
    be = api.backend("mincut", budget, compiler="eager", decompositions="inductor")
    step = training_step(model, inputs, be, seed=3)
    assert compare_steps(step, training_step(model, inputs, save_all_backend("inductor"), seed=3)).bitwise
    assert cross_check["fast"] >= 1 and cross_check["fallback"] == 0


def _prepared_by_torch(gm):
    """What torch's partitioner decides on: its DCE and CSE (tags are applied by shared code)."""
    gm.graph.eliminate_dead_code()
    gm.graph = tp.fx_graph_cse(gm.graph)
    return gm


def _structure(graph):
    return [(n.name, n.op, str(n.target), repr(n.args), repr(n.kwargs), [u.name for u in n.users])
            for n in graph.nodes]


def _info_names(info):
    return [[n.name for n in s] for s in (info.inputs, info.required_fw_nodes, info.required_bw_nodes,
                                          info.tangents_closure, info.unclaimed_nodes)] + \
        [{n.name: i for n, i in info.fw_order.items()}, [n.name for n in info.static_lifetime_input_nodes]]


@pytest.mark.parametrize("name", ["llama", "gpt-dropout", "mutations"])
def test_prepare_and_classify_are_torchs(name):
    if name == "mutations":
        class Mutating(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.randn(6, 5))
                self.register_buffer("buf", torch.zeros(3))

            def forward(self, x):
                self.buf.add_(1.0)
                y = (x.t() @ self.w).relu()
                # repeated ops, a view of an output, and random ops CSE must not merge
                return y.sin() + y.sin(), y.view(-1), torch.rand_like(y) + torch.rand_like(y), self.buf * 1
        graphs = capture_graphs(Mutating(), (torch.randn(6, 4, requires_grad=True),))
    else:
        torch.manual_seed(0)
        model = llama() if name == "llama" else gpt2(layers=2, dropout=0.2)
        graphs = capture_graphs(model, example_inputs(name.split("-")[0], model))
    for joint in graphs:
        ours, theirs = joint.copy(), joint.copy()
        ours_module = prepare_joint(ours.module, rng_replay=False)
        theirs_module = _prepared_by_torch(theirs.module)
        assert _structure(ours_module.graph) == _structure(theirs_module.graph)
        assert _info_names(classify(ours_module, joint.num_fwd_outputs, [0])) == \
            _info_names(tp.classify_nodes(theirs_module, [0], joint.num_fwd_outputs))


def test_unmodelled_graphs_fall_back_to_torchs_extraction():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    (joint,) = capture_graphs(model, (torch.randn(4, 8),))
    module = prepare_joint(joint.module)
    saved = [n for n in module.graph.nodes if n.op == "placeholder"][:1]
    assert extract.unsupported(module, saved) is None
    with inductor_config.patch(post_grad_fusion_options={"activation_quantization_aten_pass": {}}):
        assert extract.unsupported(module, saved) == "activation quantization"
        assert extract.extract_fwd_bwd(module, saved, [], num_fwd_outputs=joint.num_fwd_outputs) is None
    saved[0].meta["saved_tensor_with_no_vc_check"] = True
    assert "version-counter" in extract.unsupported(module, saved)
