"""Offload in a run's reports: a plan's offloaded values and bytes, the host memory they use, the
exposed transfer time and the predicted added step time (recompute + exposed transfer), from the
model of ``solvers.offload``; and its curve with the offload applied and the transfers in flight as
a kind of bytes (``MemoryKind.IN_FLIGHT``). No torch here."""

from __future__ import annotations

from typing import Any, Mapping

from solvers import Plan, Problem
from solvers.budget import format_bytes, format_seconds
from solvers.memory_kinds import MemoryKind
from solvers.liveness import MemoryCurve
from solvers.offload import HostLink, OffloadTimeline, offload_timeline
from .curves import TOTAL, Curve

# the figures a record (``Record.offload``), a plan file entry (``offload``) and the reports hold
FIELDS = ("offloaded", "host_bytes", "exposed_transfer_s", "added_time_s")


def offload_figures(problem: Problem, plan: Plan, link: HostLink, curve: Curve
                    ) -> tuple[dict[str, Any], OffloadTimeline]:
    """The model's figures of ``plan`` on ``link`` (``FIELDS``), and its timeline; ``curve``: the
    plan's step as the run simulated it (not simulated again)."""
    names = [problem.nodes[i].name for i in curve.values]
    steps = tuple(("forward" if k == "f" else "backward", v, b)
                  for k, v, b in zip(curve.phases, names, curve.live[TOTAL]))
    timeline = offload_timeline(problem, plan.saved, plan.offloaded, link, MemoryCurve(steps, curve.peak, "", ""))
    figures = {"offloaded": len(plan.offloaded), "host_bytes": timeline.host_bytes,
               "exposed_transfer_s": timeline.exposed_s, "added_time_s": plan.recompute_cost + timeline.exposed_s}
    return figures, timeline


def with_transfers(curve: Curve, timeline: OffloadTimeline) -> Curve:
    """``curve`` (the plan's simulated step, all on the device) with the offloaded values off the
    device as the timeline says, and the bytes in flight as their own kind."""
    if len(timeline.adjust) != len(curve.live[TOTAL]):
        raise ValueError("opt-remat internal error: the offload timeline and the curve differ in steps")
    live = {k: list(v) for k, v in curve.live.items()}
    live[TOTAL] = [b + a for b, a in zip(curve.live[TOTAL], timeline.adjust)]
    live[MemoryKind.IN_FLIGHT.value] = list(timeline.in_flight)
    return Curve(curve.values, live, curve.phases, curve.live_count, curve.top, curve.peak_gradients,
                 dict(curve.extra))


def in_flight_traces(curve: Curve, name: str, color: str, scale: float) -> list[dict[str, Any]]:
    """The HTML memory timeline's trace of a plan's bytes in flight to or from host memory (none
    without transfers)."""
    flight = curve.live.get(MemoryKind.IN_FLIGHT.value)
    if not flight or not any(flight):
        return []
    return [{"type": "scatter", "mode": "lines", "name": f"{name}: {MemoryKind.IN_FLIGHT.value}",
             "x": list(range(len(flight))), "y": [b / scale for b in flight],
             "line": {"color": color, "width": 1, "dash": "dot", "shape": "hv"},
             "hovertemplate": f"{MemoryKind.IN_FLIGHT.value}: %{{y:.3g}}<extra></extra>"}]


def offload_columns(rec: Any, unit: str | None) -> dict[str, str]:
    """The summary table's offload columns of a record (``Record.offload``)."""
    fig = rec.offload
    if not fig:
        return {"offloaded": "-", "exposed": "-", "added time": format_seconds(rec.recompute_cost)}
    return {"offloaded": f"{fig['offloaded']}: {format_bytes(fig['host_bytes'], unit)}",
            "exposed": format_seconds(fig["exposed_transfer_s"]), "added time": format_seconds(fig["added_time_s"])}


def offload_text(figures: Mapping[str, Any] | None) -> str:
    """One line for ``opt-remat show`` and the progress lines ("" without offload)."""
    if not figures or not figures.get("offloaded"):
        return ""
    return (f"{figures['offloaded']} values offloaded, {format_bytes(figures['host_bytes'])} in host memory, "
            f"exposed transfer "
            f"{format_seconds(figures['exposed_transfer_s'])}, added step time "
            f"{format_seconds(figures['added_time_s'])}")
