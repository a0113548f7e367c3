"""torch's own memory-budget settings, read as torch's partitioner reads them.

A user who swaps torch's partitioner for opt-remat keeps their settings: with no ``budget=``,
the budget is, in increasing precedence, ``torch._functorch.config.activation_memory_budget``,
a legacy ``node.meta["memory_budget"]``, and ``torch.autograd.graph.region_activation_memory_budget``
annotations. A region budget must be single per graph and cover the whole forward (torch's rules,
with torch's errors). 1.0 is torch's default and its runtime-optimized plan: opt-remat then makes
its own trade-off, as with no budget at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp

try:  # region budgets are new in torch 2.13
    from torch.fx.traceback import _get_memory_budget_annotation
except ImportError:  # pragma: no cover - older torch has no region budgets
    def _get_memory_budget_annotation(node: fx.Node) -> float | None:
        return None

GLOBAL_SETTING = "torch._functorch.config.activation_memory_budget"
REGION_SETTING = "torch.autograd.graph.region_activation_memory_budget"


@dataclass(frozen=True)
class TorchBudget:
    fraction: float
    source: str  # the setting it came from, for messages


def _graphs(joint_module: fx.GraphModule) -> list[fx.Graph]:
    """The joint graph and the bodies of its higher-order ops (a region must cover them too)."""
    return [joint_module.graph] + [sub.graph for _, sub in joint_module.named_modules()
                                   if isinstance(sub, fx.GraphModule) and sub is not joint_module]


def region_budget(joint_module: fx.GraphModule, info: tp.NodeInfo) -> float | None:
    """The one region budget of this graph, or None; torch's errors when it is not one budget
    over the whole forward."""
    budgets: set[float] = set()
    unannotated: list[str] = []
    for graph in _graphs(joint_module):
        for node in graph.nodes:
            budget = _get_memory_budget_annotation(node)
            if budget is not None:
                budgets.add(budget)
            elif node.op == "call_function" and (graph is not joint_module.graph or info.is_required_fw(node)):
                unannotated.append(node.name)
    if len(budgets) > 1:
        raise RuntimeError(
            f"{REGION_SETTING}: conflicting budgets within a single joint graph (including nested "
            f"subgraphs): {sorted(budgets)}. opt-remat, like torch, applies one budget per graph: "
            "separate regions that need different budgets with a graph break "
            "(torch._dynamo.graph_break()).")
    if budgets and unannotated:
        raise RuntimeError(
            f"{REGION_SETTING}: must cover the entire forward of a graph (including higher-order op "
            f"bodies), but {len(unannotated)} forward op(s) are unannotated: {unannotated[:10]}. Wrap "
            "the whole forward in one region, or use a graph break to scope different budgets to "
            "different graphs (a graph break inside the region also leaves ops unannotated).")
    return next(iter(budgets)) if budgets else None


def torch_budget(joint_module: fx.GraphModule, info: tp.NodeInfo) -> TorchBudget | None:
    """The budget torch's partitioner would apply to this graph; None for torch's default (1.0)."""
    found = TorchBudget(float(functorch_config.activation_memory_budget), GLOBAL_SETTING)
    for node in joint_module.graph.nodes:
        if isinstance(node.meta.get("memory_budget"), float):  # the legacy marker: first one wins
            found = TorchBudget(node.meta["memory_budget"], 'node.meta["memory_budget"]')
            break
    region = region_budget(joint_module, info)
    if region is not None:
        found = TorchBudget(float(region), REGION_SETTING)
    return None if found.fraction >= 1.0 else found


def torch_budget_is_set(joint_module: fx.GraphModule) -> bool:
    """Whether any torch budget setting differs from torch's default (for the explicit-budget note)."""
    if float(functorch_config.activation_memory_budget) != 1.0:
        return True
    return any(_get_memory_budget_annotation(n) is not None or isinstance(n.meta.get("memory_budget"), float)
               for g in _graphs(joint_module) for n in g.nodes)
