"""Stage 4's fast path: a plan's forward and backward graphs, each copied once from the joint graph.

It makes the graphs torch's lowering makes (``_extract_fwd_bwd_modules``, then
``reordering_to_mimic_autograd_engine`` on the backward and ``raise_getitems`` on both): the same
nodes, names, order and output layout (forward: its outputs, then the saved tensors, then the saved
symbolic ints; backward: those saved values, then the tangents), which ``tests/test_extract.py``
checks against torch's. Torch copies the joint graph's nodes three times, dead-code-eliminates the
copies, copies the backward again to reorder it, and compiles the modules five times; here which
nodes each graph keeps, and in what order, is decided on the joint graph first, so each node is
copied once and each module compiled once.

``unsupported`` names the graphs this path does not model (activation quantization, collectives,
``invoke_subgraph``, backward state, opaque saved values, tensors saved without version-counter
checks); ``extract_fwd_bwd`` returns None for them, and for a forward output torch would have to
substitute, so that the caller uses torch's extraction.
"""

from __future__ import annotations

import copy
import itertools
import operator
from typing import Any, Iterable, Sequence, cast

import torch
import torch.fx as fx
from torch._functorch import partitioners as tp
from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
from torch._inductor import config as inductor_config
from torch.fx._lazy_graph_module import _make_graph_module
from torch.fx.experimental.symbolic_shapes import (
    find_symbol_binding_fx_nodes,
    free_symbols,
    is_symbol_binding_fx_node,
)

from solvers.liveness import just_in_time

from .errors import Unsupported
from .graph_rules import impurity, kept_nodes
from .rng_replay import fuse_rng_replay_graph

_SUPPORTED_OPS = ("placeholder", "call_function", "get_attr", "output")


def unsupported(joint_module: fx.GraphModule, saved: Iterable[fx.Node]) -> str | None:
    """Why the fast path does not handle this graph and plan, or None if it does."""
    if inductor_config.post_grad_fusion_options.get("activation_quantization_aten_pass") is not None:
        return "activation quantization"
    invoke_subgraph = torch.ops.higher_order.invoke_subgraph
    for node in joint_module.graph.nodes:
        if node.op not in _SUPPORTED_OPS:
            return f"{node.op} node {node.name}"
        if node.target is invoke_subgraph:
            return "invoke_subgraph (graph-safe RNG threading)"
        if getattr(node.target, "namespace", None) == "_c10d_functional":
            return "collectives (dead wait_tensor pruning)"
        if tp._is_backward_state(node):
            return "backward state"
    for node in saved:
        if tp.is_opaque_node(node):
            return f"opaque saved value {node.name}"
        if node.meta.get("saved_tensor_with_no_vc_check", False):
            return f"{node.name} saved without version-counter checks"
    return None


class _Joint:
    """The joint graph's nodes and the extra input each replayed random op reads (its RNG state)."""

    def __init__(self, joint_module: fx.GraphModule, replays: dict[fx.Node, fx.Node]) -> None:
        self.nodes = list(joint_module.graph.nodes)
        self.replays = replays
        self.impure = impurity()

    def inputs_of(self, node: fx.Node) -> list[fx.Node]:
        state = self.replays.get(node)
        return node.all_input_nodes if state is None else [state, *node.all_input_nodes]

    def kept(self, inputs: Sequence[fx.Node], outputs: Sequence[Any], subgraph: str) -> list[fx.Node]:
        return kept_nodes(self.nodes, inputs, outputs, subgraph, impure=self.impure, replays=self.replays)

    def autograd_order(self, kept: list[fx.Node], inputs: Sequence[fx.Node], tangents: Sequence[fx.Node],
                       outputs: Sequence[Any]) -> list[fx.Node]:
        """``reordering_to_mimic_autograd_engine``'s order of the backward's nodes: from the first
        node reading a tangent on, each node goes in just after the not yet placed nodes it needs."""
        pos = {n: i for i, n in enumerate(kept)}
        end = len(kept)  # the output node's place
        kept_outputs = [o for o in outputs if isinstance(o, fx.Node)]
        first = None
        for tangent in tangents:
            for user in tangent.users:
                p = pos.get(user, end if user.op == "output" else None)
                if p is not None and (first is None or p < first):
                    first = p
        if first is None:
            return kept  # no node reads a tangent: torch leaves the graph as it is
        copy_ = torch.ops.aten.copy_.default
        groups = [[node] for node in kept[:first] if node.op == "call_function" and node.target is copy_]
        groups += [[node] for node in kept[first:]] + [kept_outputs]
        return just_in_time(groups, self.inputs_of, set(inputs), pos.__getitem__)


def _build(joint: _Joint, inputs: Sequence[fx.Node], body: Sequence[fx.Node], outputs: Sequence[Any],
           descs: Sequence[Any], *, backward: bool) -> fx.Graph:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        p = graph.placeholder(node.name)
        p.meta = copy.copy(node.meta)
        env[node] = p
    run_with = torch._prims.rng_prims.run_with_rng_state
    for node in body:
        state = joint.replays.get(node)
        if state is None:
            new = graph.node_copy(node, env.__getitem__)
        else:  # replayed: the op runs under the state saved for it
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            new = graph.create_node("call_function", run_with, (env[state], cast(Any, node.target), *args), kwargs,
                                    node.name, node.type)
            new.meta = copy.copy(node.meta)
        if backward and node.op in ("call_function", "get_attr"):
            new.meta["autograd_backward"] = True
        env[node] = new
    values = [env[o] if isinstance(o, fx.Node) else o for o in outputs]
    out = graph.output(tuple(values))
    out.meta["desc"] = list(descs)
    out.meta["output_stack_traces"] = [v.meta.get("stack_trace") if isinstance(v, fx.Node) else None
                                       for v in values]
    return graph


