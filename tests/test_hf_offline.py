"""A Hugging Face LLaMA planned offline and trained with the plan: a small LlamaForCausalLM
(2 layers, hidden 64, random init) captured with fake tensors, planned by the fast default under
a peak budget, written to a plan file; the real model then trains one step with that plan, with
save-all's gradients and exactly the plan's saved bytes. Skipped without transformers."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

import opt_remat  # noqa: E402
from opt_remat.hf import causal_lm  # noqa: E402
from opt_remat.solve import choose_peak_plan  # noqa: E402
from opt_remat.verify import compare_steps, save_all_backend  # noqa: E402
from solvers.baselines import save_all  # noqa: E402
from solvers.liveness import peak_lower_bound, simulate_plan  # noqa: E402
from test_offline_plans import _saved_for_backward_bytes, _train, write_plans  # noqa: E402

VOCAB, SEQ = 128, 16
CONFIG = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 4, "vocab_size": VOCAB, "max_position_embeddings": 64,
          "attn_implementation": "sdpa"}
EAGER = {"compiler": "eager", "decompositions": "inductor"}


def _factory():
    return causal_lm("LlamaForCausalLM", CONFIG)


def test_hf_llama_planned_offline_trains_with_the_plan(tmp_path):
    x = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    config = (f"model: {{factory: 'opt_remat.hf:causal_lm', kwargs: {{architecture: LlamaForCausalLM, "
              f"config: {json.dumps(CONFIG)}}}, inputs: [{{shape: [2, {SEQ}], dtype: int64, high: {VOCAB}}}]}}\n"
              "capture: {compiler: eager, decompositions: inductor, meta: true}\n"
              "budgets: [{peak: 1MiB}]\nsolvers: [mincut]\n")

    def solve(problem):  # a peak budget between the floor and save-all's peak: the plan must recompute something
        top = simulate_plan(problem, save_all(problem).saved).peak
        plan = choose_peak_plan(problem, None, (peak_lower_bound(problem) + top) // 2, None)
        assert plan.recomputed and plan.extra["peak"] < top
        return plan

    path = tmp_path / "plan.json"
    _, [plan] = write_plans(path, config, solve)

    torch.manual_seed(0)
    model = _factory()
    be = opt_remat.backend(plan=str(path), **EAGER)
    step = _train(model, x, be)
    [rec] = be.partitioner.history
    assert rec.plan.saved_bytes == plan.saved_bytes
    fw_out = rec.fw_module.graph.find_nodes(op="output")[0].args[0]
    assert {n.name for n in fw_out[rec.num_fwd_outputs:]} == set(rec.plan.saved)

    check = compare_steps(step, _train(model, x, save_all_backend("inductor")))
    assert check.ok and check.max_rel_error <= 1e-5
    assert _saved_for_backward_bytes(model, x, opt_remat.backend(plan=str(path), **EAGER)) == plan.saved_bytes
