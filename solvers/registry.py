"""Solvers by name: ``solve(problem, "cpsat", budget=..., **options) -> Plan``.

Each entry is ``fn(problem, budget, **options) -> Plan`` where ``budget`` is the saved-bytes limit
(None: no limit). Modules register themselves here with ``register``; importing this module imports
them all, so the registry is complete.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .problem import Plan, Problem

SolverFn = Callable[..., Plan]
_SOLVERS: dict[str, SolverFn] = {}
# modules that call ``register`` when imported; a module that fails to import is reported by name
_SOLVER_MODULES = ("solvers.mincut", "solvers.baselines", "solvers.mip")


def register(name: str) -> Callable[[SolverFn], SolverFn]:
    def deco(fn: SolverFn) -> SolverFn:
        _SOLVERS[name] = fn
        return fn
    return deco


def _load() -> None:
    for mod in _SOLVER_MODULES:
        importlib.import_module(mod)


def available() -> list[str]:
    _load()
    return sorted(_SOLVERS)


def solve(problem: Problem, solver: str, budget: int | None = None, **options: Any) -> Plan:
    _load()
    try:
        fn = _SOLVERS[solver]
    except KeyError:
        raise ValueError(f"unknown solver {solver!r}; available: {', '.join(available())}") from None
    return fn(problem, budget, **options)