def _raise_getitems(graph: fx.Graph) -> None:
    """``raise_getitems`` without its recompile: each getitem just after the value it reads."""
    for node in reversed(list(graph.find_nodes(op="call_function", target=operator.getitem))):
        node.all_input_nodes[0].append(node)


def _with_symbol_bindings(joint_module: fx.GraphModule, syms: list[fx.Node], values: list[fx.Node],
                          tangents: list[fx.Node]) -> list[fx.Node]:
    """The saved symbolic ints with, first, the nodes binding every symbol the backward's inputs
    use (as ``_extract_fwd_bwd_modules`` orders them)."""
    saved_symbols: set[Any] = set()
    binding: list[fx.Node] = []
    derived: list[fx.Node] = []
    for node in syms:
        symbol = is_symbol_binding_fx_node(node)
        if symbol:
            saved_symbols.add(symbol)
            binding.append(node)
        else:
            derived.append(node)
    bindings = None
    for node in itertools.chain(derived, values, tangents):
        if "val" not in node.meta:
            continue
        new = free_symbols(node.meta["val"]) - saved_symbols
        if new and bindings is None:
            bindings = find_symbol_binding_fx_nodes(joint_module.graph)
        for s in sorted(new, key=lambda s: s.name):
            if s in bindings:  # type: ignore[operator]
                binding.append(bindings[s])  # type: ignore[index]
        saved_symbols |= new
    return binding + derived


def extract_fwd_bwd(joint_module: fx.GraphModule, values: list[fx.Node], syms: list[fx.Node], *,
                    num_fwd_outputs: int, replays: dict[fx.Node, fx.Node] | None = None,
                    ) -> tuple[fx.GraphModule, fx.GraphModule] | None:
    """Forward and backward modules saving ``values`` (tensors) and ``syms`` (symbolic ints), as
    torch's lowering makes them; ``replays`` maps each recomputed random op to the RNG state node
    it replays (the backward runs it under ``run_with_rng_state``, the forward under
    ``run_and_save_rng_state``). None where torch's extraction is needed (``unsupported``)."""
    replays = replays or {}
    if unsupported(joint_module, itertools.chain(values, syms)) is not None:
        return None
    try:
        return _extract(joint_module, list(values), list(syms), num_fwd_outputs, replays)
    except Unsupported:
        return None


def _extract(joint_module: fx.GraphModule, values: list[fx.Node], syms: list[fx.Node],
             num_fwd_outputs: int, replays: dict[fx.Node, fx.Node]) -> tuple[fx.GraphModule, fx.GraphModule]:
    joint = _Joint(joint_module, replays)
    fwd_outputs, bwd_outputs, fwd_descs, bwd_descs = tp._extract_fwd_bwd_outputs(
        joint_module, num_fwd_outputs=num_fwd_outputs)
    placeholders = [n for n in joint.nodes if n.op == "placeholder"]
    primals = [n for n in placeholders if tp._is_primal(n)]
    tangents = [n for n in placeholders if tp._is_tangent(n)]
    fwd_seeds = [n for n in placeholders if tp._is_fwd_seed_offset(n)]
    bwd_seeds = [n for n in placeholders if tp._is_bwd_seed_offset(n)]

    # saved values the backward does not read are not saved
    first_inputs = syms + values + tangents + bwd_seeds
    body = joint.kept(first_inputs, bwd_outputs, "backward")
    read = {o for o in bwd_outputs if isinstance(o, fx.Node)}
    for node in body:
        read.update(joint.inputs_of(node))
    values = [n for n in values if n in read]
    syms = _with_symbol_bindings(joint_module, [n for n in syms if n in read], values, tangents)

    fwd_inputs = primals + fwd_seeds
    saved = values + syms
    fwd_out = list(fwd_outputs) + saved
    fwd_descs = list(fwd_descs) + [SavedForBackwardsAOTOutput(i) for i in range(len(saved))]
    fwd_graph = _build(joint, fwd_inputs, joint.kept(fwd_inputs, fwd_out, "forward"), fwd_out, fwd_descs,
                       backward=False)
    fuse_rng_replay_graph(fwd_graph)
    _raise_getitems(fwd_graph)

    bwd_inputs = syms + values + tangents + bwd_seeds
    if bwd_inputs != first_inputs:  # else the backward's nodes are those found above
        body = joint.kept(bwd_inputs, bwd_outputs, "backward")
    bwd_graph = _build(joint, bwd_inputs, joint.autograd_order(body, bwd_inputs, tangents, bwd_outputs),
                       bwd_outputs, bwd_descs, backward=True)
    _raise_getitems(bwd_graph)
    return _make_graph_module(joint_module, fwd_graph), _make_graph_module(joint_module, bwd_graph)
