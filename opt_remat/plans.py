"""Plan files on the torch side: what a plan was made for, matching a plan to a compiled graph, and
saying what differs when none matches. The file format itself is ``opt_remat.formats.plan_file``."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import torch
import torch.fx as fx

from solvers import Plan, Problem

from .canonical import canonical_values, graph_id
from .errors import PlanMismatchError
from .formats.plan_file import apply_plan, closest_graph, find_graph, first_difference, graph_entry, plan_document


def versions() -> dict[str, str]:
    try:
        mine = metadata.version("opt-remat")
    except metadata.PackageNotFoundError:
        mine = "unknown"
    return {"opt_remat": mine, "torch": torch.__version__}


def settings_text(settings: Mapping[str, Any] | None) -> str:
    if not settings:
        return "unknown settings"
    return ", ".join(f"{k}={v!r}" for k, v in settings.items() if k in ("compiler", "decompositions"))


def match_plan(data: dict[str, Any], joint_module: fx.GraphModule, roles: Sequence[str] | None,
               problem: Problem, *, settings: Mapping[str, Any] | None = None, source: str = "plan") -> Plan:
    """The plan of ``data`` made for this (prepared) joint graph, mapped value for value; a
    PlanMismatchError naming the first differing values and the likely cause when there is none."""
    values = canonical_values(joint_module, roles)
    gid = graph_id(joint_module, values)
    entry = find_graph(data, gid)
    if entry is None:
        raise PlanMismatchError(mismatch_message(data, values, gid, settings, source))
    return apply_plan(entry, problem, values, source=source)


def _inputs(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Graph inputs by role (``param NAME`` ...) -> type."""
    return {op: typ for op, typ in pairs if op.split(" ")[0] in ("param", "buffer", "input")}


def _dtype(type_text: str) -> str:
    return type_text.split("[")[0]


def mismatch_message(data: dict[str, Any], values: Sequence[dict[str, Any]], gid: str,
                     settings: Mapping[str, Any] | None, source: str) -> str:
    entry = closest_graph(data, values)
    ours, theirs = first_difference(entry, values)
    made_for = data.get("made_for") or {}
    capture = made_for.get("capture") or {}
    here_in = _inputs([(v["op"], v["type"]) for v in values])
    plan_in = _inputs([(v[2], v[3]) for v in entry["values"]])
    only_plan = [r for r in plan_in if r not in here_in]
    only_here = [r for r in here_in if r not in plan_in]
    changed = [r for r in here_in if r in plan_in and here_in[r] != plan_in[r]]

    def show(v: Any) -> str:
        return f"{v[0]} ({v[1]} {v[2]})" if v else "nothing"

    if only_plan or only_here:
        names = only_plan or only_here
        cause = (f"the model differs: {len(names)} input(s) only in {'the plan' if only_plan else 'this'} graph "
                 f"({', '.join(names[:3])}{' ...' if len(names) > 3 else ''}): another layer count or architecture")
    elif changed:
        r = changed[0]
        what = "dtype" if _dtype(here_in[r]) != _dtype(plan_in[r]) else "shapes (batch size, sequence length)"
        cause = f"{what}: {r} is {here_in[r]} here and {plan_in[r]} in the plan's graph"
    elif settings and capture and any(
            capture.get(k) != settings.get(k) for k in ("compiler", "decompositions")
            if k in settings and (k != "decompositions" or settings.get("compiler") == "eager")):
        cause = (f"compiler/decompositions: the plan was captured for {settings_text(capture)}, this backend uses "
                 f"{settings_text(settings)}")
    else:
        vers = made_for.get("versions") or {}
        cause = ("decompositions, compiler or torch version (the plan's torch "
                 f"{vers.get('torch', '?')}, this torch {torch.__version__})")
    how = (f"solve again for this graph (opt-remat solve with capture: {{{settings_text(settings).replace('=', ': ')}}}"
           f" and this model's shapes), or apply the plan with the settings it was made for ({settings_text(capture)})"
           if settings else "solve again for this model, inputs and capture settings")
    return (f"{source} was made for a different graph (graph ids {entry['graph_id']} in the plan, "
            f"{gid} here, {len(entry['values'])} and {len(values)} values): first differing value here {show(ours)}, "
            f"in the plan's graph "
            f"{show(theirs)}; likely cause: {cause}. To fix: {how}")


class Record(Protocol):
    """What ``save_plans`` reads of a partition record (``opt_remat.api.PartitionRecord``)."""
    problem: Problem
    plan: Plan

    @property
    def values(self) -> list[dict[str, Any]]: ...

    @property
    def graph_id(self) -> str: ...


def save_plans(path: str | Path, history: Sequence[Record],
               settings: Mapping[str, Any] | None = None) -> Path:
    """A plan file of the plans a training run's partitioner made (``backend_fn.partitioner.history``),
    one per distinct graph (per-layer compile: one layer graph serves every layer), applied later with
    ``backend(plan=path)`` and the same compiler settings (``settings``: the partitioner's
    ``settings``, i.e. compiler and decompositions, kept as what the plans were captured for)."""
    entries: dict[str, dict[str, Any]] = {}
    for rec in history:
        entries.setdefault(rec.graph_id, graph_entry(rec.problem, rec.plan, rec.values, rec.graph_id))
    if not entries:
        raise ValueError("no partition records to save: compile and run the model's step first")
    made_for = {"capture": dict(settings or {}), "versions": versions()}
    out = Path(path)
    out.write_text(json.dumps(plan_document(list(entries.values()), made_for), indent=1) + "\n")
    return out
