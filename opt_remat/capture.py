"""Stage 1: capture the joint forward+backward graph that AOTAutograd hands to a partitioner.

With ``meta=True`` the model is built and traced under a FakeTensorMode: sizes, dtypes and flops are
exact, but no weight or activation memory is allocated, so a LLaMA-7B-sized step can be planned on a
laptop. Fake tensors keep the CPU device (not ``meta``) so that ops dispatch as in a real capture:
on the meta device SDPA falls back to its unfused math form and the graph would differ.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_function
from torch._functorch.compilers import nop
from torch._functorch.partitioners import default_partition
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call


@dataclass
class JointGraph:
    module: fx.GraphModule
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int] | None

    def copy(self) -> "JointGraph":
        """A deep copy: partitioners mutate the graph they are given."""
        return JointGraph(copy.deepcopy(self.module), self.num_fwd_outputs,
                          list(self.static_lifetime_input_indices or []))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None:
        yield
        return
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def capture(model: torch.nn.Module | Callable[[], torch.nn.Module], example_inputs: Sequence[Any], *,
            decompositions: str | Mapping | None = "inductor",
            loss_fn: Callable[[Any], torch.Tensor] | None = None,
            meta: bool = False, dtype: torch.dtype | None = None) -> JointGraph:
    """Trace one training step of ``model`` (or of ``model()`` for a factory) into its joint graph.

    ``meta=True`` builds the factory under a FakeTensorMode and fakes the inputs, so nothing is
    allocated (pass a factory: a module given already built has allocated its weights).
    ``dtype`` is the default dtype while the model is built.
    """
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if meta else None
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return _capture(model, example_inputs, decompositions=decompositions, loss_fn=loss_fn,
                        dtype=dtype, fake_mode=fake_mode)


def _capture(model: torch.nn.Module | Callable[[], torch.nn.Module], example_inputs: Sequence[Any], *,
             decompositions: str | Mapping | None, loss_fn: Callable[[Any], torch.Tensor] | None,
             dtype: torch.dtype | None, fake_mode: FakeTensorMode | None) -> JointGraph:
    from .api import _decompositions
    from .verify import default_loss

    with _default_dtype(dtype):
        module = model() if not isinstance(model, torch.nn.Module) else model
    if fake_mode is not None:
        example_inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                          for x in example_inputs]
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    seen: dict[str, JointGraph] = {}

    def catch(joint: fx.GraphModule, joint_inputs: Any, **kw: Any):
        seen["graph"] = JointGraph(copy.deepcopy(joint), kw["num_fwd_outputs"],
                                   kw.get("static_lifetime_input_indices"))
        return default_partition(joint, joint_inputs, **kw)

    def step(params: dict, buffers: dict, *inputs: Any) -> Any:
        return functional_call(module, (params, buffers), inputs)

    compiled = aot_function(step, fw_compiler=nop, bw_compiler=nop, partition_fn=catch,
                            decompositions=_decompositions(decompositions))
    (loss_fn or default_loss)(compiled(params, buffers, *example_inputs))  # tracing happens here
    return seen["graph"]
