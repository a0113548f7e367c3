"""Plan files: one plan per joint graph, each keyed to its graph by canonical value ids.

A document holds what the plans were made for (``made_for``: model, dtype, inputs, capture settings,
versions) and a list of ``graphs``. Each graph entry lists its values as ``[name, id, op, type,
[input indices]]`` (ids are canonical: the same value has the same id in any capture of the same
step), the plan's ``saved`` and ``recomputed`` names, and its predictions. A plan applies to a graph
whose canonical id equals the entry's ``graph_id``; its saved names are mapped through the ids.
The canonical ids are computed on the torch side (``opt_remat.canonical``); this module imports no torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import jsonschema

from solvers.problem import Plan, Problem, Status, plan_from_saved

from ..errors import PlanMismatchError

FORMAT_VERSION = 2


def graph_hash(problem: Problem) -> str:
    """A hash of a problem's structure: names, roles, ops, edges, sizes, storages and bans (costs
    left out). Identifies the problem a run solved; plans match graphs by canonical ids instead."""
    h = hashlib.sha256()
    for n in problem.nodes:
        h.update(json.dumps([n.name, n.role.value, n.op, list(n.inputs), n.bytes, n.storage_id,
                             n.banned, n.must_recompute, n.saveable]).encode())
    h.update(json.dumps(sorted(problem.required)).encode())
    return h.hexdigest()[:24]


def values_of_problem(problem: Problem) -> list[dict[str, Any]]:
    """Canonical values for a problem that has no torch graph (a graph file): its names are its ids."""
    index = problem.index
    return [{"name": n.name, "id": n.name, "op": n.op, "type": f"{n.bytes} B",
             "inputs": [index[i] for i in n.inputs]} for n in problem.nodes]


_GRAPH_SCHEMA = {
    "type": "object",
    "required": ["graph_id", "saved", "recomputed", "values"],
    "properties": {
        "graph_id": {"type": "string"},
        "saved": {"type": "array", "items": {"type": "string"}},
        "recomputed": {"type": "array", "items": {"type": "string"}},
        "offloaded": {"type": "array", "items": {"type": "string"}},
        "values": {"type": "array", "items": {
            "type": "array", "prefixItems": [{"type": "string"}, {"type": "string"}, {"type": "string"},
                                             {"type": "string"}, {"type": "array", "items": {"type": "integer"}}],
            "minItems": 5, "maxItems": 5}},
        "solver": {"type": "string"},
        "status": {"enum": [s.value for s in Status]},
        "budget": {"type": ["integer", "null"]},
        "saved_bytes": {"type": ["integer", "null"]},
        "nodes": {"type": "object"},
    },
}
SCHEMA = {
    "type": "object",
    "required": ["format", "graphs"],
    "properties": {
        "format": {"const": FORMAT_VERSION},
        "made_for": {"type": "object"},
        "graphs": {"type": "array", "minItems": 1, "items": _GRAPH_SCHEMA},
    },
}


def graph_entry(problem: Problem, plan: Plan, values: Sequence[dict[str, Any]], graph_id: str) -> dict[str, Any]:
    """One graph's plan as a plan-file entry."""
    return {
        "graph_id": graph_id,
        "graph_nodes": len(problem.nodes),
        "solver": plan.solver,
        "status": plan.status.value,
        "budget": plan.budget,
        "saved_bytes": plan.saved_bytes,
        "recompute_cost": plan.recompute_cost,
        "objective": plan.objective,
        "bound": plan.bound,
        "gap": plan.gap,
        "solve_time_s": plan.solve_time_s,
        "message": plan.message,
        "saved": sorted(plan.saved, key=problem.index.__getitem__),
        "recomputed": sorted(plan.recomputed, key=problem.index.__getitem__),
        **({"offloaded": sorted(plan.offloaded, key=problem.index.__getitem__)} if plan.offloaded else {}),
        "values": [[v["name"], v["id"], v["op"], v["type"], list(v["inputs"])] for v in values],
    }


