"""Hugging Face transformers models by class name, for YAML configs and the API.

``causal_lm("LlamaForCausalLM", {"num_hidden_layers": 32, ...})`` builds the model from a config
mapping (random init, nothing downloaded) and wraps it so that its forward takes the token ids
and returns the next-token loss, ``model(input_ids=ids, labels=ids).loss``: the training step
opt-remat captures. Under ``capture.meta`` (fake tensors) nothing is allocated, so a 7B model is
planned on a laptop. In a config::

    model:
      factory: opt_remat.hf:causal_lm
      kwargs: {architecture: LlamaForCausalLM, config: {num_hidden_layers: 32, hidden_size: 4096}}
      inputs: [{shape: [8, 2048], dtype: int64, high: 32000}]
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch


class CausalLMLoss(torch.nn.Module):
    """A causal LM whose forward takes token ids and returns its loss on them as labels."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=input_ids).loss


def causal_lm(architecture: str, config: Mapping[str, Any] | None = None) -> CausalLMLoss:
    """``transformers.<architecture>`` built from its config class with ``config``'s fields
    (random init), wrapped by ``CausalLMLoss``. Raises ImportError naming the extra to install
    without transformers, ValueError for a class or config field transformers does not know."""
    try:
        import transformers
    except ImportError:
        raise ImportError(f"model {architecture!r} needs Hugging Face transformers, which is not "
                          "installed: pip install 'opt-remat[hf]' (or pip install transformers)") from None
    cls = getattr(transformers, architecture, None)
    config_class = getattr(cls, "config_class", None)
    if cls is None or config_class is None:
        raise ValueError(f"transformers {transformers.__version__} has no model class {architecture!r}; "
                         "expected a class name such as LlamaForCausalLM or MistralForCausalLM")
    fields = dict(config or {})
    # transformers keeps unknown keys as attributes: a misspelled field would silently leave the
    # default (a 7B-sized model where a small one was meant)
    known = set(inspect.signature(config_class.__init__).parameters) | set(config_class().to_dict())
    unknown = sorted(k for k in fields if k not in known and k != "attn_implementation")
    if unknown:
        raise ValueError(f"config of {architecture}: unknown field(s) {', '.join(unknown)} "
                         f"(see transformers.{config_class.__name__})")
    try:
        made = config_class(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config of {architecture}: {exc}") from None
    return CausalLMLoss(cls(made))
