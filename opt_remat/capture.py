"""Stage 1: capture the joint forward+backward graph that AOTAutograd hands to a partitioner."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module
from torch._functorch.compilers import nop
from torch._functorch.partitioners import default_partition


@dataclass
class JointGraph:
    module: fx.GraphModule
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int] | None

    def copy(self) -> "JointGraph":
        """A deep copy: partitioners mutate the graph they are given."""
        return JointGraph(copy.deepcopy(self.module), self.num_fwd_outputs,
                          list(self.static_lifetime_input_indices or []))


def capture(model: torch.nn.Module | Callable[[], torch.nn.Module], example_inputs: Sequence[Any], *,
            decompositions: str | Mapping | None = "inductor",
            loss_fn: Callable[[Any], torch.Tensor] | None = None) -> JointGraph:
    """Trace one training step of ``model`` (or of ``model()`` for a factory) into its joint graph."""
    from .api import _decompositions
    from .verify import default_loss

    module = model() if not isinstance(model, torch.nn.Module) else model
    seen: dict[str, Any] = {}

    def catch(joint: fx.GraphModule, joint_inputs: Any, **kw: Any):
        seen["graph"] = JointGraph(copy.deepcopy(joint), kw["num_fwd_outputs"],
                                   kw.get("static_lifetime_input_indices"))
        return default_partition(joint, joint_inputs, **kw)

    compiled = aot_module(module, fw_compiler=nop, bw_compiler=nop, partition_fn=catch,
                          decompositions=_decompositions(decompositions))
    out = compiled(*example_inputs)
    (loss_fn or default_loss)(out)  # tracing happens on the forward call; no backward is needed
    return seen["graph"]
