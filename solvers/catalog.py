"""Every solver by name: what it supports and its typed, documented options.

This is the one place the API (``opt_remat.partitioner``), YAML run configurations, the CLI and
the runs layer learn which solvers exist, which budgets each can meet, and which options each
takes. A solve happens in one of three modes:

* ``free``: no budget (the plan that best trades bytes for recompute by the solver's own rule);
* ``saved``: a budget on saved activation bytes;
* ``peak``: a budget on the step's peak live bytes (optionally with a saved-bytes budget too).

An option applies in the modes its field names; giving one that does not apply in the mode of a
solve is an error naming the options that do (``check_options``), never a silent drop. The
functions that solve live in ``solvers.registry``; this module only describes them, so it is cheap
to import (the CLI's ``--help`` lists the solvers from here).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

FREE, SAVED, PEAK = "free", "saved", "peak"
MODES = (FREE, SAVED, PEAK)
MODE_WORDS = {FREE: "without a budget", SAVED: "under a saved-bytes budget", PEAK: "under a peak budget"}
TORCH = "torch"  # torch's own partitioner: needs the FX graph, so ``opt_remat`` runs it


def option(default: Any, doc: str, *, kind: str, modes: tuple[str, ...] = (FREE, SAVED),
           choices: tuple[Any, ...] = ()) -> Any:
    """A documented option field. ``kind``: ``seconds`` (> 0), ``count`` (integer >= 0), ``int``,
    ``number`` (>= 0, or None when the default is None), ``choice`` (one of ``choices``)."""
    return field(default=default, metadata={"doc": doc, "kind": kind, "modes": modes, "choices": choices})


ALL = MODES


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
class CpsatOptions:
    time_limit_s: float = option(60.0, "wall-clock limit of the whole solve, seconds", kind="seconds", modes=ALL)
    threads: int = option(2, "solver worker threads", kind="count", modes=ALL)
    seed: int = option(0, "random seed of the search", kind="count", modes=ALL)
    warm_start_cuts: int = option(16, "min-cut plans tried as the search's starting points", kind="count")
    symmetry: str = option("none", "repeated layers: 'tie' one decision per group of interchangeable "
                           "values, 'warm' the tied solve as a warm start", kind="choice",
                           choices=("none", "tie", "warm"))
    gap: float = option(0.01, "stop once the plan is within this relative gap of the bound",
                        kind="number", modes=(PEAK,))


@dataclass(frozen=True)
class MilpOptions(CpsatOptions):
    backend: str = option("cbc", "the MILP solver: PuLP's CBC or HiGHS", kind="choice", choices=("cbc", "highs"))


@dataclass(frozen=True)
class DpOptions:
    quantization: int = option(10_000, "byte buckets of the knapsack table", kind="count")


@dataclass(frozen=True)
class UniformOptions:
    every: int | None = option(None, "checkpoint every k-th block boundary (default: the best k "
                               "under the budget, 2 without one)", kind="count")


@dataclass(frozen=True)
class SolverInfo:
    """A solver: its name, what it does, the modes it supports and its options' dataclass."""
    name: str
    summary: str
    options: type
    modes: tuple[str, ...]

    def takes(self, mode: str) -> list[str]:
        """The options that apply in ``mode``."""
        return [f.name for f in dataclasses.fields(self.options) if mode in f.metadata.get("modes", ())]

    def option_names(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.options)]


