"""What torch's own partitioner would save on a prepared joint graph, as a set of node names.

Used as the top anchor of fractional budgets (torch's ``activation_memory_budget`` = 1.0 is its
runtime-optimized min-cut) and by the ``torch`` baseline.
"""

from __future__ import annotations

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp


def _annotate_dist_from_bw(joint_module: fx.GraphModule, info: tp.NodeInfo) -> None:
    # torch's solve_min_cut reads node.dist_from_bw, set in min_cut_rematerialization_partition
    for node in reversed(joint_module.graph.nodes):
        if node.op == "output" or info.is_required_fw(node):
            node.dist_from_bw = int(1e9)
            if node.op != "output":
                for user in node.users:
                    node.dist_from_bw = min(node.dist_from_bw, user.dist_from_bw + 1)
        else:
            node.dist_from_bw = 0


def torch_saved_values(joint_module: fx.GraphModule, info: tp.NodeInfo,
                       memory_budget: float = 1.0) -> set[str]:
    """Names torch's ``choose_saved_values_set`` picks at ``activation_memory_budget``."""
    _annotate_dist_from_bw(joint_module, info)
    with functorch_config.patch(activation_memory_budget=memory_budget):
        saved = tp.choose_saved_values_set(joint_module.graph, info, memory_budget=memory_budget)
    return {n.name for n in saved}


def torch_runtime_optimized_saved(joint_module: fx.GraphModule, info: tp.NodeInfo) -> set[str]:
    """torch's default min-cut (its budget 1.0 plan)."""
    return torch_saved_values(joint_module, info, 1.0)
