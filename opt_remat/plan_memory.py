"""Plans remembered across peak solves of one graph, so that a looser budget never gets a costlier
plan, or a refusal, where a plan found for a tighter one fits.

Each plan a peak solve returns is remembered as its saved values' canonical ids
(``opt_remat.canonical``), keyed by the graph's canonical id: in this process, and on disk in
``$OPT_REMAT_CACHE_DIR/plans/GRAPH-ID.json`` (``opt_remat.disk_cache``: default
``~/.cache/opt-remat``, beside the op-cost cache), the ``MAX_PLANS`` most recent. A later solve of the same
graph (a YAML sweep, ``opt-remat solve`` over a config's budgets, a partitioner called again,
another process) offers them to its solver as candidates, and ``cheaper_remembered`` makes sure
that one that fits and costs less wins. Plans are checked again on the problem at hand (bans,
must-save values, gradients counted or not), so one from another setting is only ever a
candidate. ``OPT_REMAT_PLAN_MEMORY=0`` turns the memory off (then a solve depends on its inputs
alone).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from solvers import Plan, PlanError, Problem, Status, plan_from_saved
from solvers.budget import format_bytes
from solvers.liveness import simulate_plan, without_gradients

from .disk_cache import cache_dir, replace_file

MAX_PLANS = 32
_memory: dict[str, list[frozenset[str]]] = {}  # graph id -> saved sets (canonical ids), oldest first
_lock = threading.Lock()


@dataclass(frozen=True, eq=False)
class GraphKey:
    """What a plan is remembered by: the graph's canonical id, and each value's canonical id."""
    graph_id: str
    ids: dict[str, str]  # value name -> canonical id


def graph_key(values: Sequence[dict[str, Any]], graph_id: str) -> GraphKey | None:
    """The key of a graph from its canonical values (``canonical_values``); None when there is
    no id to key by, or the memory is off."""
    if not graph_id or not enabled():
        return None
    return GraphKey(graph_id, {v["name"]: v["id"] for v in values})


def enabled() -> bool:
    return os.environ.get("OPT_REMAT_PLAN_MEMORY", "1").strip().lower() not in ("0", "off", "false", "no")


def memory_path(graph_id: str) -> Path:
    return cache_dir() / "plans" / f"{graph_id}.json"


def _read(graph_id: str) -> list[frozenset[str]]:
    path = memory_path(graph_id)
    try:
        doc = json.loads(path.read_text()) if path.exists() else {}
        return [frozenset(p) for p in doc.get("plans", []) if isinstance(p, list)]
    except (OSError, ValueError, AttributeError, TypeError):
        return []  # a damaged file is rewritten by the next plan remembered


def recall(key: GraphKey | None) -> list[frozenset[str]]:
    """The remembered plans' saved sets, as this graph's value names (newest first)."""
    if key is None:
        return []
    with _lock:
        known = list(_memory.get(key.graph_id, []))
    names = {cid: name for name, cid in key.ids.items()}
    out = []
    for ids in dict.fromkeys(reversed(known + _read(key.graph_id))):
        if all(i in names for i in ids):
            out.append(frozenset(names[i] for i in ids))
    return out


def remember(key: GraphKey | None, saved: Iterable[str]) -> None:
    """Remember a plan's saved set, in this process and on disk (best effort)."""
    if key is None:
        return
    ids = frozenset(key.ids[n] for n in saved if n in key.ids)
    with _lock:
        mine = [p for p in _memory.get(key.graph_id, []) if p != ids] + [ids]
        _memory[key.graph_id] = mine[-MAX_PLANS:]
        path = memory_path(key.graph_id)
        plans = [p for p in _read(key.graph_id) if p != ids] + [ids]
        try:
            replace_file(path, json.dumps({"graph_id": key.graph_id,
                                           "plans": [sorted(p) for p in plans[-MAX_PLANS:]]}))
        except OSError:
            pass  # the process memory still serves this run


def forget_all() -> None:
    """Drop the plans remembered in this process (the files on disk stay)."""
    with _lock:
        _memory.clear()


def cheaper_remembered(problem: Problem, remembered: Iterable[Iterable[str]], peak_budget: int,
                       budget: int | None, than: Plan | None, *,
                       count_gradients: bool = True) -> tuple[Plan, int] | None:
    """The cheapest remembered plan that fits the peak budget (and ``budget``) and costs less than
    ``than`` (any cost when None), with its simulated peak; None if there is none. Only plans
    cheaper than ``than`` are simulated, cheapest first."""
    sim = without_gradients(problem) if count_gradients is False else problem
    plans = []
    for saved in remembered:
        try:
            plans.append(plan_from_saved(problem, saved, solver="remembered", status=Status.HEURISTIC))
        except PlanError:
            continue  # made in another setting (bans, must-save values)
    limit = (than.recompute_cost, than.saved_bytes) if than is not None else None
    plans = sorted((p for p in plans if (budget is None or p.saved_bytes <= budget)
                    and (limit is None or (p.recompute_cost, p.saved_bytes) < limit)),
                   key=lambda p: (p.recompute_cost, p.saved_bytes, sorted(p.saved)))
    for plan in plans:
        peak = simulate_plan(sim, plan.saved).peak
        if peak <= peak_budget:
            return plan, peak
    return None


def as_solution(found: tuple[Plan, int], solved: Plan | None, peak_budget: int) -> Plan:
    """A remembered plan returned by a solve in place of its own plan ``solved`` (None: it found
    none that fits): the remembered plan's figures, the solve's bound."""
    plan, peak = found
    bound = solved.bound if solved is not None else None
    extra = {**(dict(solved.extra) if solved is not None else {}), "peak": peak, "peak_budget": peak_budget,
             "found_by": "remembered plan"}
    if bound is not None:
        extra["gap"] = max(0.0, plan.recompute_cost - bound) / max(plan.recompute_cost, 1e-30)
    return replace(plan, status=solved.status if solved is not None else Status.HEURISTIC,
                   objective=plan.recompute_cost, bound=bound, extra=extra,
                   message="a plan remembered from an earlier solve of this graph fits and costs less: "
                           f"simulated peak {format_bytes(peak)}")
