"""Small random-init Hugging Face models the drop-in default is checked on (tests and
``benchmarks/bench_default_peak.py``): 2 layers, hidden 64, nothing downloaded. Each entry is
(config class, model class, config fields); the step is ``model(input_ids=ids, labels=ids).loss``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

VOCAB, HIDDEN, LAYERS = 128, 64, 2
BATCH, SEQ = 4, 128
_DECODER: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                                num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=256)
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_DECODER, head_dim=16)),
    # sliding and global attention layers
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(_DECODER, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"])),
    # experts through the custom op transformers.grouped_mm_fallback
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(_DECODER, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(_DECODER, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                       decoder_sparse_step=1)),
    # an encoder-decoder: the labels are the decoder's inputs, shifted
    "t5": ("T5Config", "T5ForConditionalGeneration",
           dict(vocab_size=VOCAB, d_model=HIDDEN, d_kv=16, d_ff=128, num_layers=LAYERS, num_decoder_layers=LAYERS,
                num_heads=4, decoder_start_token_id=0, pad_token_id=0, dropout_rate=0.0)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(vocab_size=VOCAB, hidden_size=HIDDEN, ffn_dim=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                 max_position_embeddings=256, word_embed_proj_dim=HIDDEN, dropout=0.0)),
}


def factory(name: str) -> Callable[[], torch.nn.Module]:
    """A zero-argument constructor of the model's training step (random init)."""
    import transformers

    config_cls, model_cls, fields = MODELS[name]
    config = getattr(transformers, config_cls)(**fields)

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = getattr(transformers, model_cls)(config)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=idx, labels=idx).loss

    Step.__name__ = Step.__qualname__ = f"{model_cls}Step"
    return Step


def inputs(seed: int = 0) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen),)
