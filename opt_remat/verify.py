"""Stage 5: check a partition against saving everything, and measure what it really saves."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import torch
import torch.fx as fx
from torch._functorch import partitioners as tp
from torch._inductor.fx_utils import get_node_storage
from torch.fx.experimental.symbolic_shapes import optimization_hint

from .compile_setup import aot_graphs
from .costs import tensor_bytes


def save_all_backend(decompositions: Any = None) -> Callable[..., Any]:
    """torch's ``default_partition`` (save everything the backward reads) on plain FX graphs."""
    return aot_graphs(tp.default_partition, decompositions)


def default_loss(out: Any) -> torch.Tensor:
    """Sum of every floating output, so every output gets a gradient."""
    leaves = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]
    return cast(torch.Tensor, sum(o.float().sum() for o in leaves))


def training_step(model: torch.nn.Module, inputs: Sequence[Any], backend: Any, *, seed: int = 0,
                  loss_fn: Callable[[Any], torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward+backward of a copy of ``model`` compiled with ``backend``: (loss, grads).
    ``loss_fn``: the output's loss (default: ``default_loss``)."""
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=False)
    torch.manual_seed(seed)
    loss = (loss_fn or default_loss)(compiled(*inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@dataclass(frozen=True)
class GradientCheck:
    loss_a: float
    loss_b: float
    max_rel_error: float
    bitwise: bool
    missing: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.missing


def compare_steps(a: tuple[torch.Tensor, dict[str, torch.Tensor]],
                  b: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> GradientCheck:
    """Largest relative error between two steps' losses and gradients (norm-relative per tensor)."""
    (loss_a, ga), (loss_b, gb) = a, b
    missing = tuple(sorted(set(ga) ^ set(gb)))
    errors = [_rel(loss_a, loss_b)] + [_rel(ga[k], gb[k]) for k in ga if k in gb]
    bitwise = torch.equal(loss_a, loss_b) and all(torch.equal(ga[k], gb[k]) for k in ga if k in gb)
    return GradientCheck(float(loss_a), float(loss_b), max(errors), bitwise, missing)


def _rel(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denom = max(float(y.norm()), 1e-30)
    return float((x - y).norm()) / denom


def measured_saved_bytes(fw_module: fx.GraphModule, num_fwd_outputs: int) -> int:
    """Bytes of the tensors the forward graph hands to the backward, each storage once, graph
    inputs excluded: read off the forward graph's outputs, independent of any plan."""
    output = fw_module.graph.find_nodes(op="output")[0]
    saved = list(output.args[0])[num_fwd_outputs:]
    input_storages = {get_node_storage(p) for p in fw_module.graph.find_nodes(op="placeholder")}
    sizes: dict[Any, int] = {}
    for node in saved:
        val = node.meta.get("val") if isinstance(node, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue  # symbolic ints are not activation memory
        key = get_node_storage(node)
        if key is not None and key in input_storages:
            continue
        size = max(tensor_bytes(val), int(optimization_hint(val.untyped_storage().nbytes(), fallback=0)))
        sizes[key if key is not None else id(node)] = max(sizes.get(key, 0), size)
    return sum(sizes.values())
