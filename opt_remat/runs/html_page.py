"""A run's HTML report as one self-contained page: plotly.js, the report's data and its script are
embedded, so the file opens offline and can be mailed or archived alone. The tables are written
here as HTML; the figures are drawn in the browser from ``html_figures``' specifications."""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from solvers.budget import column_unit, format_bytes, format_seconds

from .curves import TAGS, TOP_LIVE, TOTAL
from .html_data import RunReport
from .html_figures import figures
from .results import budget_bytes_text, verified_text
from .util import jsonable, write_atomic

REPORT_FILE = "report.html"
CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.info { color: #555; font-size: 0.9em; } nav a { margin-right: 1em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
th { background: #f4f4f4; position: sticky; top: 0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fde8e8; } tr.nop td { color: #888; } tr.first td { border-top: 1px solid #bbb; }
.fig { width: 100%; height: 480px; } .pair { display: flex; gap: 2em; flex-wrap: wrap; }
.note { color: #555; font-size: 0.85em; max-width: 60em; } select { font-size: 1em; margin: 0.5em 0; }
.scroll { overflow-x: auto; } #errors { color: #b00; white-space: pre-wrap; } [hidden] { display: none !important; }
td { white-space: nowrap; }
"""


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str], numeric: Sequence[str] = (),
           row_class: Sequence[str] = ()) -> str:
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_class[i]}"' if i < len(row_class) and row_class[i] else ""
        cells = "".join(f'<td class="num">{_esc(row.get(c))}</td>' if c in numeric else f"<td>{_esc(row.get(c))}</td>"
                        for c in columns)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def plans_table(report: RunReport) -> str:
    """Every pair: its plan's figures, its solve (time, gap) and its gradient check; notes
    (why there is no plan, what a check noticed) below, by number."""
    rows, classes, notes, last = [], [], [], None
    recs = report.records  # one unit per column
    saved_unit = column_unit([r.saved_bytes for r in recs] + [r.measured_saved_bytes for r in recs])
    peak_unit = column_unit([r.peak_bytes for r in recs])
    grads_unit = column_unit([r.peak_gradient_bytes for r in recs])
    for rec in recs:
        first = rec.budget != last
        last = rec.budget
        measured = rec.measured_saved_bytes
        loss = "-" if rec.loss is None else f"{rec.loss:.6g}"
        if rec.loss_reference is not None and rec.loss != rec.loss_reference:
            loss += f" (save-all {rec.loss_reference:.6g})"
        if rec.note:
            notes.append(f"<li>budget {_esc(rec.budget)} {_esc(rec.solver)}: {_esc(rec.note)}</li>")
        rows.append({"budget": rec.budget if first else "", "allows": budget_bytes_text(rec) if first else "",
                     "solver": rec.solver, "status": rec.status + (f" [{len(notes)}]" if rec.note else ""),
                     "saved": format_bytes(rec.saved_bytes, saved_unit),
                     "measured": "-" if measured is None else format_bytes(measured, saved_unit)
                     + ("" if measured == rec.saved_bytes else " (differs)"),
                     "step peak": format_bytes(rec.peak_bytes, peak_unit),
                     "of it gradients": format_bytes(rec.peak_gradient_bytes, grads_unit),
                     "recompute": format_seconds(rec.recompute_cost), "values saved/recomputed": "-"
                     if rec.n_saved is None else f"{rec.n_saved}/{rec.n_recomputed}",
                     "solve": format_seconds(rec.solve_time_s), "gap": "-" if rec.gap is None else f"{rec.gap:.2%}",
                     "gradients": verified_text(rec, notes=False), "loss": loss})
        classes.append(" ".join(c for c in ("first" if first else "", "fail" if rec.verified is False else "",
                                            "nop" if rec.saved_bytes is None else "") if c))
    numeric = ["saved", "measured", "step peak", "of it gradients", "recompute", "values saved/recomputed", "solve",
               "gap"]
    table = _table(rows, list(rows[0]) if rows else ["budget"], numeric, classes)
    return f'<div class="scroll">{table}</div>' + (f'<ol class="note">{"".join(notes)}</ol>' if notes else "")


def checks_summary(report: RunReport) -> str:
    checked = [r for r in report.records if r.verified is not None]
    if not checked:
        return "No plan's gradients were checked (verify.gradients is off, or the run has no torch model)."
    bitwise = sum(1 for r in checked if r.verified and r.bitwise)
    close = sum(1 for r in checked if r.verified and not r.bitwise)
    failed = [f"{r.budget} {r.solver}" for r in checked if not r.verified]
    text = (f"Gradients of {len(checked)} plans checked against save-all's training step: {bitwise} bitwise equal, "
            f"{close} within the tolerance")
    return text + (f", {len(failed)} failed ({', '.join(failed)})." if failed else ", none failed.")


def breakdown_section(report: RunReport) -> str:
    """A chooser of plans, and for the chosen one what it saves and recomputes by op and by module."""
    if not report.plans:
        return "<p>No plans.</p>"
    options, panels = [], []
    for i, view in enumerate(report.plans):
        rec = view.record
        options.append(f'<option value="{i}">budget {_esc(rec.budget)} · {_esc(rec.solver)}</option>')
        tables = []
        for key, rows in (("op", view.by_op), ("module", view.by_module)):
            columns = [key, "saved", "saved bytes", "recomputed", "recompute cost"]
            unit = column_unit([r["saved_bytes"] for r in rows])
            shown = [{key: r["group"], "saved": r["saved"], "saved bytes": format_bytes(r["saved_bytes"], unit),
                      "recomputed": r["recomputed"], "recompute cost": format_seconds(r["recompute_cost"])}
                     for r in rows]
            tables.append(f"<div><h3>by {key}</h3>" + (_table(shown, columns, columns[1:]) if shown
                                                       else "<p>saves and recomputes nothing</p>") + "</div>")
        hidden = "" if i == 0 else " hidden"
        panels.append(f'<div class="breakdown pair" data-plan="{i}"{hidden}>{"".join(tables)}</div>')
    return (f'<select id="plan-choice">{"".join(options)}</select>{"".join(panels)}'
            '<p class="note">Bytes: a storage several saved values share (views) is counted once, under the '
            "first of them; graph inputs cost nothing. Recompute cost: the predicted time the backward spends "
            "recomputing.</p>")


def page_data(report: RunReport) -> dict[str, Any]:
    """The JSON the page's script reads: figure specifications, values, and the curves' steps."""
    return {"figures": figures(report), "values": report.values, "tags": TAGS, "top_live": TOP_LIVE,
            "curves": [{"values": c.values, "live_bytes": c.live[TOTAL], "kinds": c.phases, "live_count": c.live_count,
                        "top": c.top, "peak": c.peak} for c in report.curves]}


def _script_json(data: Any) -> str:
    """JSON that can sit inside a <script> element ("</" cannot end it early)."""
    return json.dumps(jsonable(data), separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def page_html(report: RunReport) -> str:
    import plotly.offline  # the plotly.js bundle that ships with plotly's Python package

    header = report.header
    fp, problem = header.get("fingerprint") or {}, header.get("problem") or {}
    data = page_data(report)
    info = [f"config {header.get('config_file', '?')}",
            f"graph {fp.get('graph_hash', '?')}: {problem.get('nodes', fp.get('graph_nodes', '?'))} values, "
            f"{problem.get('candidates', '?')} candidates",
            f"device profile {(fp.get('device') or {}).get('name', '?')}"]
    if fp.get("compiler"):
        info.append(f"compiler {fp['compiler']}")
    memory_divs = "".join(f'<div class="fig" id="{f["id"]}"></div>' for f in data["figures"]
                          if f["id"].startswith("fig-memory-"))
    kind_divs = "".join(f'<div class="fig" id="{f["id"]}"></div>' for f in data["figures"]
                        if f["id"].startswith("fig-kinds-"))
    missing = (f'<p class="note">Plan files that could not be read (left out): {_esc(", ".join(report.missing))}</p>'
               if report.missing else "")
    tags = ", ".join(f"{k} {v}" for k, v in TAGS.items())
    body = f"""
<h1>{_esc(report.title)}</h1>
<p class="info">{_esc(" · ".join(info))}</p>
<nav><a href="#plans">plans</a><a href="#pareto">Pareto</a><a href="#memory">live memory</a><a href="#kinds">by kind</a>
<a href="#breakdown">saved and recomputed</a><a href="#solve">solve times</a></nav>
<div id="errors"></div>
<h2 id="plans">Plans and their checks</h2>
<p class="note">{_esc(checks_summary(report))}</p>
{plans_table(report)}{missing}
<h2 id="pareto">Saved memory vs recompute cost</h2>
<div class="fig" id="fig-pareto"></div>
<h2 id="memory">Live memory over the training step (simulated)</h2>
<p class="note">Hover a point: the op computed at that step, its module, and the {TOP_LIVE} largest buffers live
then ({_esc(tags)}). Small markers: values recomputed in the backward; the large one: the peak.</p>
{memory_divs}
<h2 id="kinds">Memory by kind over the step (simulated)</h2>
<p class="note">Each plan's live bytes stacked by kind: the graph's activations, backward temporaries and
gradients; with a <code>training</code> set-up also the rank's parameters, gradient shards, optimizer
state and FSDP's buffers. Dashed red: the device's memory, for a device budget.</p>
{kind_divs}
<h2 id="breakdown">What each plan saves and recomputes</h2>
{breakdown_section(report)}
<h2 id="solve">Solve times and gaps</h2>
<div class="fig" id="fig-solve"></div>
"""
    script = resources.files("opt_remat.runs").joinpath("html_report.js").read_text()
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<title>{_esc(report.title)}: '
            f"opt-remat report</title>\n<style>{CSS}</style>\n"
            f"<script>{plotly.offline.get_plotlyjs()}</script>\n</head><body>{body}"
            f'<script type="application/json" id="report-data">{_script_json(data)}</script>\n'
            f"<script>{script}</script>\n</body></html>\n")


def write_page(report: RunReport, run_dir: Path) -> Path:
    path = Path(run_dir) / REPORT_FILE
    write_atomic(path, page_html(report))
    return path
