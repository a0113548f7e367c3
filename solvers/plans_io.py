"""Plans as JSON, keyed to the graph they were made for by a structural hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .problem import Plan, Problem, Status, plan_from_saved

FORMAT_VERSION = 1


class PlanMismatchError(ValueError):
    """A saved plan applied to a graph it was not made for."""


def graph_hash(problem: Problem) -> str:
    """A hash of the graph's structure: names, roles, ops, edges, sizes, storages and bans.

    Costs are left out: the same plan stays valid on another device profile.
    """
    h = hashlib.sha256()
    for n in problem.nodes:
        h.update(json.dumps([n.name, n.role.value, n.op, list(n.inputs), n.bytes, n.storage_id,
                             n.banned, n.must_recompute, n.saveable]).encode())
    h.update(json.dumps(sorted(problem.required)).encode())
    return h.hexdigest()[:24]


def plan_to_dict(problem: Problem, plan: Plan) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "graph_hash": graph_hash(problem),
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
    }


def save_plan(path: str | Path, problem: Problem, plan: Plan) -> None:
    Path(path).write_text(json.dumps(plan_to_dict(problem, plan), indent=1) + "\n")


def read_plan_file(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanMismatchError(f"plan file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise PlanMismatchError(f"plan file {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or "saved" not in data or "graph_hash" not in data:
        raise PlanMismatchError(f"{str(path)!r} is not an opt-remat plan (no 'saved' / 'graph_hash')")
    return data


def apply_plan(data: dict[str, Any], problem: Problem, *, source: str = "plan") -> Plan:
    """The saved plan as a Plan for ``problem``; refuses a plan made for another graph."""
    expected = graph_hash(problem)
    if data["graph_hash"] != expected:
        raise PlanMismatchError(
            f"{source} was made for a different graph (hash {data['graph_hash']}, "
            f"{data.get('graph_nodes', '?')} nodes) than this one (hash {expected}, "
            f"{len(problem.nodes)} nodes): solve again for this model, inputs and capture settings"
        )
    return plan_from_saved(problem, data["saved"], solver=f"plan:{data.get('solver', '?')}",
                           status=Status(data.get("status", "feasible")), budget=data.get("budget"),
                           objective=data.get("objective"), bound=data.get("bound"),
                           message=f"loaded from {source}")
