"""Live memory of a training step: predicted from the FX graphs, and measured while they run.

``simulate(fw_module, bw_module)`` works on any pair of partitioned graphs, opt-remat's or torch's:
it walks the forward then the backward in their own order, allocating each new storage when its
first value is computed and freeing it after the last use of any value that aliases it. Graph
inputs (parameters, data, tangents) are not counted; the forward's outputs to the caller die at the
end of the forward, saved values after their last backward use, gradients at the end.

``measure_peak`` counts the storages that ops create while a step runs, as they are created and
freed, so the two can be compared.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx
from torch._inductor.fx_utils import get_node_storage, get_storage
from torch.fx.experimental.symbolic_shapes import optimization_hint
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from solvers.liveness import MemoryCurve

from .costs import tensor_bytes


def _storages_of(node: fx.Node) -> list[tuple[Any, int]]:
    vals, _ = tree_flatten(node.meta.get("val"))
    out = []
    for v in vals:
        if isinstance(v, torch.Tensor) and torch._C._has_storage(v):
            out.append((get_storage(v), max(tensor_bytes(v), int(optimization_hint(
                v.untyped_storage().nbytes(), fallback=0)))))
    return out


def _run_graph(phase: str, gm: fx.GraphModule, live: dict[Any, int], owners: dict[str, Any],
               keep_outputs: bool, steps: list) -> set[Any]:
    """Walk one graph; ``owners`` maps placeholder names to storages carried in (saved values)."""
    nodes = list(gm.graph.nodes)
    output = nodes[-1]
    out_names = {a.name for a in tree_flatten(output.args)[0] if isinstance(a, fx.Node)}
    storage_of: dict[str, list[Any]] = {}
    last_use: dict[Any, int] = {}
    # memory that came in from outside (parameters, data, tangents): never counted
    external = {k for n in nodes if n.op == "placeholder" and n.name not in owners for k, _ in _storages_of(n)}
    for i, node in enumerate(nodes):
        if node.op == "placeholder":
            storage_of[node.name] = [owners[node.name]] if node.name in owners else []
        elif node.op in ("call_function", "call_method", "call_module"):
            storage_of[node.name] = [k for k, _ in _storages_of(node)]
        else:
            storage_of[node.name] = []
        for ref in (node, *node.all_input_nodes):
            for key in storage_of.get(ref.name, ()):
                last_use[key] = i
    kept = {k for n in out_names for k in storage_of.get(n, ())}
    total = sum(live.values())
    for i, node in enumerate(nodes):
        if node.op in ("call_function", "call_method", "call_module"):
            for key, size in _storages_of(node):
                if key not in live and key in last_use and key not in external:
                    live[key] = size
                    total += size
            steps.append((phase, node.name, total))
        for key in [k for k in live if last_use.get(k) == i and not (keep_outputs and k in kept)]:
            if node.op != "output" or key not in kept:
                total -= live.pop(key)
    return kept


def simulate(fw_module: fx.GraphModule, bw_module: fx.GraphModule, num_fwd_outputs: int) -> MemoryCurve:
    """Predicted live bytes after every op of the forward then the backward."""
    steps: list[tuple[str, str, int]] = []
    live: dict[Any, int] = {}
    _run_graph("forward", fw_module, live, {}, True, steps)
    fw_out = list(fw_module.graph.find_nodes(op="output")[0].args[0])
    user_outputs = {k for n in fw_out[:num_fwd_outputs] if isinstance(n, fx.Node)
                    for k in [get_node_storage(n)] if k is not None}
    saved_by_name = {n.name: get_node_storage(n) for n in fw_out[num_fwd_outputs:] if isinstance(n, fx.Node)}
    saved_keys = {k for k in saved_by_name.values() if k is not None}
    for key in list(live):
        if key in user_outputs and key not in saved_keys:
            live.pop(key)
    owners = {name: key for name, key in saved_by_name.items() if key is not None and key in live}
    bw_placeholders = {n.name for n in bw_module.graph.find_nodes(op="placeholder")}
    for key in [k for k in live if k not in {owners[n] for n in owners if n in bw_placeholders}]:
        live.pop(key)
    _run_graph("backward", bw_module, live, {n: k for n, k in owners.items() if n in bw_placeholders},
               True, steps)
    if not steps:
        return MemoryCurve((), 0, "", "")
    phase, at, peak = max(steps, key=lambda s: s[2])
    return MemoryCurve(tuple(steps), peak, phase, at)


class _StorageTracker(TorchDispatchMode):
    """Counts the bytes of storages created by ops while they are alive.

    Liveness is read off the storages themselves (weak references to the StorageImpl), not off
    Python tensor objects: autograd keeps saved tensors alive in C++ after their Python objects die.
    """

    # RNG replay's higher-order ops (run_and_save_rng_state) come here whole: run as they are, and
    # their outputs counted like any op's
    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def sweep(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.sweep()  # storages freed since the last op (the graph drops dead values between ops)
        out = func(*args, **(kwargs or {}))
        inputs = {StorageWeakRef(t.untyped_storage()).cdata for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            ref = StorageWeakRef(t.untyped_storage())
            if ref.cdata in self.live or ref.cdata in inputs:
                continue  # a view or in-place result: no new memory
            size = t.untyped_storage().nbytes()
            self.live[ref.cdata] = (ref, size)
            self.current += size
        self.peak = max(self.peak, self.current)
        return out


class PeakMeter:
    """A graph compiler for ``opt_remat.backend(compiler=meter)`` that runs the partitioned graphs
    as they are (boxed, freeing inputs early) and counts the storages their ops create.

    Only ops inside the graphs are seen (a dispatch mode around a whole ``torch.compile`` call
    would make dynamo fall back to eager); ``reset()`` before the step you measure.
    """

    def __init__(self) -> None:
        self._tracker = _StorageTracker()

    def reset(self) -> None:
        self._tracker.sweep()
        self._tracker.peak = self._tracker.current

    @property
    def peak(self) -> int:
        return self._tracker.peak

    @property
    def current(self) -> int:
        self._tracker.sweep()
        return self._tracker.current

    def __call__(self, gm: fx.GraphModule, example_inputs: Any) -> Callable[[list], Any]:
        from torch._dynamo.backends.debugging import boxed_nop
        inner = boxed_nop(gm, example_inputs)
        tracker = self._tracker

        def run(args: list) -> Any:
            with tracker:
                return inner(args)
        run._boxed_call = True  # type: ignore[attr-defined]
        return run
