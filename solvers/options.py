"""Every solver's typed options: one frozen dataclass per solver, each default written once.

A field is made by ``option``: its default, what it does, its kind of value (checked by
``value_error``) and the budget kinds it applies under (``modes``: ``free``, no budget; ``saved``,
a saved-bytes budget; ``peak``, a peak budget; all by default, narrowed by the solver's own
modes). ``solvers.catalog`` pairs each class with its solver and checks a request's options
against it, once, where the request enters; the engines take these objects as they are.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

FREE, SAVED, PEAK = "free", "saved", "peak"
MODES = (FREE, SAVED, PEAK)
KINDS = ("seconds", "count", "positive", "number", "choice")


def option(default: Any, doc: str, *, kind: str, modes: tuple[str, ...] = MODES,
           choices: tuple[Any, ...] = ()) -> Any:
    """A documented option field. ``kind``: ``seconds`` (> 0), ``count`` (integer >= 0),
    ``positive`` (integer >= 1), ``number`` (>= 0), ``choice`` (one of ``choices``); None is
    valid where the default is None."""
    assert kind in KINDS, kind
    return field(default=default, metadata={"doc": doc, "kind": kind, "modes": modes, "choices": choices})


def like(source: type, name: str, *, modes: tuple[str, ...], default: Any = dataclasses.MISSING,
         doc: str = "") -> Any:
    """Field ``name`` of options class ``source`` under other ``modes`` (its default and text
    unless given): where one solver runs another's search, its options are that search's."""
    f = next(f for f in dataclasses.fields(source) if f.name == name)
    return option(f.default if default is dataclasses.MISSING else default, doc or f.metadata["doc"],
                  kind=f.metadata["kind"], modes=modes, choices=f.metadata["choices"])


@dataclass(frozen=True)
class NoOptions:
    """The solver takes no options."""


@dataclass(frozen=True)
class MincutOptions:
    lam: float | None = option(None, "seconds of recompute one saved byte is worth (0: the fewest "
                               "bytes; partitioner()'s default 'auto' prices it from the device); "
                               "under a budget the weight is searched instead", kind="number", modes=(FREE,))
    backend: str = option("ortools", "the max-flow library", kind="choice", choices=("ortools", "networkx"))


@dataclass(frozen=True)
class SearchOptions:
    """What every search with a clock takes (its start and end are reported as progress)."""
    time_limit_s: float = option(60.0, "wall-clock limit of the whole solve, seconds", kind="seconds")
    threads: int = option(2, "solver worker threads", kind="count")
    seed: int = option(0, "random seed of the search", kind="count")


@dataclass(frozen=True)
class CpsatOptions(SearchOptions):
    warm_start_cuts: int = option(16, "min-cut plans tried as the search's starting points", kind="count")
    symmetry: str = option("none", "repeated layers: 'tie' one decision per group of interchangeable "
                           "values, 'warm' the tied solve as a warm start", kind="choice",
                           choices=("none", "tie", "warm"))


@dataclass(frozen=True)
class MilpOptions(CpsatOptions):
    backend: str = option("cbc", "the MILP solver: PuLP's CBC or HiGHS", kind="choice", choices=("cbc", "highs"))


@dataclass(frozen=True)
class PeakSearchOptions(SearchOptions):
    gap: float = option(0.01, "stop once the plan is within this relative gap of the bound", kind="number")


@dataclass(frozen=True)
class DefaultOptions:
    """The default path's: min-cut's without a budget; under a saved-bytes budget, its exact search
    (HiGHS) takes the search's, with its own time limit (it stops at its proof or node limit
    first); under a peak budget, none."""
    lam: float | None = like(MincutOptions, "lam", modes=(FREE,))
    backend: str = like(MincutOptions, "backend", modes=(FREE, SAVED))
    time_limit_s: float = like(SearchOptions, "time_limit_s", modes=(SAVED,), default=10.0,
                               doc="wall-clock guard of the exact search, seconds")
    threads: int = like(SearchOptions, "threads", modes=(SAVED,))
    seed: int = like(SearchOptions, "seed", modes=(SAVED,))
    warm_start_cuts: int = like(CpsatOptions, "warm_start_cuts", modes=(SAVED,))
    symmetry: str = like(CpsatOptions, "symmetry", modes=(SAVED,))


@dataclass(frozen=True)
class DpOptions:
    # torch's dp_knapsack scales memory normalized to the (max - min) activation range by 10_000
    quantization: int = option(10_000, "byte buckets of the knapsack table", kind="positive")


@dataclass(frozen=True)
class UniformOptions:
    every: int | None = option(None, "checkpoint every k-th block boundary (default: the best k "
                               "under the budget, 2 without one)", kind="positive")


def describe(value: Any) -> str:
    """A value as an error message shows it: its kind, and its text when short."""
    text = repr(value)
    kind = {dict: "a mapping", list: "a list", bool: "a boolean", int: "an integer", float: "a number",
            str: "a string", type(None): "null"}.get(type(value), type(value).__name__)
    if len(text) > 40:
        return kind
    return f"{kind} {text}" if not isinstance(value, (dict, list)) else kind


def value_error(f: dataclasses.Field[Any], value: Any) -> str | None:
    """Why ``value`` is not valid for option field ``f`` (None when it is)."""
    kind = f.metadata["kind"]
    if kind == "choice":
        choices = list(f.metadata["choices"])
        return None if value in choices else f"expected one of {choices}, got {describe(value)}"
    if value is None and f.default is None:
        return None
    if kind in ("count", "positive"):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        want = "a number"
    least = {"seconds": (0, " > 0"), "count": (0, " >= 0"), "positive": (1, " >= 1"), "number": (0, " >= 0")}
    low, words = least[kind]
    if ok and (value <= low if kind == "seconds" else value < low):
        ok, want = False, want + words
    return None if ok else f"expected {want}, got {describe(value)}"
