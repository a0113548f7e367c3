"""HF transformers models (the optional ``hf`` extra): capture with fake tensors and for real on
small random configs, one graph per graph break; their decoder layers found as blocks from the
module paths; checkpoint-every-1 on a LLaMA saving exactly the layers' input hidden states, as
``torch.utils.checkpoint`` around each layer does."""

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")

from opt_remat.build import problem_from_joint  # noqa: E402  (after the skip)
from opt_remat.capture import capture_graphs  # noqa: E402
from solvers import check_plan  # noqa: E402
from solvers.baselines import uniform_checkpoint  # noqa: E402
from solvers.blocks import find_blocks  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("reset_dynamo")]

LAYERS = 3
BATCH, SEQ, VOCAB, HIDDEN = 2, 32, 128, 64
_DECODER = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                num_hidden_layers=LAYERS, max_position_embeddings=64)
# architecture -> (config class, model class, config, graphs captured, path of the layers)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(_DECODER, num_attention_heads=4, num_key_value_heads=4), 1, "model.model.layers"),
    "mistral": ("MistralConfig", "MistralForCausalLM",  # grouped-query attention
                dict(_DECODER, num_attention_heads=4, num_key_value_heads=2), 1, "model.model.layers"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(_DECODER, num_attention_heads=4, num_key_value_heads=2), 1, "model.model.layers"),
    # a graph break: the model's forward is a graph of its own (its module paths start at the
    # model, the frame dynamo traced) and the loss another
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=64), 2,
             "transformer.h"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(_DECODER, num_attention_heads=4), 1,
                 "model.gpt_neox.layers"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(_DECODER, num_attention_heads=4, num_key_value_heads=4, pad_token_id=0), 1,
             "model.model.layers"),
    "bert": ("BertConfig", "BertForMaskedLM", dict(_DECODER, num_attention_heads=4), 1,
             "model.bert.encoder.layer"),
}


def _factory(arch: str):
    config_cls, model_cls, kwargs, _, _ = ARCHS[arch]
    config = getattr(transformers, config_cls)(**kwargs)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = getattr(transformers, model_cls)(config)

        def forward(self, idx):
            return self.model(input_ids=idx, labels=idx).loss

    return Step


@functools.lru_cache(maxsize=None)
def _problems(arch: str, meta: bool):
    torch.manual_seed(0)
    idx = torch.randint(0, VOCAB, (BATCH, SEQ))
    joints = capture_graphs(_factory(arch), (idx,), meta=meta)
    return tuple(problem_from_joint(j)[1] for j in joints)


def _check_blocks(arch: str, problems) -> None:
    *_, n_graphs, layers_path = ARCHS[arch]
    assert len(problems) == n_graphs
    found = [b for b in map(find_blocks, problems) if b is not None]
    assert len(found) == 1  # the layers all lie in one graph
    blocks = found[0]
    assert blocks.paths == tuple(f"{layers_path}.{i}" for i in range(LAYERS))
    # every block's values are made in it, forward and backward
    problem = next(p for p in problems if find_blocks(p) is not None)
    for name, b in blocks.block_of.items():
        assert problem.by_name[name].module.startswith(blocks.paths[b])
    assert any(problem.by_name[v].role.value == "backward" for v in blocks.block_of)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_fake_capture_finds_the_layers(arch):
    _check_blocks(arch, _problems(arch, meta=True))


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a != "llama" else a
                                  for a in ARCHS])
def test_real_capture_finds_the_layers(arch):
    _check_blocks(arch, _problems(arch, meta=False))


def test_checkpoint_every_layer_saves_the_layer_inputs():
    (problem,) = _problems("llama", meta=True)
    blocks = find_blocks(problem)
    plan = uniform_checkpoint(problem, None, every=1)
    assert check_plan(problem, plan).valid
    hidden_bytes = BATCH * SEQ * HIDDEN * 4  # float32 hidden states
    inside = {v for v in plan.saved if v in blocks.block_of}
    # from inside the layers: the hidden states each layer hands to the next, and the last
    # layer's to the final norm; nothing else
    assert inside == {g[0] for g in blocks.entries[1:]} | set(blocks.exit)
    assert len(inside) == LAYERS
    for v in inside:
        node = problem.by_name[v]
        assert node.bytes == hidden_bytes and node.op == "aten.add.Tensor"
        assert node.module == blocks.paths[blocks.block_of[v]]  # the layer's residual add
    # the first layer's input is the embedding's output
    first = [v for v in blocks.entries[0] if problem.by_name[v].bytes == hidden_bytes]
    assert [problem.by_name[v].op for v in first] == ["aten.embedding.default"]
    assert set(first) <= plan.saved
