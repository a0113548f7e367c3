"""The figures of a run's HTML report, as plotly figure specifications (plain JSON-able dicts):
saved memory against recompute cost (Pareto), the live memory of the step per budget (a line per
distinct plan), and solve times. The memory traces' hover texts are built in the page from the
compact curve data (``html_data.Curve``), which keeps the file small on large graphs."""

from __future__ import annotations

from typing import Any, Sequence

from solvers.budget import byte_axis, format_bytes, format_seconds, time_axis

from .curves import Curve
from .html_data import PlanView, RunReport
from .html_kinds import kind_figures
from .offload_view import in_flight_traces, offload_text
from .plots import MIP_SOLVERS
from .results import Record, verified_text

# plotly's default colours, one per solver in the run's order, the same in every figure
PALETTE = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880",
           "#ff97ff", "#fecb52"]
BASE_LAYOUT = {"template": "plotly_white", "hovermode": "closest", "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
               "legend": {"orientation": "h", "y": -0.22, "x": 0, "font": {"size": 11}},
               "hoverlabel": {"align": "left", "font": {"family": "monospace", "size": 11}}}


def solver_colors(records: Sequence[Record]) -> dict[str, str]:
    order: list[str] = []
    for rec in records:
        if rec.solver not in order:
            order.append(rec.solver)
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(order)}


def figures(report: RunReport) -> list[dict[str, Any]]:
    """Every figure of the page: ``{id, title, data, layout}`` each, in page order."""
    colors = solver_colors(report.records)
    return [pareto_figure(report, colors), *memory_figures(report, colors), *kind_figures(report),
            solve_time_figure(report, colors)]


def _layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    return {**BASE_LAYOUT, "title": {"text": title, "font": {"size": 15}}, "xaxis": {"title": {"text": x}},
            "yaxis": {"title": {"text": y}}, **extra}


def plan_hover(rec: Record) -> str:
    """What a point of the Pareto or solve-time plot says about its pair."""
    lines = [f"budget {rec.budget} · {rec.solver} · {rec.status}"]
    if rec.saved_bytes is not None:
        lines.append(f"saved {format_bytes(rec.saved_bytes)} · recompute {format_seconds(rec.recompute_cost)}")
        lines.append(f"step peak {format_bytes(rec.peak_bytes)} (gradients {format_bytes(rec.peak_gradient_bytes)})")
        if offload_text(rec.offload):
            lines.append(_wrap(offload_text(rec.offload)))
    solve = f"solved in {format_seconds(rec.solve_time_s)}"
    if rec.gap is not None:
        solve += f" · gap {rec.gap:.2%}" + ("" if rec.bound is None else f" (bound {rec.bound:.4g})")
    lines.append(solve)
    if rec.verified is not None:
        lines.append(f"gradients {verified_text(rec, notes=False)}")
    if rec.note:
        lines.append(_wrap(rec.note))
    return "<br>".join(lines)


def _wrap(text: str, width: int = 80) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "<br>".join(lines + [line])


def pareto_figure(report: RunReport, colors: dict[str, str]) -> dict[str, Any]:
    """Saved bytes against recompute cost: a line per solver through its budgets, the min-cut hull
    dashed; filled markers for proven optimal plans, a red ring around a failed gradient check."""
    points = [r for r in report.records if r.saved_bytes is not None and r.recompute_cost is not None]
    bunit, bscale = byte_axis([r.saved_bytes for r in points] + [b for b, _ in report.hull])
    tunit, tscale = time_axis([r.recompute_cost for r in points] + [c for _, c in report.hull])
    data: list[dict[str, Any]] = []
    if report.hull:
        data.append({"type": "scatter", "mode": "lines+markers", "name": "min-cut hull",
                     "x": [b / bscale for b, _ in report.hull], "y": [c / tscale for _, c in report.hull],
                     "line": {"color": "rgba(120,120,120,0.35)", "width": 7},
                     "marker": {"size": 5, "color": "#555"},
                     "text": [f"min-cut hull<br>saved {format_bytes(b)} · recompute {format_seconds(c)}"
                              for b, c in report.hull],
                     "hovertemplate": "%{text}<extra></extra>"})
    for solver in colors:
        pts = sorted((r for r in points if r.solver == solver), key=lambda r: (r.saved_bytes, r.recompute_cost))
        if not pts:
            continue
        mip = (pts[0].solver_name or solver) in MIP_SOLVERS
        data.append({"type": "scatter", "mode": "lines+markers", "name": solver + (" (MIP)" if mip else ""),
                     "x": [r.saved_bytes / bscale for r in pts],  # type: ignore[operator]  # points have both
                     "y": [r.recompute_cost / tscale for r in pts],  # type: ignore[operator]
                     "line": {"color": colors[solver], "width": 1.5},
                     "marker": {"color": colors[solver], "size": 11 if mip else 8,
                                "symbol": [("star" if mip else "circle") + ("" if r.status == "optimal" else "-open")
                                           for r in pts], "line": {"width": 1.5, "color": colors[solver]}},
                     "text": [plan_hover(r) for r in pts], "hovertemplate": "%{text}<extra></extra>"})
    failed = [r for r in points if r.verified is False]
    if failed:
        data.append({"type": "scatter", "mode": "markers", "name": "gradient check failed",
                     "x": [r.saved_bytes / bscale for r in failed],  # type: ignore[operator]
                     "y": [r.recompute_cost / tscale for r in failed],  # type: ignore[operator]
                     "marker": {"symbol": "circle-open", "size": 22, "color": "red", "line": {"width": 2}},
                     "text": [plan_hover(r) for r in failed], "hovertemplate": "%{text}<extra></extra>"})
    layout = _layout("saved activation memory vs predicted recompute cost (filled: proven optimal)",
                     f"saved activation memory ({bunit})", f"predicted recompute cost ({tunit})")
    return {"id": "fig-pareto", "title": "Pareto", "data": data, "layout": layout}


