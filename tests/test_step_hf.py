"""The step across graphs on a Hugging Face LLaMA (issue #41): per-layer capture gives one layer
graph counted once per layer, and (slow) a step planned offline under a device budget, applied
through per-layer compile, measured within 5% of its prediction (``benchmarks/bench_step.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

TINY = dict(num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=128, max_position_embeddings=128, attn_implementation="sdpa")


def _tiny():
    from opt_remat.hf import causal_lm
    return causal_lm("LlamaForCausalLM", TINY)


def test_per_layer_capture_counts_one_layer_graph_once_per_layer():
    import torch

    from opt_remat.request import make_request
    from opt_remat.step_capture import AFTER, BEFORE, build_step, capture_step
    from solvers.step_parts import layer_values

    ids = torch.randint(0, 128, (2, 16))
    captured = capture_step(_tiny, [ids], per_layer="model.model.layers", meta=True)
    assert len(captured.layers) == captured.count == 3
    work = build_step(captured, make_request())
    keys = [g.key for g in work.step.graphs]
    assert keys[0] == BEFORE and keys[-1] == AFTER and len(keys) == 3
    layer = work.step.graphs[1]
    assert layer.repeat == 3 and layer.fixed is None and layer.key in work.values
    # the root's parts hold every root value of the whole graph but the layers' gradient sums
    whole = captured.whole.copy()
    from opt_remat import road
    problem = road.prepare(whole.module, whole.num_fwd_outputs, whole.static_lifetime_input_indices,
                           make_request(), input_roles=whole.input_roles).problem
    inside = layer_values(problem, "model.model.layers")
    parts = [g.problem for g in (work.step.graphs[0], work.step.graphs[-1])]
    owned = [{n.name for n in p.nodes if n.role.value != "input"} for p in parts]
    assert not owned[0] & owned[1] and not (owned[0] | owned[1]) & inside
    forward_root = {n.name for n in problem.nodes if n.role.value in ("forward", "either") and n.name not in inside}
    assert forward_root <= owned[0] | owned[1]


def test_a_path_that_is_no_module_list_is_refused_naming_the_lists():
    import torch

    from opt_remat.errors import CaptureError
    from opt_remat.step_capture import capture_step

    with pytest.raises(CaptureError, match=r"no module 'model\.layers'; its module lists: model\.model\.layers"):
        capture_step(_tiny, [torch.randint(0, 128, (2, 16))], per_layer="model.layers", meta=True)


@pytest.mark.slow
def test_a_step_plan_applied_per_layer_is_measured_within_5_percent():
    import bench_step

    row = bench_step.row(4, 128, 0.5)
    assert row["partitions"] == 4 and row["plans_applied"] == ["plan:step"], row
    assert row["layers"] == 4
    assert row["predicted"] <= row["budget"] < row["eager_predicted"]
    assert abs(row["error"]) <= 0.05, row