PEAK_SEARCH = "the peak search (HiGHS relaxation and cut rounds, local search)"
CATALOG: dict[str, SolverInfo] = {info.name: info for info in (
    SolverInfo("mincut", "min-cut of the joint graph (torch's method); under a budget, its weight "
               "searched; under a peak budget, the fast default: checkpointing every k blocks, min-cut "
               "plans and their layer-by-layer mix (solvers.fast_peak)",
               MincutOptions, ALL),
    SolverInfo("cpsat", "exact least-recompute plan by OR-Tools CP-SAT; under a peak budget, " + PEAK_SEARCH,
               CpsatOptions, ALL),
    SolverInfo("milp", "the same 0-1 program by PuLP/CBC or HiGHS; under a peak budget, " + PEAK_SEARCH,
               MilpOptions, ALL),
    SolverInfo("greedy", "knapsack baseline: values by recompute cost per byte", NoOptions, (FREE, SAVED)),
    SolverInfo("dp", "knapsack baseline by dynamic programming on quantized bytes", DpOptions, (FREE, SAVED)),
    SolverInfo("uniform", "checkpoint every k-th block boundary", UniformOptions, (FREE, SAVED)),
    SolverInfo("sqrt", "checkpoint every sqrt(n)-th block boundary", NoOptions, (FREE, SAVED)),
    SolverInfo("save-all", "save everything the backward reads (no recompute)", NoOptions, (FREE, SAVED)),
    SolverInfo("inputs-only", "save only what cannot be recomputed (the fewest bytes)", NoOptions,
               (FREE, SAVED)),
    SolverInfo(TORCH, "torch's own min-cut partitioner at the budget's activation_memory_budget "
               "(a baseline; needs a captured model)", NoOptions, (FREE, SAVED)),
)}

# no solver named (``partitioner()``'s default): the solvers run in each mode, in order; an option
# of the default path belongs to the first of them that takes it in that mode
# (under a saved-bytes budget: milp with HiGHS, ``opt_remat.solve.choose_default_plan``; ``backend``
# there is mincut's)
DEFAULT_PATH: dict[str, tuple[str, ...]] = {FREE: ("mincut",), SAVED: ("mincut", "milp"), PEAK: ("mincut",)}
DEFAULT_WORDS = "the default path (no solver named)"


def names() -> list[str]:
    return list(CATALOG)


def supporting(mode: str) -> list[str]:
    """The solvers that can solve in ``mode``."""
    return [name for name, info in CATALOG.items() if mode in info.modes]


