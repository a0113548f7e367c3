"""Every solver by name: one ``Solver`` object each, and the functions that check and run them.

This is the one place the API, YAML run configurations, the CLI and the runs layer learn which
solvers exist, which budgets each can meet, which options each takes (its typed options class,
``solvers.options``) and what runs it. A solve happens in one of three modes:

* ``free``: no budget (the plan that best trades bytes for recompute by the solver's own rule);
* ``saved``: a budget on saved activation bytes;
* ``peak``: a budget on the step's peak live bytes (optionally with a saved-bytes budget too).

Under a peak budget two solvers run: ``default`` (the fast default: checkpointing, min-cut plans
and their layer mix; what runs when no solver is named) and ``peak-search`` (the search with a
proven gap). The older names ``mincut`` (for ``default``) and ``cpsat``/``milp`` (for
``peak-search``) are kept as aliases there; the plan's ``solver`` says which ran.

Options are checked once, by ``check_options``, where a request enters (an option that does not
apply in the mode of the solve is an error naming the options that do, never a silent drop);
``typed_options`` then builds the options object that ``solve`` and ``solve_peak`` pass to the
solver's function as it is.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import fast_peak, mip
from .baselines import (
    inputs_only,
    knapsack_baseline,
    save_all,
    sqrt_checkpoint,
    uniform_checkpoint,
)
from .mincut import run_mincut
from .options import (
    FREE,
    MODES,
    PEAK,
    SAVED,
    CpsatOptions,
    DefaultOptions,
    DpOptions,
    MilpOptions,
    MincutOptions,
    NoOptions,
    PeakSearchOptions,
    SearchOptions,
    UniformOptions,
    describe,
    value_error,
)
from .peak import peak_search
from .problem import Plan, Problem
from .progress import report

__all__ = ["FREE", "MODES", "PEAK", "SAVED", "describe"]

MODE_WORDS = {FREE: "without a budget", SAVED: "under a saved-bytes budget", PEAK: "under a peak budget"}
DEFAULT = "default"  # what runs when no solver is named
TORCH = "torch"  # torch's own partitioner: needs the FX graph, so ``opt_remat`` runs it
DEFAULT_WORDS = "the default path (no solver named)"

# fn(problem, budget, options) -> Plan; budget None: no limit
RunFn = Callable[[Problem, "int | None", Any], Plan]
# fn(problem, peak_budget, budget, options, *, candidates, count_gradients) -> Plan
PeakFn = Callable[..., Plan]


@dataclass(frozen=True)
class Solver:
    """A solver: its name, what it does, the modes it solves in, its options class, and the
    functions that run it (``run`` without a peak budget, ``run_peak`` under one). Under a peak
    budget a solver with ``peak_alias`` is a name for that solver."""
    name: str
    summary: str
    options: type
    modes: tuple[str, ...]
    run: RunFn | None = None
    run_peak: PeakFn | None = None
    peak_alias: str | None = None

    def takes(self, mode: str) -> list[str]:
        """The options that apply in ``mode`` (none where it does not solve)."""
        if mode not in self.modes:
            return []
        return [f.name for f in dataclasses.fields(self.options) if mode in f.metadata["modes"]]

    def supports(self, mode: str) -> bool:
        """Whether the solver, or the one it names there, solves in ``mode``."""
        return mode in self.modes or (mode == PEAK and self.peak_alias is not None)


def _fast_default(problem: Problem, peak_budget: int, budget: int | None, options: DefaultOptions, *,
                  candidates: Iterable[Iterable[str]], count_gradients: bool) -> Plan:
    # the fast default takes no options under a peak budget
    return fast_peak.fast_peak_plan(problem, peak_budget, budget, candidates=candidates,
                                    count_gradients=count_gradients)


def _peak_search(problem: Problem, peak_budget: int, budget: int | None, options: PeakSearchOptions, *,
                 candidates: Iterable[Iterable[str]], count_gradients: bool) -> Plan:
    # started from the fast default's plan: the exact search never returns a costlier one
    def start(p: Problem, peak: int, saved: int | None, starts: list[set[str]], deadline: float) -> Plan:
        return fast_peak.fast_peak_plan(p, peak, saved, candidates=starts, deadline=deadline)
    return peak_search(problem, peak_budget, budget, options, candidates=candidates,
                       count_gradients=count_gradients, start=start)


_BASELINE = (FREE, SAVED)
CATALOG: dict[str, Solver] = {s.name: s for s in (
    Solver(DEFAULT, "what runs when no solver is named: without a budget, the min-cut plan at lam; "
           "under a saved-bytes budget, the least-recompute plan proven by HiGHS (node and time "
           "limited, warm-started from min-cut plans), else the better min-cut plan; under a peak "
           "budget, the fast default: checkpointing every k blocks, min-cut plans and their "
           "layer-by-layer mix (solvers.fast_peak)", DefaultOptions, MODES, run_peak=_fast_default),
    Solver("mincut", "min-cut of the joint graph (torch's method); under a budget, its weight "
           "searched; under a peak budget, a name for 'default'", MincutOptions, _BASELINE,
           run=run_mincut, peak_alias=DEFAULT),
    Solver("cpsat", "exact least-recompute plan by OR-Tools CP-SAT; under a peak budget, a name for "
           "'peak-search'", CpsatOptions, _BASELINE, run=mip.solve_mip, peak_alias="peak-search"),
    Solver("milp", "the same 0-1 program by PuLP/CBC or HiGHS; under a peak budget, a name for "
           "'peak-search'", MilpOptions, _BASELINE, run=mip.solve_mip, peak_alias="peak-search"),
    Solver("peak-search", "the peak search: a proven lower bound from HiGHS's relaxation and cut "
           "rounds, plans judged by simulation, local search; stops at its gap", PeakSearchOptions, (PEAK,),
           run_peak=_peak_search),
    Solver("greedy", "knapsack baseline: values by recompute cost per byte", NoOptions, _BASELINE,
           run=lambda problem, budget, options: knapsack_baseline(problem, budget, solver="greedy")),
    Solver("dp", "knapsack baseline by dynamic programming on quantized bytes", DpOptions, _BASELINE,
           run=lambda problem, budget, options: knapsack_baseline(problem, budget, solver="dp",
                                                                  quantization=options.quantization)),
    Solver("uniform", "checkpoint every k-th block boundary", UniformOptions, _BASELINE,
           run=lambda problem, budget, options: uniform_checkpoint(problem, budget, every=options.every)),
    Solver("sqrt", "checkpoint every sqrt(n)-th block boundary", NoOptions, _BASELINE,
           run=lambda problem, budget, options: sqrt_checkpoint(problem, budget)),
    Solver("save-all", "save everything the backward reads (no recompute)", NoOptions, _BASELINE,
           run=lambda problem, budget, options: save_all(problem, budget)),
    Solver("inputs-only", "save only what cannot be recomputed (the fewest bytes)", NoOptions, _BASELINE,
           run=lambda problem, budget, options: inputs_only(problem, budget)),
    Solver(TORCH, "torch's own min-cut partitioner at the budget's activation_memory_budget "
           "(a baseline; needs a captured model)", NoOptions, _BASELINE),
)}


def names() -> list[str]:
    return list(CATALOG)


def supporting(mode: str) -> list[str]:
    """The solvers that can solve in ``mode`` (aliases included)."""
    return [name for name, entry in CATALOG.items() if entry.supports(mode)]


def info(name: str | None) -> Solver:
    """The solver called ``name`` (None: the default)."""
    try:
        return CATALOG[DEFAULT if name is None else name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown solver {name!r}; expected one of: {', '.join(CATALOG)}") from None


def resolve(name: str | None, mode: str) -> Solver:
    """The solver that runs when ``name`` is asked for in ``mode`` (an alias's target)."""
    entry = info(name)
    if mode == PEAK and entry.peak_alias is not None:
        return CATALOG[entry.peak_alias]
    if mode not in entry.modes:
        raise ValueError(f"solver {entry.name!r} cannot solve {MODE_WORDS[mode]}; solvers that can: "
                         f"{', '.join(supporting(mode))}")
    return entry


def _fields(name: str | None, modes: Collection[str]) -> dict[str, dataclasses.Field[Any]]:
    """The option fields ``name`` takes in any of ``modes``, by name, in the modes' order."""
    fields: dict[str, dataclasses.Field[Any]] = {}
    for mode in (m for m in MODES if m in modes and info(name).supports(m)):
        entry = resolve(name, mode)
        for f in dataclasses.fields(entry.options):
            if f.name in entry.takes(mode):
                fields.setdefault(f.name, f)
    return fields


def _who(name: str | None) -> str:
    return DEFAULT_WORDS if name is None else f"solver {name!r}"


def check_options(name: str | None, options: Mapping[str, Any], modes: Collection[str]) -> None:
    """Raise ValueError if ``options`` has one that solver ``name`` (None: the default) does not
    take in any of ``modes``, or a value of the wrong kind; the message names the solver and the
    options it takes there. The one check of a request's options."""
    every, usable = _fields(name, MODES), [m for m in modes if info(name).supports(m)]
    here = _fields(name, usable)
    for key, value in options.items():
        if key not in every:
            raise ValueError(f"unknown option {key!r} for {_who(name)}; it takes: {', '.join(every) or 'no options'}")
        if usable and key not in here:
            verb = f"is not taken by {DEFAULT_WORDS}" if name is None else f"of solver {name!r} does not apply"
            raise ValueError(f"option {key!r} {verb} {_in(usable)}; there it takes: {', '.join(here) or 'no options'}")
        why = value_error((here or every)[key], value)
        if why is not None:
            raise ValueError(f"option {key}={value!r} for {_who(name)}: {why}")


def typed_options(name: str | None, options: Mapping[str, Any], mode: str) -> Any:
    """The options object of the solver that runs for ``name`` in ``mode``, defaults filled in
    (``options``: checked by ``check_options`` where the request entered)."""
    return resolve(name, mode).options(**options)


def not_applying(name: str | None, options: Mapping[str, Any], mode: str) -> list[str]:
    """The options of ``options`` that ``name`` does not take in ``mode`` (a run with budgets of
    several modes gives each pair those of its own, and says which it left out)."""
    here = _fields(name, (mode,))
    return [k for k in options if k not in here]


def solve(problem: Problem, name: str, budget: int | None = None, options: Any = None) -> Plan:
    """The plan of solver ``name`` under a saved-bytes ``budget`` (None: none); ``options``: its
    options object (None: the defaults)."""
    entry = resolve(name, FREE if budget is None else SAVED)
    if entry.run is None:
        where = ("opt_remat.solve.choose_default_plan" if entry.name == DEFAULT else
                 "opt_remat.partitioner('torch') or a run configuration, on the captured FX graph")
        raise ValueError(f"solver {name!r} does not run on a Problem without a peak budget: use {where}")
    options = entry.options() if options is None else options
    searching = isinstance(options, SearchOptions)  # a search that may run long: its start and end are reported
    if searching:
        report(None, None, phase=f"{name}: started")
    plan = entry.run(problem, budget, options)
    if searching:
        report(plan.recompute_cost, plan.bound, phase=f"{name}: done")
    return plan


def solve_peak(problem: Problem, name: str | None, peak_budget: int, budget: int | None = None,
               options: Any = None, *, candidates: Iterable[Iterable[str]] = (),
               count_gradients: bool = True) -> Plan:
    """A plan of ``name`` (None: the default) whose simulated step peak fits ``peak_budget`` (and
    saved bytes ``budget``); ``options``: the options object of the solver that runs (None: its
    defaults). ``candidates``: saved sets the solve considers too. The plan's ``solver`` says which
    ran and what found the plan, e.g. ``peak-search (found by relaxation with cuts)``."""
    entry = resolve(name, PEAK)
    assert entry.run_peak is not None
    what = "fast default (checkpointing, min-cut, layer mix)" if entry.name == DEFAULT else "peak search"
    report(None, None, phase=f"{what}: started")
    plan = entry.run_peak(problem, peak_budget, budget, entry.options() if options is None else options,
                          candidates=candidates, count_gradients=count_gradients)
    report(plan.recompute_cost, plan.bound, phase=f"{what}: done")
    return label_peak_plan(plan, name)


def label_peak_plan(plan: Plan, name: str | None) -> Plan:
    """``plan`` with a ``solver`` field that says which solver ran and what found the plan, and a
    message that names the old name it was asked for by."""
    ran = resolve(name, PEAK).name
    extra: Mapping[str, object] = plan.extra or {}
    found = extra.get("found_by") or ("min-cut/checkpoint frontier" if ran == DEFAULT else plan.solver)
    asked = "" if name in (None, ran) else f"asked for as {name!r}, which names {ran!r} under a peak budget; "
    return replace(plan, solver=f"{ran} (found by {found})", message=asked + plan.message)


def reference(width: int = 100) -> str:
    """Every solver, the budgets it meets, and its options with their defaults, the budgets they
    apply under and what they do (``opt-remat solvers``)."""
    short = {FREE: "none", SAVED: "saved bytes", PEAK: "peak"}
    out = []
    for name, entry in CATALOG.items():
        out.append(textwrap.fill(f"{name}: {entry.summary}", width, subsequent_indent="    "))
        alias = f"; peak: runs {entry.peak_alias}" if entry.peak_alias else ""
        out.append(f"    budgets: {', '.join(short[m] for m in entry.modes)}{alias}")
        for f in dataclasses.fields(entry.options):
            doc = f.metadata["doc"] + (f" ({', '.join(map(str, f.metadata['choices']))})"
                                       if f.metadata["choices"] else "")
            line = (f"{f.name}={f.default!r}: {doc}; budgets: "
                    f"{', '.join(short[m] for m in f.metadata['modes'] if m in entry.modes)}")
            out.append(textwrap.fill(line, width, initial_indent="    - ", subsequent_indent="      "))
    return "\n".join(out)


def _in(modes: Collection[str]) -> str:
    return " or ".join(MODE_WORDS[m] for m in MODES if m in modes)