def plan_document(graphs: Sequence[dict[str, Any]], made_for: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "made_for": dict(made_for or {}), "graphs": list(graphs)}


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """A plan document, validated: a bad file raises PlanMismatchError with one line saying why."""
    where = repr(str(path))
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise PlanMismatchError(f"plan file {where} does not exist") from None
    except IsADirectoryError:
        raise PlanMismatchError(
            f"plan file {where} is a folder; expected a JSON file written by opt-remat solve") from None
    except UnicodeDecodeError:
        raise PlanMismatchError(f"plan file {where} is binary, not a JSON plan written by opt-remat solve") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = text.lstrip().startswith("{") and not text.rstrip().endswith("}")  # a document cut short
        raise PlanMismatchError(
            f"plan file {where} is {'truncated' if cut else 'not valid JSON'} (line {exc.lineno}, column "
            f"{exc.colno}: {exc.msg}); write it again with opt-remat solve") from None
    if isinstance(data, dict) and data.get("format") == 1:
        raise PlanMismatchError(f"plan file {where} has format 1 (plans keyed by trace order); solve again "
                                "with this opt-remat to get a format 2 plan")
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        at = "/".join(str(p) for p in e.absolute_path) or "top level"
        raise PlanMismatchError(f"{where} is not an opt-remat plan file: at {at}: {e.message[:200]}")
    for i, g in enumerate(data["graphs"]):
        names = [v[0] for v in g["values"]]
        known = set(names)
        for key in ("saved", "recomputed"):
            unknown = [s for s in g[key] if s not in known]
            if unknown:
                raise PlanMismatchError(
                    f"{where}: graphs/{i}/{key} names {len(unknown)} value(s) the plan's graph does not have: "
                    f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
        if any(j < 0 or j >= k for k, v in enumerate(g["values"]) for j in v[4]):
            raise PlanMismatchError(f"{where}: graphs/{i}/values: an input index does not point to an earlier value")
    return data


def find_graph(data: dict[str, Any], graph_id: str) -> dict[str, Any] | None:
    for g in data["graphs"]:
        if g["graph_id"] == graph_id:
            return g
    return None


def apply_plan(entry: dict[str, Any], problem: Problem, values: Sequence[dict[str, Any]], *,
               source: str = "plan") -> Plan:
    """A plan-file entry as a Plan for ``problem`` (whose canonical ``values`` match the entry's)."""
    here = {v["id"]: v["name"] for v in values}
    plan_ids = {v[0]: v[1] for v in entry["values"]}
    missing = [s for s in entry["saved"] if here.get(plan_ids[s]) is None]
    if missing:
        raise PlanMismatchError(f"{source}: saved values {', '.join(missing[:5])} have no match in this graph")
    saved = [here[plan_ids[s]] for s in entry["saved"]]
    plan = plan_from_saved(problem, saved, solver=f"plan:{entry.get('solver', '?')}",
                           status=Status(entry.get("status", "feasible")), budget=entry.get("budget"),
                           objective=entry.get("objective"), bound=entry.get("bound"),
                           message=f"loaded from {source}")
    offloaded = frozenset(here[plan_ids[s]] for s in entry.get("offloaded", ()))
    return replace(plan, offloaded=offloaded) if offloaded else plan


def first_difference(entry: dict[str, Any], values: Sequence[dict[str, Any]]) -> tuple[Any, Any]:
    """The first value (graph order) of this graph that the plan's graph lacks, and the plan
    graph's first value that this graph lacks: ``(name, op, type)`` each, or None."""
    plan_ids = {v[1] for v in entry["values"]}
    here_ids = {v["id"] for v in values}
    ours = next(((v["name"], v["op"], v["type"]) for v in values if v["id"] not in plan_ids), None)
    theirs = next(((v[0], v[2], v[3]) for v in entry["values"] if v[1] not in here_ids), None)
    return ours, theirs


def closest_graph(data: dict[str, Any], values: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The plan-file entry sharing the most values with this graph."""
    here_ids = {v["id"] for v in values}
    return max(data["graphs"], key=lambda g: sum(v[1] in here_ids for v in g["values"]))
