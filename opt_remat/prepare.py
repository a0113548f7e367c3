"""Stage 1.5: the clean-ups torch's partitioner applies to a joint graph before deciding, made cheap.

``prepare_joint`` gives the graph torch's ``min_cut_rematerialization_partition`` decides on (DCE,
CSE, tag clean-up, MUST_SAVE tags), but edits it in place: torch's CSE (``fx_graph_cse``) copies
every node into a new graph and assigning it recompiles the module, which nothing here runs. The
CSE below keys each op by its target and arguments, with torch's rules for what is never merged,
and ``classify`` computes torch's ``NodeInfo`` without copying the forward out of the joint graph
(``kept_nodes``: what torch's extraction keeps of it, which the lowering in ``extract`` reuses).
``tests/test_extract.py`` checks both against torch's.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp
from torch._functorch.compile_utils import get_aten_target, rand_ops
from torch._inductor.pattern_matcher import compute_mutation_region_ids
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._ordered_set import OrderedSet

from .errors import Unsupported
from .graph_rules import impurity, kept_nodes
from .rng_replay import insert_rng_states


def prepare_joint(joint_module: fx.GraphModule, *, rng_replay: bool = True) -> fx.GraphModule:
    """The clean-ups torch's partitioner applies before deciding: DCE, CSE, tag clean-up and the
    MUST_SAVE tags on collectives, effectful ops and backward-mutation sources. With ``rng_replay``
    a node capturing the RNG state goes before each random op (``opt_remat.rng_replay``), which
    makes the op recomputable at the price of saving that state. The graph is edited in place and
    the module not recompiled (its code stays the same function until lowering)."""
    eliminate_dead_code(joint_module)
    if functorch_config.cse:
        cse_in_place(joint_module.graph)
    if tp.has_recomputable_ops(joint_module):
        joint_module = tp.cleanup_recompute_tags(joint_module, is_default_partition=False)
    if not functorch_config.unsafe_allow_optimization_of_collectives:
        tp.force_save_collectives(joint_module)
    tp.force_save_effectful_ops(joint_module)
    tp.force_save_bw_mutation_src(joint_module)
    if rng_replay:
        insert_rng_states(joint_module)
    return joint_module


def eliminate_dead_code(joint_module: fx.GraphModule) -> None:
    """``Graph.eliminate_dead_code`` with each op's purity looked up once (torch's, where the graph
    has subgraphs, which it cleans too)."""
    graph = joint_module.graph
    if any(isinstance(getattr(joint_module, str(n.target), None), fx.GraphModule)
           for n in graph.find_nodes(op="get_attr")):
        graph.eliminate_dead_code()
        return
    impure = impurity()
    for node in reversed(graph.nodes):
        if not node.users and node.op != "placeholder" and node.op != "output" and not impure(node):
            graph.erase_node(node)


_SEQUENCES = (tuple, list, immutable_list)
_MAPPINGS = (dict, immutable_dict)
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _flatten(arg: Any, leaves: list[Any]) -> Any:
    """pytree's leaves of a node's arguments (symbolic ints by their symbolic node, as
    ``fx_graph_cse`` substitutes them) and a spec of their structure, for the usual containers."""
    kind = type(arg)
    if kind in _SEQUENCES:
        return (kind, None, tuple(_flatten(a, leaves) for a in arg))
    if kind in _MAPPINGS:
        return (kind, tuple(arg), tuple(_flatten(v, leaves) for v in arg.values()))
    if kind in pytree.SUPPORTED_NODES or pytree.is_namedtuple_instance(arg):
        flat, spec = pytree.tree_flatten(arg)  # other containers: pytree itself
        for a in flat:
            leaves.append(a.node if isinstance(a, _SYM) else a)
        return spec
    leaves.append(arg.node if isinstance(arg, _SYM) else arg)
    return None


def _checkable(node: fx.Node) -> bool:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    try:
        val.untyped_storage()
    except NotImplementedError:
        return False
    return True


def cse_in_place(graph: fx.Graph) -> None:
    """torch's ``fx_graph_cse`` without the copy: a later op equal to an earlier one (same target,
    same arguments, same mutation region) is replaced by it. Never merged, as in torch: random ops,
    ``empty``, values aliasing a graph output, unbacked symbols, and ops whose key's hash collides
    with an earlier different op's."""
    compute_mutation_region_ids(graph)
    output = graph.find_nodes(op="output")[0]
    output_storages = {StorageWeakRef(n.meta["val"].untyped_storage())
                       for n in output.all_input_nodes if _checkable(n)}
    hash_env: dict[Any, fx.Node] = {}
    token_map: dict[Any, Any] = {}
    empty = torch.ops.aten.empty
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue  # placeholders, get_attr and the output stay as they are
        aten_target = get_aten_target(node)
        if aten_target in rand_ops or aten_target is empty:
            continue
        val = node.meta.get("val")
        if isinstance(val, sympy.Symbol) and free_unbacked_symbols(val):
            continue
        if output_storages and _checkable(node) and StorageWeakRef(val.untyped_storage()) in output_storages:
            continue
        args: list[Any] = []
        kwargs: list[Any] = []
        token = (_flatten(node.args, args), args, _flatten(node.kwargs, kwargs), kwargs)
        # torch's key, collisions included (hash(-1) == hash(-2): such ops are not merged there)
        hash_val = (node.target, hash((tuple((a, type(a)) for a in args), tuple((a, type(a)) for a in kwargs))))
        known = hash_val in hash_env
        if known and token_map[hash_val] == token:
            prev = hash_env[hash_val]
            if prev.meta["mutation_region_id"] == node.meta["mutation_region_id"]:
                node.replace_all_uses_with(prev)
                graph.erase_node(node)
                continue
            known = False  # past a mutation: later equal ops merge into this one
        if not known:
            hash_env[hash_val] = node
            token_map[hash_val] = token
    _users_in_graph_order(graph)


