"""Solver names and their options, checked the same way for YAML configs and ``partitioner(...)``."""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Any, Mapping

TORCH_SOLVER = "torch"  # torch's own partitioner, run as a baseline through the same interface

# option enums the registry functions cannot express in their signatures
OPTION_ENUMS = {("milp", "backend"): ["cbc", "highs"], ("mincut", "backend"): ["ortools", "networkx"],
                ("cpsat", "symmetry"): ["none", "tie", "warm"], ("milp", "symmetry"): ["none", "tie", "warm"]}
# no solver named: min-cut, then (under a budget) a short CP-SAT search from its plan
DEFAULT_SOLVERS = ("mincut", "cpsat")
# options of the peak-budget search (``solvers.peak.solve_peak``) beyond the solver's own
PEAK_OPTIONS = ("stages", "gap")


def known_solvers() -> list[str]:
    """Solver names a configuration or partitioner may use: the registry's, plus ``torch``."""
    from solvers.registry import available
    try:  # the MIP solvers register themselves when their module is imported
        importlib.import_module("solvers.mip")
    except ImportError:
        pass
    return sorted(set(available()) | {TORCH_SOLVER})


def solver_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword options a registered solver takes (empty for ``torch``)."""
    if name == TORCH_SOLVER:
        return {}
    from solvers import registry
    known_solvers()
    fn = registry._SOLVERS[name]
    params = list(inspect.signature(fn).parameters.values())[2:]  # (problem, budget, **options)
    return {p.name: p for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def describe(value: Any) -> str:
    """A value as an error message shows it: its kind, and its text when short."""
    text = repr(value)
    kind = {dict: "a mapping", list: "a list", bool: "a boolean", int: "an integer", float: "a number",
            str: "a string", type(None): "null"}.get(type(value), type(value).__name__)
    if len(text) > 40:
        return kind
    return f"{kind} {text}" if not isinstance(value, (dict, list)) else kind


def option_error(solver: str, key: str, value: Any, param: inspect.Parameter) -> str | None:
    """Why ``value`` is not a valid ``key`` option of ``solver`` (None when it is)."""
    enum = OPTION_ENUMS.get((solver, key))
    if enum is not None:
        return None if value in enum else f"expected one of {enum}, got {describe(value)}"
    default = param.default
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float) or key in ("time_limit_s", "lam"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        want = "a number"
    elif isinstance(default, str):
        ok, want = isinstance(value, str), "a string"
    else:
        ok, want = isinstance(value, (int, float, str, bool)) or value is None, "a scalar"
    if ok and want in ("an integer", "a number") and value is not None and value < 0:
        ok, want = False, want + " >= 0"
    return None if ok else f"expected {want}, got {describe(value)}"


def default_solver_options(options: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The options of the default path (no solver named) split by the solver that takes them."""
    split: dict[str, dict[str, Any]] = {name: {} for name in DEFAULT_SOLVERS}
    for key, value in options.items():
        owner = next(name for name in DEFAULT_SOLVERS if key in solver_parameters(name))
        split[owner][key] = value
    return split


def check_solver_options(solver: str | None, options: Mapping[str, Any], *, peak: bool = False) -> None:
    """Raise ValueError naming the valid options if ``options`` has one ``solver`` does not take
    (with ``peak``, the peak search's options are valid too) or a value of the wrong kind.
    ``solver=None`` is the default path: the options of ``mincut`` and ``cpsat``."""
    if solver is None:
        names = [k for name in DEFAULT_SOLVERS for k in solver_parameters(name)]
        for key, value in options.items():
            owner = next((name for name in DEFAULT_SOLVERS if key in solver_parameters(name)), None)
            if owner is None:
                raise ValueError(f"unknown option {key!r} for the default solvers (mincut, then cpsat); "
                                 f"expected one of: {', '.join(names)}")
            check_solver_options(owner, {key: value}, peak=peak)
        return
    if solver not in known_solvers():
        raise ValueError(f"unknown solver {solver!r}; available: {', '.join(known_solvers())}")
    params = solver_parameters(solver)
    valid = list(params) + (list(PEAK_OPTIONS) if peak and solver != TORCH_SOLVER else [])
    for key, value in options.items():
        if key not in valid:
            raise ValueError(f"unknown option {key!r} for solver {solver!r}; expected one of: "
                             f"{', '.join(valid) or 'none (it takes no options)'}")
        if key in params and not (key == "lam" and value == "auto"):  # the partitioner's default
            why = option_error(solver, key, value, params[key])
            if why is not None:
                raise ValueError(f"option {key}={value!r} for solver {solver!r}: {why}")
