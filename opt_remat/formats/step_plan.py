"""A plan file for a step of several graphs (``solvers.step``): one plan per distinct graph, each an
entry as ``plan_file.graph_entry`` writes it (the layer graph's applies to every layer through its
canonical id; the root's parts, read off the whole graph, are keyed ``root:before``/``root:after``
and say eager's plan), and a ``step`` section: the graphs in order with their repeats, the step's
peak, where it falls and its split by kind. Imports no torch."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from solvers.problem import Plan
from solvers.step import Step, StepPeak

from .plan_file import graph_entry, plan_document, values_of_problem


def step_section(step: Step, peak: StepPeak, cost: float, **extra: Any) -> dict[str, Any]:
    """What the plan file says about the whole step."""
    return {"graphs": [{"graph_id": g.key, "repeat": g.repeat, "kept": g.fixed is not None} for g in step.graphs],
            "peak_bytes": peak.total, "peak_at": peak.at,
            "peak_by_kind": {k.value: v for k, v in peak.by_kind.items()},
            "recompute_cost": cost, **{k: v for k, v in extra.items() if v is not None}}


def step_document(step: Step, plans: Mapping[str, Plan], values: Mapping[str, Sequence[dict[str, Any]]],
                  peak: StepPeak, cost: float, made_for: Mapping[str, Any] | None = None,
                  entry_extra: Mapping[str, Mapping[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """The plan document: one entry per distinct graph (``values`` per key: canonical values; a key
    without them, a root part, is named by its own values), and the ``step`` section."""
    entries = []
    for key in step.keys():
        problem = step.graph(key).problem
        entry = graph_entry(problem, plans[key], values.get(key) or values_of_problem(problem), key)
        entry["repeat"] = sum(g.repeat for g in step.graphs if g.key == key)
        entry.update((entry_extra or {}).get(key, {}))
        entries.append(entry)
    doc = plan_document(entries, dict(made_for or {}))
    doc["step"] = step_section(step, peak, cost, **extra)
    return doc