def info(name: str) -> SolverInfo:
    try:
        return CATALOG[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown solver {name!r}; expected one of: {', '.join(CATALOG)}") from None


def help_lines() -> list[str]:
    """One line per solver: name, modes, options (for ``--help`` and error messages)."""
    lines = []
    for name, entry in CATALOG.items():
        opts = entry.option_names()
        lines.append(f"{name}: {entry.summary}" + (f" [options: {', '.join(opts)}]" if opts else ""))
    return lines


def reference(width: int = 100) -> str:
    """Every solver, the budgets it meets, and its options with their defaults, the budgets they
    apply under and what they do (``opt-remat solvers``)."""
    import textwrap

    short = {FREE: "none", SAVED: "saved bytes", PEAK: "peak"}
    out = []
    for name, entry in CATALOG.items():
        out.append(textwrap.fill(f"{name}: {entry.summary}", width, subsequent_indent="    "))
        out.append(f"    budgets: {', '.join(short[m] for m in entry.modes)}")
        for f in dataclasses.fields(entry.options):
            doc = f.metadata["doc"] + (f" ({', '.join(map(str, f.metadata['choices']))})"
                                       if f.metadata["choices"] else "")
            line = (f"{f.name}={f.default!r}: {doc}; budgets: "
                    f"{', '.join(short[m] for m in f.metadata['modes'] if m in entry.modes)}")
            out.append(textwrap.fill(line, width, initial_indent="    - ", subsequent_indent="      "))
    return "\n".join(out)


def describe(value: Any) -> str:
    """A value as an error message shows it: its kind, and its text when short."""
    text = repr(value)
    kind = {dict: "a mapping", list: "a list", bool: "a boolean", int: "an integer", float: "a number",
            str: "a string", type(None): "null"}.get(type(value), type(value).__name__)
    if len(text) > 40:
        return kind
    return f"{kind} {text}" if not isinstance(value, (dict, list)) else kind


def value_error(f: dataclasses.Field, value: Any) -> str | None:
    """Why ``value`` is not valid for option field ``f`` (None when it is)."""
    kind = f.metadata["kind"]
    if kind == "choice":
        choices = list(f.metadata["choices"])
        return None if value in choices else f"expected one of {choices}, got {describe(value)}"
    if value is None and f.default is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if kind in ("count", "int"):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    else:
        ok, want = number, "a number"
    if ok and kind != "int" and (value <= 0 if kind == "seconds" else value < 0):
        ok, want = False, want + (" > 0" if kind == "seconds" else " >= 0")
    return None if ok else f"expected {want}, got {describe(value)}"


def _fields(name: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(info(name).options)}


def check_options(name: str | None, options: Mapping[str, Any], modes: Collection[str]) -> None:
    """Raise ValueError if ``options`` has one that solver ``name`` (None: the default path) does
    not take in any of ``modes``, or a value of the wrong kind; the message names the solver and
    the options it takes there."""
    if name is None:
        for key, value in options.items():
            owner = default_owner(key, modes)
            every = sorted({k for m in MODES for solver in DEFAULT_PATH[m] for k in info(solver).takes(m)})
            if owner is None and key not in every:
                raise ValueError(f"unknown option {key!r} for {DEFAULT_WORDS}; its options: {', '.join(every)}")
            if owner is None:
                takes = sorted({k for m in modes for s in DEFAULT_PATH[m] for k in info(s).takes(m)})
                raise ValueError(f"option {key!r} is not taken by {DEFAULT_WORDS} {_in(modes)}, which "
                                 f"runs {_default_solvers(modes)}; it takes: {', '.join(takes) or 'no options'}")
            check_options(owner, {key: value}, modes)
        return
    entry, fields = info(name), _fields(name)
    usable = [m for m in modes if m in entry.modes]
    for key, value in options.items():
        if key not in fields:
            raise ValueError(f"unknown option {key!r} for solver {name!r}; it takes: "
                             f"{', '.join(fields) or 'no options'}")
        if usable and not any(m in fields[key].metadata["modes"] for m in usable):
            takes = sorted({k for m in usable for k in entry.takes(m)}, key=list(fields).index)
            raise ValueError(f"option {key!r} of solver {name!r} does not apply {_in(usable)}; there it "
                             f"takes: {', '.join(takes) or 'no options'}")
        why = value_error(fields[key], value)
        if why is not None:
            raise ValueError(f"option {key}={value!r} for solver {name!r}: {why}")


def typed_options(name: str, options: Mapping[str, Any], mode: str) -> Any:
    """The options dataclass of ``name`` for a solve in ``mode`` (checked; defaults filled in)."""
    check_options(name, options, (mode,))
    if mode not in info(name).modes:
        raise ValueError(f"solver {name!r} cannot solve {MODE_WORDS[mode]}; solvers that can: "
                         f"{', '.join(supporting(mode))}")
    return info(name).options(**options)


def mode_options(typed: Any, mode: str) -> dict[str, Any]:
    """The fields of a typed options object that apply in ``mode``, by name (what the solver gets)."""
    return {f.name: getattr(typed, f.name) for f in dataclasses.fields(typed) if mode in f.metadata["modes"]}


def not_applying(name: str, options: Mapping[str, Any], mode: str) -> list[str]:
    """The options of ``options`` that solver ``name`` does not take in ``mode`` (a run with budgets
    of several modes gives each pair those of its own, and says which it left out)."""
    fields = _fields(name)
    return [k for k in options if k in fields and mode not in fields[k].metadata["modes"]]


def default_owner(key: str, modes: Collection[str]) -> str | None:
    """The solver of the default path that takes option ``key`` in one of ``modes``."""
    for mode in modes:
        for solver in DEFAULT_PATH[mode]:
            if key in info(solver).takes(mode):
                return solver
    return None


def default_split(options: Mapping[str, Any], mode: str) -> dict[str, dict[str, Any]]:
    """The default path's options in ``mode``, by the solver that takes them (checked)."""
    check_options(None, options, (mode,))
    split: dict[str, dict[str, Any]] = {name: {} for name in DEFAULT_PATH[mode]}
    for key, value in options.items():
        split[default_owner(key, (mode,))][key] = value  # type: ignore[index]
    return split


def _in(modes: Collection[str]) -> str:
    return " or ".join(MODE_WORDS[m] for m in MODES if m in modes)


def _default_solvers(modes: Collection[str]) -> str:
    return " or ".join(dict.fromkeys(", ".join(DEFAULT_PATH[m]) for m in MODES if m in modes))