def _users_in_graph_order(graph: fx.Graph) -> None:
    """Each node's users in graph order, as in the copy torch's CSE makes (merging appended the
    merged node's users; torch's ``classify_nodes`` and min-cut iterate users in this order)."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        users = node.users
        if len(users) > 1:
            order = [position[u] for u in users]
            if any(a > b for a, b in zip(order, order[1:])):
                ordered = sorted(users, key=position.__getitem__)
                users.clear()
                users.update(dict.fromkeys(ordered))


def classify(joint_module: fx.GraphModule, num_fwd_outputs: int,
             static_lifetime_input_indices: list[int] | None = None) -> tp.NodeInfo:
    """torch's ``classify_nodes``: the forward is found on the joint graph (``kept_nodes``) instead
    of copied out of it."""
    graph = joint_module.graph
    nodes = list(graph.nodes)
    required_bw: OrderedSet[fx.Node] = OrderedSet()
    for node in nodes:
        if (node.op == "placeholder" and "tangents" in node.target) or tp._must_be_in_backward(node):
            required_bw.add(node)
        if node in required_bw:
            required_bw.update(node.users)
    primals = [n for n in nodes if tp._is_primal(n)]
    inputs = primals + [n for n in nodes if tp._is_fwd_seed_offset(n)]
    fwd_outputs, bwd_outputs, _, _ = tp._extract_fwd_bwd_outputs(joint_module, num_fwd_outputs=num_fwd_outputs)
    tangents_closure = required_bw.copy()
    required_bw.update(o for o in bwd_outputs if o is not None and o.op != "output")
    required_fw: OrderedSet[fx.Node] = OrderedSet(inputs)
    try:
        required_fw.update(kept_nodes(nodes, inputs, fwd_outputs, "forward"))
    except Unsupported:  # a forward output torch substitutes (an input's mutation in the backward)
        return tp.classify_nodes(joint_module, static_lifetime_input_indices or [], num_fwd_outputs)
    unclaimed = OrderedSet(n for n in nodes if n not in required_fw and n not in required_bw)
    static = set(static_lifetime_input_indices or ())
    static_nodes = OrderedSet(p for i, p in enumerate(primals) if i in static)
    fw_order: dict[fx.Node, int] = {}
    for node in nodes:
        if node in required_fw:
            fw_order[node] = len(fw_order)
    return tp.NodeInfo(inputs, required_fw, required_bw, tangents_closure, unclaimed, fw_order, static_nodes)
