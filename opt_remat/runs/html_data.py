"""What a run's HTML report shows, read from its output folder and the problem it solved.

``load_run`` reads ``results.json`` and every plan file, and simulates each distinct plan's
training step with ``solvers.liveness.simulate_plan`` (the simulation behind results.json's step
peaks), keeping at every step the value computed there and the largest buffers live then. It
returns plain values; ``html_page`` turns them into the page. No torch here.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from solvers import Problem
from solvers.liveness import simulate_plan
from solvers.problem import Node, Role

from ..errors import OptRematError, PlanMismatchError
from ..formats.plan_file import read_plan_file
from .plan_files import clean_module, short_op
from .results import Record, read_results

TOP_LIVE = 6  # the largest live buffers a hover names; the others are counted
# what a live buffer holds: an activation of the forward, a value saved for the backward, a value
# recomputed in the backward, a gradient (a backward output), or another backward temporary
TAGS = {"a": "activation", "s": "saved", "r": "recomputed", "g": "gradient", "t": "backward temporary"}


class ReportError(OptRematError, ValueError):
    """A folder that holds no run to report on."""


@dataclass
class Curve:
    """The live memory of one plan's step: per step the value computed, live bytes after it, and
    the largest buffers live then (``[value index, tag]``, tags as ``TAGS``)."""
    values: list[int]
    live_bytes: list[int]
    kinds: str  # per step: f(orward), b(ackward), r(ecomputation in the backward)
    live_count: list[int]
    top: list[list[list[Any]]]
    peak: int
    peak_gradients: int
    forward_steps: int


@dataclass
class PlanView:
    """A record that has a plan: the curve of its step and what it saves and recomputes."""
    record: Record
    curve: int  # index into RunReport.curves (plans that save the same values share one)
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


def read_header(run_dir: Path) -> dict[str, Any]:
    """results.json of ``run_dir`` without its records; a ReportError when there is none."""
    path = Path(run_dir) / "results.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{run_dir}: no results.json there (expected a folder written by opt-remat run)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: cannot read it ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ReportError(f"{path}: not an opt-remat results file")
    doc.pop("results")
    return doc


def load_run(run_dir: Path, problem: Problem) -> RunReport:
    """Everything the report shows, for the run in ``run_dir`` whose graph is ``problem``."""
    run_dir = Path(run_dir)
    header = read_header(run_dir)
    results = read_results(run_dir / "results.json")
    if results is None:
        raise ReportError(f"{run_dir / 'results.json'}: a results format this version cannot read")
    title = ((header.get("config") or {}).get("output") or {}).get("title") or header.get("name") or run_dir.name
    report = RunReport(title=title, header=header, records=results.records,
                       hull=[(int(b), float(c)) for b, c in header.get("mincut_hull") or []],
                       values=value_table(problem))
    curve_of: dict[frozenset[str], int] = {}
    for rec in results.records:
        if not rec.plan_file or rec.saved_bytes is None:
            continue
        try:
            graph = read_plan_file(run_dir / rec.plan_file)["graphs"][0]
        except (OSError, ValueError, PlanMismatchError, IndexError, KeyError):
            report.missing.append(rec.plan_file)  # removed or damaged by hand: left out, said so
            continue
        saved, recomputed = graph["saved"], graph.get("recomputed", [])
        unknown = [v for v in (*saved, *recomputed) if v not in problem.by_name]
        if unknown:
            raise ReportError(f"{rec.plan_file} names values that are not in the run's graph "
                              f"(e.g. {unknown[0]}): the folder holds plans of another graph")
        key = frozenset(saved)
        if key not in curve_of:
            curve_of[key] = len(report.curves)
            report.curves.append(curve_data(problem, saved))
        report.plans.append(PlanView(rec, curve_of[key], breakdown(problem, saved, recomputed, op_label),
                                     breakdown(problem, saved, recomputed, module_label)))
    return report


def value_table(problem: Problem) -> list[list[Any]]:
    """Per node, in graph order: name, op, module, role and the bytes of its storage (0 when
    its storage is a graph input, which the step does not allocate)."""
    size = problem.storage_size
    return [[n.name, short_op(n.op) or "?", clean_module(n.module), n.role.value,
             size[n.storage_id] if problem.counts_memory(n.storage_id) else 0] for n in problem.nodes]


def curve_data(problem: Problem, saved: Iterable[str]) -> Curve:
    """The step under a plan that saves ``saved``, with the largest live buffers at every step."""
    snapshots: list[tuple[int, list[str]]] = []

    def on_step(live: Mapping[str, int]) -> None:
        snapshots.append((len(live), heapq.nlargest(TOP_LIVE, live, key=live.__getitem__)))

    saved_set = set(saved)
    curve = simulate_plan(problem, saved_set, on_step)
    index, by_name = problem.index, problem.by_name
    saved_storages = {by_name[v].storage_id for v in saved_set}
    grads = set(problem.backward_outputs)
    kinds, top = [], []
    for (phase, name, _), (_, buffers) in zip(curve.steps, snapshots):
        kinds.append("f" if phase == "forward" else "b" if by_name[name].role is Role.BACKWARD else "r")
        top.append([[index[_value_of(b)], _tag(b, by_name, saved_storages, grads)] for b in buffers])
    return Curve(values=[index[name] for _, name, _ in curve.steps], live_bytes=[b for _, _, b in curve.steps],
                 kinds="".join(kinds), live_count=[n for n, _ in snapshots], top=top, peak=curve.peak,
                 peak_gradients=curve.peak_gradients, forward_steps=kinds.count("f"))


def _value_of(buffer: str) -> str:
    return buffer[3:] if buffer.startswith("bw:") else buffer


def _tag(buffer: str, by_name: Mapping[str, Node], saved_storages: set[str], grads: set[str]) -> str:
    if not buffer.startswith("bw:"):  # a storage made in the forward
        return "s" if buffer in saved_storages else "a"
    name = buffer[3:]
    if by_name[name].role is not Role.BACKWARD:
        return "r"
    return "g" if name in grads else "t"


def op_label(node: Node) -> str:
    return "graph input" if node.role is Role.INPUT else (short_op(node.op) or "?")


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
