"""The graph rules the prepare stage and the lowering share: which ops are impure (kept by dead-code
elimination) and which of the joint graph's nodes torch's graph extraction keeps in a subgraph.
They live below both so that ``prepare`` (build) need not import ``extract`` (lower)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch._functorch import partitioners as tp

from .errors import Unsupported


def impurity() -> Callable[[fx.Node], bool]:
    """``Node.is_impure`` as ``Graph.eliminate_dead_code`` calls it, memoized per op overload (whose
    purity does not depend on the arguments)."""
    impure_random = True
    if torch._guards.TracingContext.try_get():
        impure_random = torch._inductor.config.fallback_random
    memo: dict[Any, bool] = {}

    def impure(node: fx.Node) -> bool:
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target not in memo:
                memo[target] = node.is_impure(impure_random)
            return memo[target]
        return node.is_impure(impure_random)
    return impure


def kept_nodes(nodes: Sequence[fx.Node], inputs: Sequence[fx.Node], outputs: Sequence[Any], subgraph: str, *,
               impure: Callable[[fx.Node], bool] | None = None,
               replays: dict[fx.Node, fx.Node] | None = None) -> list[fx.Node]:
    """The nodes (not ``inputs``) of the graph torch's ``_extract_graph_with_inputs_outputs`` makes
    from the joint graph's ``nodes``, in their order: those computable from ``inputs`` alone, and
    allowed in ``subgraph``, that survive its dead-code elimination. ``replays``: extra inputs."""
    impure = impure or impurity()
    replays = replays or {}
    is_input = set(inputs)
    valid = set(inputs)
    forward = subgraph == "forward"
    for node in nodes:
        if node in is_input or node.op == "placeholder" or node.op == "output":
            continue
        if tp._must_be_in_backward(node) if forward else tp._must_be_in_forward(node):
            continue
        state = replays.get(node)
        if node.op == "get_attr" or (all(i in valid for i in node.all_input_nodes)
                                     and (state is None or state in valid)):
            valid.add(node)
    needed = set()
    for out in outputs:
        if isinstance(out, fx.Node):
            if out not in valid:
                raise Unsupported(f"{subgraph} output {out.name} is not computable there")
            needed.add(out)
    kept = []
    for node in reversed(nodes):
        if node in is_input or node not in valid:
            continue
        if node in needed or impure(node):
            kept.append(node)
            needed.update(node.all_input_nodes)
            if node in replays:
                needed.add(replays[node])
    kept.reverse()
    return kept