def memory_figures(report: RunReport, colors: dict[str, str]) -> list[dict[str, Any]]:
    """Per budget, the simulated live memory over the step: a line per distinct plan (the solvers
    that found it named together), a marker at its peak, a dotted line where its forward ends."""
    unit, scale = byte_axis(c.peak for c in report.curves)
    budgets: dict[str, list[PlanView]] = {}
    for view in report.plans:
        budgets.setdefault(view.record.budget, []).append(view)
    out = []
    for i, (budget, views) in enumerate(budgets.items()):
        groups: dict[int, list[PlanView]] = {}
        for view in views:
            groups.setdefault(view.curve, []).append(view)
        data, shapes = [], []
        for ci, members in groups.items():
            curve = report.curves[ci]
            if not curve.values:
                continue
            color = colors[members[0].record.solver]
            data.append(_memory_trace(curve, ci, " = ".join(v.record.solver for v in members), color, scale, unit))
            data += in_flight_traces(curve, " = ".join(v.record.solver for v in members), color, scale)
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": curve.forward_steps - 0.5,
                           "x1": curve.forward_steps - 0.5, "y0": 0, "y1": 1,
                           "line": {"color": color, "dash": "dot", "width": 1}})
        budget_bytes = views[0].record.budget_bytes
        peak_budget = views[0].record.peak_budget
        device = views[0].record.device_memory
        limits = [f"saved ≤ {format_bytes(budget_bytes)}"] if budget_bytes is not None else []
        if device is not None:  # a device budget: the curves are the rank's whole memory
            limits.insert(0, f"device {format_bytes(device)}")
        elif peak_budget is not None:
            limits.insert(0, f"step peak ≤ {format_bytes(peak_budget)}")
            shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": peak_budget / scale,
                           "y1": peak_budget / scale, "line": {"color": "red", "dash": "dash", "width": 1}})
        title = f"budget {budget}" + (f" ({', '.join(limits)})" if limits else "") + ": live memory over the step"
        layout = _layout(title, "step (forward, then the backward after each plan's dotted line)",
                         f"live bytes ({unit})", shapes=shapes)
        out.append({"id": f"fig-memory-{i}", "title": f"budget {budget}", "data": data, "layout": layout})
    return out


def _memory_trace(curve: Curve, index: int, name: str, color: str, scale: float, unit: str) -> dict[str, Any]:
    peak_step = curve.live_bytes.index(curve.peak) if curve.peak in curve.live_bytes else -1
    sizes = [9 if s == peak_step else (3 if k == "r" else 0) for s, k in enumerate(curve.phases)]
    return {"type": "scatter", "mode": "lines+markers", "name": f"{name} (peak {format_bytes(curve.peak)})",
            "x": list(range(len(curve.values))), "y": [b / scale for b in curve.live_bytes],
            "line": {"color": color, "width": 1.3, "shape": "hv"},
            "marker": {"color": color, "size": sizes},
            "meta": {"curve": index}, "hovertemplate": "%{text}<extra></extra>"}


def solve_time_figure(report: RunReport, colors: dict[str, str]) -> dict[str, Any]:
    """Each pair's solve time, grouped by budget, a bar per solver (log scale); the hover says the
    status and the gap to the solver's bound."""
    budgets: list[str] = []
    for rec in report.records:
        if rec.budget not in budgets:
            budgets.append(rec.budget)
    data = []
    for solver, color in colors.items():
        recs = [r for r in report.records if r.solver == solver and r.solve_time_s is not None]
        if not recs:
            continue
        data.append({"type": "bar", "name": solver, "x": [f"budget {r.budget}" for r in recs],
                     "y": [max(r.solve_time_s or 0.0, 1e-6) for r in recs], "marker": {"color": color},
                     "text": [plan_hover(r) for r in recs], "hovertemplate": "%{text}<extra></extra>",
                     "textposition": "none"})
    layout = _layout("solve time per pair (hover: status, gap)", "budget", "solve time (s, log scale)",
                     barmode="group")
    layout["yaxis"]["type"] = "log"
    return {"id": "fig-solve", "title": "solve times", "data": data, "layout": layout}
