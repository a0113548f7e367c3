"""What a run's HTML report shows: the run (``run_data.LoadedRun``) and the problem it solved, as
plain values. Each plan's curve is its record's (simulated once, by the run); plans that save the
same values (and offload the same) share one. Here: the value table the hovers index, and what each plan saves and
recomputes by op and by module. ``html_page`` turns them into the page. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from solvers import Problem
from solvers.problem import Node

from ..report import clean_module, op_label
from .curves import TAGS, TOP_LIVE, Curve
from .results import Record
from .results import ResultsError as ReportError
from .run_data import LoadedRun, read_run

__all__ = ["TAGS", "TOP_LIVE", "Curve", "PlanView", "ReportError", "RunReport", "load_run", "report_data"]


@dataclass
class PlanView:
    """A record that has a plan: the curve of its step and what it saves and recomputes."""
    record: Record
    curve: int  # index into RunReport.curves (plans that save and offload the same values share one)
    by_op: list[dict[str, Any]]
    by_module: list[dict[str, Any]]


@dataclass
class RunReport:
    title: str
    header: dict[str, Any]  # results.json without its records
    records: list[Record]
    hull: list[tuple[int, float]]
    values: list[list[Any]]  # per problem node: [name, op, module, role, bytes of its storage]
    curves: list[Curve] = field(default_factory=list)
    plans: list[PlanView] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # plan files that could not be read


def report_data(run: LoadedRun, problem: Problem) -> RunReport:
    """Everything the report shows, for ``run`` whose graph is ``problem``."""
    report = RunReport(title=run.title, header=run.header, records=run.records, hull=run.hull,
                       values=value_table(problem), missing=list(run.missing))
    curve_of: dict[tuple[frozenset[str], frozenset[str]], int] = {}
    for rec in run.records:
        values = run.plans.get(rec.key)
        if values is None or rec.curve is None or rec.saved_bytes is None:
            continue
        key = (frozenset(values.saved), frozenset(values.offloaded))  # offload changes the curve
        if key not in curve_of:
            curve_of[key] = len(report.curves)
            report.curves.append(rec.curve)
        report.plans.append(PlanView(rec, curve_of[key], breakdown(problem, values.saved, values.recomputed, node_op),
                                     breakdown(problem, values.saved, values.recomputed, module_label)))
    return report


def load_run(run_dir: Path, problem: Problem) -> RunReport:
    """The report of the finished run in ``run_dir`` whose graph is ``problem``."""
    return report_data(read_run(run_dir, problem), problem)


def value_table(problem: Problem) -> list[list[Any]]:
    """Per node, in graph order: name, op, module, role and the bytes of its storage (0 when
    its storage is a graph input, which the step does not allocate)."""
    size = problem.storage_size
    return [[n.name, node_op(n), clean_module(n.module), n.role.value,
             size[n.storage_id] if problem.counts_memory(n.storage_id) else 0] for n in problem.nodes]


def node_op(node: Node) -> str:
    return op_label(node.op, node.role.value)


def module_label(node: Node) -> str:
    return clean_module(node.module) or "(no module)"


def breakdown(problem: Problem, saved: Iterable[str], recomputed: Iterable[str],
              label: Callable[[Node], str]) -> list[dict[str, Any]]:
    """What a plan saves and recomputes, grouped by ``label`` (op or module): values, bytes and
    recompute cost per group. A storage that several saved values share (views) is counted once,
    under the first of them in graph order, so the bytes add up to the plan's saved bytes."""
    index, by_name, size = problem.index, problem.by_name, problem.storage_size
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        key = label(by_name[name])
        return rows.setdefault(key, {"group": key, "saved": 0, "saved_bytes": 0, "recomputed": 0,
                                     "recompute_cost": 0.0})

    counted: set[str] = set()
    for name in sorted(saved, key=index.__getitem__):
        r = row(name)
        r["saved"] += 1
        g = by_name[name].storage_id
        if g not in counted:
            counted.add(g)
            r["saved_bytes"] += size[g] if problem.counts_memory(g) else 0
    for name in sorted(recomputed, key=index.__getitem__):
        r = row(name)
        r["recomputed"] += 1
        r["recompute_cost"] += problem.recompute_cost_of(name)
    return sorted(rows.values(), key=lambda r: (-r["saved_bytes"], -r["recompute_cost"], -r["saved"], r["group"]))
