"""Plots of a run: saved activation memory against predicted recompute cost (Pareto), and the
live-memory curve of the training step under each plan.

Pareto: one line per solver through its (budget) points, the parametric min-cut hull as a dashed
line, and the MIP solvers' points marked (filled when proven optimal, hollow otherwise). Memory:
one panel per budget, one line per solver, live bytes at every step of the forward and backward.
Uses matplotlib's Agg backend (no display needed); files are written atomically.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from solvers.budget import byte_axis, format_bytes, time_axis

from .curves import Curve
from .results import Record

MIP_SOLVERS = ("cpsat", "milp")


def _save_png(fig: Any, path: str | Path) -> Path:
    """Write the figure atomically: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.15)  # legends outside the axes kept whole
    os.replace(tmp, path)
    return path


def pareto_plot(records: Sequence[Record], hull: Sequence[Sequence[float]], path: str | Path, *,
                title: str = "saved memory vs recompute cost") -> Path:
    """Write a PNG of the run's plans; returns the path."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    points = [r for r in records if r.saved_bytes is not None and r.recompute_cost is not None]
    all_bytes = [r.saved_bytes for r in points] + [p[0] for p in hull]
    all_cost = [r.recompute_cost for r in points] + [p[1] for p in hull]
    bunit, bscale = byte_axis(all_bytes)
    tunit, tscale = time_axis(all_cost)

    fig = Figure(figsize=(7.5, 5.0), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    if hull:
        hx = [p[0] / bscale for p in hull]
        hy = [p[1] / tscale for p in hull]
        ax.plot(hx, hy, linestyle="-", color="0.6", alpha=0.45, linewidth=5, solid_capstyle="round",
                zorder=1)
        ax.plot(hx, hy, linestyle="--", color="0.3", marker="o", markersize=3, linewidth=1.0, zorder=5,
                label="min-cut hull")
    markers = "os^v<>Dph"
    mip_markers = [("*", 15), ("P", 10), ("X", 9)]
    solvers: list[str] = []
    for r in points:
        if r.solver not in solvers:
            solvers.append(r.solver)
    n_mip = 0
    for i, solver in enumerate(solvers):
        pts = sorted((r for r in points if r.solver == solver), key=lambda r: (r.saved_bytes, r.recompute_cost))
        xs = [r.saved_bytes / bscale for r in pts]  # type: ignore[operator]  # points have both
        ys = [r.recompute_cost / tscale for r in pts]  # type: ignore[operator]
        name = pts[0].solver_name or solver
        if name in MIP_SOLVERS:  # marked: filled when proven optimal, hollow otherwise
            marker, size = mip_markers[n_mip % len(mip_markers)]
            n_mip += 1
            line, = ax.plot(xs, ys, linewidth=1.0, alpha=0.8, zorder=3 + n_mip, marker=marker, markersize=size,
                            markerfacecolor="none", markeredgewidth=1.4, label=f"{solver} (MIP)")
            opt = [(x, y) for r, x, y in zip(pts, xs, ys) if r.status == "optimal"]
            if opt:
                ax.plot([p[0] for p in opt], [p[1] for p in opt], linestyle="none", marker=marker,
                        markersize=size, color=line.get_color(), zorder=3 + n_mip)
        else:
            ax.plot(xs, ys, marker=markers[i % len(markers)], markersize=5, linewidth=1.2, zorder=2,
                    label=solver)
    for r in points:  # each plan labelled with its budget
        ax.annotate(r.budget, (r.saved_bytes / bscale, r.recompute_cost / tscale),  # type: ignore[operator]
                    textcoords="offset points", xytext=(4, 3), fontsize=6, color="0.35")
    failed = [r for r in points if r.verified is False]
    if failed:  # a plan whose gradient check failed: circled in red
        ax.plot([r.saved_bytes / bscale for r in failed],  # type: ignore[operator]
                [r.recompute_cost / tscale for r in failed],  # type: ignore[operator]
                linestyle="none", marker="o", markersize=14, markerfacecolor="none",
                markeredgecolor="red", markeredgewidth=1.5, zorder=20, label="gradient check failed")
    if n_mip:
        ax.plot([], [], linestyle="none", label="MIP: filled = proven optimal")
    ax.set_xlabel(f"saved activation memory ({bunit})")
    ax.set_ylabel(f"predicted recompute cost ({tunit})")
    ax.set_title(title, fontsize=10)
    ax.grid(True, linewidth=0.4, alpha=0.5)
    if solvers or hull:
        ax.legend(fontsize=8, loc="best")
    if not points and not hull:
        ax.text(0.5, 0.5, "no plans", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()

    return _save_png(fig, path)


def memory_plot(curves: dict[str, dict[str, Curve]], path: str | Path, *,
                title: str = "live memory during the step") -> Path:
    """Write ``memory_figure`` as a PNG; returns the path."""
    return _save_png(memory_figure(curves, title=title), path)


def memory_figure(curves: dict[str, dict[str, Curve]], *, title: str = "live memory during the step") -> Any:
    """A figure of live bytes per step (``{budget: {solver: curve}}``), with a dotted line where
    each curve's forward ends and, in each panel's legend, every curve's peak and how much of it is
    gradients. A solver has one colour in every panel; legends sit under their panel, in its width."""
    import math

    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    budgets = list(curves) or ["-"]
    cols = min(3, len(budgets))
    rows = math.ceil(len(budgets) / cols)
    unit, scale = byte_axis(c.peak for per in curves.values() for c in per.values())
    solvers = list(dict.fromkeys(s for per in curves.values() for s in per))
    palette = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]  # a ListedColormap
    color = {s: palette[i % len(palette)] for i, s in enumerate(solvers)}
    longest = max((len(per) for per in curves.values()), default=0)
    fig = Figure(figsize=(5.2 * cols, (3.2 + 0.19 * longest) * rows + 0.5), dpi=100, layout="constrained")
    for i, budget in enumerate(budgets):
        ax = fig.add_subplot(rows, cols, i + 1)
        for solver, curve in curves.get(budget, {}).items():
            steps, grads = curve.live_bytes, curve.peak_gradients
            # the rest of the peak: activations and recomputed values
            split = f", of it grads {format_bytes(grads, unit)}" if grads else ""
            ax.plot(range(len(steps)), [b / scale for b in steps], linewidth=0.9, color=color[solver],
                    label=f"{solver}: peak {format_bytes(curve.peak, unit)}{split}")
            end = curve.forward_steps
            if end:  # the forward ends here (plans that save more run a longer forward)
                ax.axvline(end - 0.5, color=color[solver], linestyle=":", linewidth=0.8, alpha=0.8)
        ax.set_title(f"budget {budget}", fontsize=9)
        ax.set_xlabel("step (forward, dotted line, then backward)", fontsize=8)
        ax.set_ylabel(f"live memory ({unit})", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, linewidth=0.4, alpha=0.5)
        if curves.get(budget):  # under the axes, one curve a line: readable with many curves
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=1, frameon=False,
                      borderaxespad=0.0, handlelength=1.5)
        else:
            ax.text(0.5, 0.5, "no plans", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title, fontsize=10)
    return fig
