"""Stage 4: a plan becomes the forward and backward GraphModules that AOTAutograd runs.

``opt_remat.extract`` makes them in one copy of each graph; where it does not apply (see
``extract.unsupported``), or with ``fast=False``, this uses torch's own extraction
(``_extract_fwd_bwd_modules``: saved tensors, then saved symbolic ints, as the forward's extra
outputs in the order AOTAutograd expects) and torch's reordering of the backward, which places each
recomputed value just before its first use so it is not alive longer
than needed.
"""

from __future__ import annotations

import torch.fx as fx
from torch._functorch import partitioners as tp
from torch.fx.experimental.proxy_tensor import is_sym_node
from torch.utils._ordered_set import OrderedSet

from solvers import Plan, Problem

from .extract import extract_fwd_bwd
from .offload import insert_offloads
from .rng_replay import STATE_META, fuse_rng_replay, route_replays, state_nodes


def saved_nodes(joint_module: fx.GraphModule, plan: Plan) -> tuple[list[fx.Node], list[fx.Node]]:
    """The plan's saved values as FX nodes in graph order: (tensors and others, symbolic ints)."""
    values: list[fx.Node] = []
    syms: list[fx.Node] = []
    for node in joint_module.graph.nodes:
        if node.name not in plan.saved or node.op == "get_attr":
            continue  # get_attr nodes are copied into both graphs, never passed between them
        (syms if is_sym_node(node) else values).append(node)
    return values, syms


def lower_plan(
    joint_module: fx.GraphModule,
    plan: Plan,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_nodes: OrderedSet[fx.Node] | None = None,
    fast: bool = True,
    problem: Problem | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules that save ``plan.saved`` and recompute the rest just in time;
    random ops the plan recomputes replay the RNG state it saves for them; ``plan.offloaded`` goes
    to host memory by torch's pass (``opt_remat.offload``; ``problem`` is then required).
    ``fast=False``: torch's extraction, which the fast path must match."""
    fw_module, bw_module = _lower(joint_module, plan, num_fwd_outputs=num_fwd_outputs,
                                  static_lifetime_input_nodes=static_lifetime_input_nodes, fast=fast)
    if plan.offloaded:
        if problem is None:
            raise ValueError("lower_plan: a plan with offloaded values needs problem= (its offload bans)")
        insert_offloads(fw_module, bw_module, problem, plan, num_fwd_outputs=num_fwd_outputs)
    return fw_module, bw_module


def _lower(joint_module: fx.GraphModule, plan: Plan, *, num_fwd_outputs: int,
           static_lifetime_input_nodes: OrderedSet[fx.Node] | None,
           fast: bool) -> tuple[fx.GraphModule, fx.GraphModule]:
    if fast:
        values, syms = saved_nodes(joint_module, plan)
        saved, recomputed = set(plan.saved), set(plan.recomputed)
        by_name = {n.name: n for n in joint_module.graph.nodes}
        replays = {by_name[s.meta[STATE_META]]: s for s in state_nodes(joint_module.graph)
                   if s.meta[STATE_META] in recomputed and s.name in saved}
        modules = extract_fwd_bwd(joint_module, values, syms, num_fwd_outputs=num_fwd_outputs, replays=replays)
        if modules is not None:
            return modules
    routed = route_replays(joint_module, set(plan.saved), set(plan.recomputed))
    if routed is not joint_module and static_lifetime_input_nodes is not None:
        by_name = {n.name: n for n in routed.graph.nodes}  # the same inputs, in the copy
        static_lifetime_input_nodes = OrderedSet(by_name[n.name] for n in static_lifetime_input_nodes)
    joint_module = routed
    values, syms = saved_nodes(joint_module, plan)
    fw_module, bw_module = tp._extract_fwd_bwd_modules(
        joint_module,
        values,
        saved_sym_nodes=syms,
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=static_lifetime_input_nodes,
    )
    fw_module = fuse_rng_replay(fw_module)
    bw_module = tp.reordering_to_mimic_autograd_engine(bw_module)
    fw_module = tp.raise_getitems(fw_module)
    bw_module = tp.raise_getitems(bw_module)
    fw_module = tp.thread_graphsafe_rng_from_hops(fw_module, is_backward=False)
    bw_module = tp.thread_graphsafe_rng_from_hops(bw_module, is_backward=True)
    return fw_module, bw_module
