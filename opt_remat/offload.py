"""Offloading saved values to host memory, lowered by torch's own pass.

torch 2.13 ships the lowering (``torch._functorch._activation_offloading``): forward nodes marked
``meta["should_offload"]`` that the forward saves get a copy to the CPU after their last forward
use and a copy back before their first backward use (synchronous ``device_put``, or with
``activation_offload_separate_stream`` the async ``ao.offload``/``ao.reload`` ops, and per torch's
config ``activation_offload_sink_wait`` / ``activation_reload_prefetch``). opt-remat marks the
values its plan offloads (``Plan.offloaded``) and runs that pass on its lowered graphs; it does not
copy it. What the pass refuses (``can_offload``: views, getitems, non-contiguous tensors, the
graph's outputs, static inputs) is known when the problem is built (``offload_ban``), so a plan
never chooses it.

What asks for offload: SAC policies' ``CheckpointPolicy.MUST_CPU_OFFLOAD`` (saved, then offloaded)
and ``PREFER_CPU_OFFLOAD`` (never recomputed; offloaded with ``offload=True``), and, with
``torch._functorch.config.enable_activation_offloading`` on, ``should_offload`` marks already on
the joint graph (as torch's partitioner honours them).
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp
from torch.utils._ordered_set import OrderedSet
from torch.utils.checkpoint import CheckpointPolicy

from solvers import Plan, Problem, Role
from solvers.offload import HostLink, offload_errors

from .costs import DeviceProfile, get_profile
from .errors import OffloadError

MARK = "should_offload"  # torch's mark on a forward node to offload
OFFLOAD_TAGS = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)


def marks_honoured() -> bool:
    """Whether ``should_offload`` marks on a joint graph ask for offload (torch's flag)."""
    return bool(functorch_config.enable_activation_offloading)


def offload_ban(node: fx.Node, role: Role, storage: str | None, *, forward_outputs: set[fx.Node],
                op_types: tp.OpTypes) -> str:
    """Why torch's pass would not offload ``node`` if a plan saved it ("" if it would): the
    checks of its ``can_offload`` on the joint graph, plus graph inputs (the caller holds them;
    the async pass would free the caller's tensor) and opt-remat's RNG states."""
    if role is Role.INPUT:
        return "a graph input (the caller holds it)"
    if role is Role.BACKWARD:
        return "computed in the backward"
    if node.op != "call_function":
        return "not an op's result"
    if node in forward_outputs:
        return "a forward output (returned to the caller)"
    if node.target is operator.getitem:
        return "a getitem (torch's pass refuses them)"
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return "not a tensor"
    if storage is not None or op_types.is_view(node):
        return "a view (torch's pass refuses them)"
    if not val.is_contiguous():
        return "non-contiguous (torch's pass refuses it)"
    if not isinstance(node.target, torch._ops.OpOverload) or node.target.namespace not in ("aten", "prims"):
        return "not an aten op"
    return ""


def host_link(device: str | DeviceProfile | Mapping[str, Any], *, host_bytes: int | None = None,
              min_bytes: int = 1 << 20) -> HostLink:
    """The offload model's link for a device profile (its ``host_bandwidth`` both ways)."""
    profile = get_profile(device)
    if profile.host_bandwidth <= 0:
        raise ValueError(f"device profile {profile.name!r} has no host_bandwidth: give one in bytes/s "
                         "(e.g. {'peak_flops': ..., 'bandwidth': ..., 'host_bandwidth': 25e9})")
    return HostLink(profile.host_bandwidth, profile.host_bandwidth, host_bytes, min_bytes)


def must_offload_values(joint_module: fx.GraphModule) -> list[str]:
    """Values that must be saved then offloaded: MUST_CPU_OFFLOAD tags, and ``should_offload``
    marks while torch's flag is on."""
    marks = marks_honoured()
    return [n.name for n in joint_module.graph.nodes
            if n.meta.get("recompute") == CheckpointPolicy.MUST_CPU_OFFLOAD or (marks and n.meta.get(MARK))]


def offload_request(node: fx.Node) -> str | None:
    """A ban reason from recomputation for a value asked to be offloaded (None: not asked)."""
    tag = node.meta.get("recompute")
    if tag in OFFLOAD_TAGS:
        return f"tagged {tag.name}"
    if node.meta.get(MARK) and marks_honoured():
        return "marked should_offload"
    return None


def with_offloads(problem: Problem, plan: Plan, joint_module: fx.GraphModule, *, offload: bool = False,
                  extra: Iterable[str] = ()) -> Plan:
    """``plan`` with what is asked to be offloaded and it saves: MUST_CPU_OFFLOAD values and honoured
    marks; PREFER_CPU_OFFLOAD values too with ``offload``; ``extra`` (a planner's choice). A value
    asked for that cannot be offloaded stays saved on the device, with one warning."""
    asked = set(must_offload_values(joint_module)) | set(extra)
    if offload:
        asked |= {n.name for n in joint_module.graph.nodes
                  if n.meta.get("recompute") == CheckpointPolicy.PREFER_CPU_OFFLOAD}
    chosen = {v for v in asked if v in plan.saved}
    refused = {v: problem.by_name[v].offload_ban for v in chosen if problem.by_name[v].offload_ban}
    chosen -= set(refused)
    shared = _shared_storages(problem, plan.saved, chosen)
    refused.update({v: "its storage holds another saved value" for v in shared})
    chosen -= shared
    if refused:
        listed = ", ".join(f"{v} ({why})" for v, why in sorted(refused.items())[:5])
        warnings.warn(f"opt-remat: not offloaded, kept on the device: {listed}", stacklevel=3)
    if not chosen and not plan.offloaded:
        return plan
    return dataclasses.replace(plan, offloaded=frozenset(chosen))


def _shared_storages(problem: Problem, saved: Iterable[str], chosen: set[str]) -> set[str]:
    members: dict[str, int] = {}
    for v in saved:
        g = problem.by_name[v].storage_id
        members[g] = members.get(g, 0) + 1
    return {v for v in chosen if members[problem.by_name[v].storage_id] > 1}


def insert_offloads(fw_module: fx.GraphModule, bw_module: fx.GraphModule, problem: Problem, plan: Plan, *,
                    num_fwd_outputs: int) -> None:
    """Mark the forward nodes ``plan.offloaded`` names (and only them) and run torch's offloading
    pass on the lowered graphs, in place; check that it offloaded exactly those values."""
    errors = offload_errors(problem, plan)
    if errors:
        raise OffloadError("opt-remat: the plan offloads what it cannot: " + "; ".join(errors[:5]))
    from torch._functorch._activation_offloading.activation_offloading import (
        enable_activation_offloading,
    )

    for node in fw_module.graph.nodes:
        node.meta.pop(MARK, None)
        if node.name in plan.offloaded:
            node.meta[MARK] = True
    # graph inputs are never offloaded (offload_ban), so torch's static-input check has nothing to add
    enable_activation_offloading(fw_module, bw_module, num_fwd_outputs, OrderedSet())
    done = offloaded_values(fw_module)
    if done != set(plan.offloaded):
        missing = sorted(set(plan.offloaded) - done)
        raise OffloadError(f"opt-remat: torch's offloading pass did not offload {', '.join(missing[:5])} "
                           "(a check in opt_remat.offload.offload_ban is missing: please report it)")
    fw_module.recompile()
    bw_module.recompile()


def offloaded_values(fw_module: fx.GraphModule) -> set[str]:
    """Names of the forward values a lowered forward sends to host memory."""
    return {n.name for n in fw_module.graph.nodes if n.meta.get("saved_for_offloading")}


def offload_ops(module: fx.GraphModule) -> list[str]:
    """Names of the offload / reload ops in a lowered graph (torch names them by the value)."""
    prefixes = ("cpu_offload_", "gpu_reload_", "async_cpu_offload_", "async_gpu_reload_")
    return [n.name for n in module.graph.nodes if n.op == "call_function" and n.name.startswith(prefixes)]
