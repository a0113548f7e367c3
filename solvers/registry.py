"""Solvers by name: ``solve(problem, "cpsat", budget=..., **options) -> Plan`` and, under a peak
budget, ``solve_peak(problem, "cpsat", peak_budget, ...)``.

What each solver supports and which options it takes is declared in ``solvers.catalog``; options
are checked there (an option the solver does not take in the mode of the solve is an error), then
every option that applies is passed, defaults filled in from the catalog. The saved-bytes entries
are ``fn(problem, budget, **options) -> Plan`` (``budget`` None: no limit); modules register them
here with ``register``, and importing this module's ``solve`` imports them all.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from .catalog import FREE, PEAK, PEAK_SEARCH, SAVED, TORCH, mode_options, typed_options
from .problem import Plan, Problem
from .progress import report

SolverFn = Callable[..., Plan]
_SOLVERS: dict[str, SolverFn] = {}
# modules that call ``register`` when imported; a module that fails to import is reported by name
_SOLVER_MODULES = ("solvers.mincut", "solvers.baselines", "solvers.mip")
# the peak-budget entries: fn(problem, peak_budget, budget, *, candidates, count_gradients, **options)
_PEAK_ENTRIES = {"mincut": "solvers.fast_peak:fast_peak_plan",
                 "cpsat": "solvers.peak:solve_peak", "milp": "solvers.peak:solve_peak"}


def register(name: str) -> Callable[[SolverFn], SolverFn]:
    def deco(fn: SolverFn) -> SolverFn:
        _SOLVERS[name] = fn
        return fn
    return deco


def _load() -> None:
    for mod in _SOLVER_MODULES:
        importlib.import_module(mod)


def available() -> list[str]:
    """The solvers this process can run on a ``Problem`` (the catalog's, less torch's baseline)."""
    _load()
    return sorted(_SOLVERS)


def solve(problem: Problem, solver: str, budget: int | None = None, **options: Any) -> Plan:
    """The plan of ``solver`` under a saved-bytes ``budget`` (None: none)."""
    mode = FREE if budget is None else SAVED
    typed = typed_options(solver, options, mode)
    if solver == TORCH:
        raise ValueError("solver 'torch' runs torch's partitioner on the captured FX graph, not on a "
                         "Problem: use opt_remat.partitioner('torch') or a run configuration")
    _load()
    options = mode_options(typed, mode)
    searching = "time_limit_s" in options  # a search that may run long: its start and end are reported
    if searching:
        report(None, None, phase=f"{solver}: started")
    plan = _SOLVERS[solver](problem, budget, **options)
    if searching:
        report(plan.recompute_cost, plan.bound, phase=f"{solver}: done")
    return plan


def solve_peak(problem: Problem, solver: str, peak_budget: int, budget: int | None = None,
               options: Mapping[str, Any] | None = None, *, candidates: Iterable[Iterable[str]] = (),
               count_gradients: bool = True) -> Plan:
    """A plan of ``solver`` whose simulated step peak fits ``peak_budget`` (and saved bytes
    ``budget``). ``candidates``: saved sets the solve considers too. The plan's ``solver`` says
    what found it, e.g. ``cpsat (peak: relaxation with cuts)``."""
    typed = typed_options(solver, dict(options or {}), PEAK)
    module, _, attr = _PEAK_ENTRIES[solver].partition(":")
    fn = getattr(importlib.import_module(module), attr)
    what = "fast default (checkpointing, min-cut, layer mix)" if solver == "mincut" else "peak search"
    report(None, None, phase=f"{what}: started")
    plan = fn(problem, peak_budget, budget, candidates=candidates, count_gradients=count_gradients,
              **mode_options(typed, PEAK))
    report(plan.recompute_cost, plan.bound, phase=f"{what}: done")
    return label_peak_plan(plan, solver)


def label_peak_plan(plan: Plan, solver: str) -> Plan:
    """``plan`` with a ``solver`` field that says which solver was asked and what found the plan."""
    extra: Mapping[str, object] = plan.extra or {}
    found = extra.get("found_by") or ("min-cut/checkpoint frontier" if solver == "mincut" else plan.solver)
    how = "" if solver == "mincut" else f"{PEAK_SEARCH}, asked for as {solver!r}: "
    return replace(plan, solver=f"{solver} (peak: {found})", message=how + plan.message)
