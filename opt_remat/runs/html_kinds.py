"""The HTML report's memory by kind: per distinct plan whose curve is split by kind (every run's
are: activations, temporaries, gradients; under a ``training`` set-up also what the rank holds
besides the graph), a stacked timeline of the kinds over the step, the device's bytes as a line
where the budget is a device's. No torch here."""

from __future__ import annotations

from typing import Any

from solvers.budget import byte_axis, format_bytes
from solvers.memory_kinds import MemoryKind

from .html_data import PlanView, RunReport

# one colour per kind, the graph's warm, the rank's cool
KIND_COLORS = {
    MemoryKind.ACTIVATIONS.value: "#e45756", MemoryKind.TEMPORARIES.value: "#f58518",
    MemoryKind.GRADIENTS.value: "#eeca3b", MemoryKind.SHARDED_PARAMS.value: "#4c78a8",
    MemoryKind.GATHERED_PARAMS.value: "#72b7b2", MemoryKind.SHARDED_GRADS.value: "#54a24b",
    MemoryKind.OPTIMIZER.value: "#b279a2", MemoryKind.ALL_GATHER.value: "#9d755d",
    MemoryKind.REDUCE_SCATTER.value: "#bab0ac", MemoryKind.HOST.value: "#d6d6d6",
    MemoryKind.IN_FLIGHT.value: "#ff9da6",
}


def kind_figures(report: RunReport) -> list[dict[str, Any]]:
    """``{id, title, data, layout}`` per distinct plan with a split curve, in the order of the
    plans table; the solvers and budgets that share the plan are named together."""
    plans: dict[int, list[PlanView]] = {}
    for view in report.plans:
        if report.curves[view.curve].kinds:
            plans.setdefault(view.curve, []).append(view)
    if not plans:
        return []
    unit, scale = byte_axis(report.curves[ci].peak for ci in plans)
    out = []
    for i, (ci, views) in enumerate(plans.items()):
        curve = report.curves[ci]
        x = list(range(len(curve.values)))
        data = [{"type": "scatter", "mode": "lines", "name": kind, "stackgroup": "kinds",
                 "x": x, "y": [b / scale for b in curve.live[kind]], "line": {"width": 0.5, "shape": "hv"},
                 "fillcolor": KIND_COLORS.get(kind), "marker": {"color": KIND_COLORS.get(kind)},
                 "hovertemplate": f"{kind}: %{{y:.3f}} {unit}<extra></extra>"} for kind in curve.kinds]
        shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": curve.forward_steps - 0.5,
                   "x1": curve.forward_steps - 0.5, "y0": 0, "y1": 1,
                   "line": {"color": "#444", "dash": "dot", "width": 1}}]
        device = next((v.record.device_memory for v in views if v.record.device_memory is not None), None)
        if device is not None:
            shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": device / scale,
                           "y1": device / scale, "line": {"color": "red", "dash": "dash", "width": 1}})
        who = " = ".join(f"{v.record.solver} at {v.record.budget}" for v in views)
        title = (f"{who}: memory by kind (peak {format_bytes(curve.peak)}"
                 + (f" of the device's {format_bytes(device)}" if device is not None else "") + ")")
        layout = {"template": "plotly_white", "title": {"text": title, "font": {"size": 14}}, "hovermode": "x unified",
                  "legend": {"orientation": "h", "y": -0.22, "x": 0, "font": {"size": 11}},
                  "xaxis": {"title": {"text": "step (forward, then the backward after the dotted line)"}},
                  "yaxis": {"title": {"text": f"bytes ({unit})"}}, "shapes": shapes,
                  "margin": {"t": 50, "l": 70, "r": 20, "b": 50}, "height": 380}
        out.append({"id": f"fig-kinds-{i}", "title": title, "data": data, "layout": layout})
    return out
