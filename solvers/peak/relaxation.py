"""The peak relaxation (``solvers.peak.rows``) solved at one budget, with the cut rows of
``solvers.peak.cuts`` at the steps cut so far: a proven lower bound and the relaxation's plan."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..liveness import simulator
from ..mip_model import Model
from ..problem import Problem
from .cuts import CutContext, add_cut_rows
from .forward_rows import add_forward_rows
from .rows import PeakRows, add_peak_rows


@dataclass
class Relaxed:
    """The relaxation's answer at one budget."""

    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    bound: float | None  # proven: no plan whose step peaks <= the budget costs less (seconds)
    saved: list[str] | None  # the relaxation's best plan (it may peak above the budget)


def solve_relaxation(problem: Problem, model: Model, rows: PeakRows, peak_budget: int,
                     budget: int | None = None, *, time_limit_s: float, threads: int = 2,
                     seed: int = 0, hint_saved: set[str] | None = None,
                     fixed: list[int] | None = None, engine: str = "highs",
                     cuts: tuple[CutContext, list[int]] | None = None, rel_gap: float = 1e-4,
                     probing: bool = True, node_limit: int | None = None, forward: bool = False,
                     on_plan: Callable[[list[str]], None] | None = None,
                     stop: threading.Event | None = None) -> Relaxed:
    """Least cost under the relaxation (and the saved-bytes ``budget``) by HiGHS, or by CP-SAT
    (``engine="cpsat"``: the same model, slower to prove on big graphs; the tests' cross-check;
    takes ``hint_saved``). ``fixed``: the program's variables pinned to these values (tests: a
    true plan must fit its own simulated peak). ``cuts``: ``(solvers.peak.cuts.CutContext, steps)``, rows
    at those backward steps for what recompute chains keep live. ``probing``: HiGHS's presolve probes the binaries.
    ``node_limit``: HiGHS's branch-and-bound nodes at most (a bound on work that does not depend
    on the machine's load). ``forward``: with the rows of ``solvers.peak.forward_rows`` (the
    forward's own peak). ``on_plan``: called with each better plan HiGHS finds on the way (from its
    thread); ``stop``: set, HiGHS stops with what it has."""
    peak_budget -= simulator(problem).floor_besides_graph()  # the rows count the graph alone

    def extend(m: Any, x: list[Any]) -> None:
        add_peak_rows(m, x, problem, model, rows, peak_budget)
        if forward:
            add_forward_rows(m, x, problem, model, peak_budget)
        if cuts is not None and cuts[1]:
            add_cut_rows(m, x, cuts[0], peak_budget, cuts[1])
        if fixed is not None:
            for xi, value in zip(x, fixed):
                m.add(xi == value)

    if engine not in ("highs", "cpsat"):
        raise ValueError(f"solve_relaxation: engine must be 'highs' or 'cpsat', got {engine!r}")
    if engine == "highs":
        return _solve_relaxation_highs(model, budget, extend, time_limit_s=time_limit_s, rel_gap=rel_gap,
                                       probing=probing, node_limit=node_limit, on_plan=on_plan, stop=stop)

    from ..errors import PlanError
    from ..mip_cpsat import CostScale, solve_cpsat
    from ..mip_model import hint_from_plan, normalize_saved
    from ..problem import Status, plan_from_saved

    hint = None
    if hint_saved is not None:
        try:
            hint = hint_from_plan(model, plan_from_saved(problem, normalize_saved(model, hint_saved),
                                                         solver="hint", status=Status.HEURISTIC))
        except PlanError:
            hint = None
    solved = solve_cpsat(model, CostScale.of(model), budget, hint, time_limit_s=max(time_limit_s, 0.05),
                          threads=threads, seed=seed,
                          extend=extend, tie_break=True, presolve=False)
    status = solved.result.status
    return Relaxed(status, 0.0 if solved.bound is None and status != "infeasible" else solved.bound,
                   solved.plan_saved)


def _solve_relaxation_highs(model: Model, budget: int | None, extend: Callable[[Any, list[Any]], None], *,
                            time_limit_s: float, rel_gap: float, probing: bool,
                            node_limit: int | None = None, on_plan: Callable[[list[str]], None] | None = None,
                            stop: threading.Event | None = None) -> Relaxed:
    from ..highs import solve_with_highs
    from ..mip_cpsat import cpsat_program, saved_set

    began = time.perf_counter()  # building the program counts against the limit too
    m, _ = cpsat_program(model, {}, budget, extend)
    # costs in units of their total, so HiGHS's tolerances are relative to the plan costs
    total = sum(model.cost.values())
    scale = 1e3 / total if total > 0 else 1.0
    got = solve_with_highs(m, {i: c * scale for i, c in model.cost.items()}, model.num_vars,
                           time_limit_s=max(time_limit_s - (time.perf_counter() - began), 0.05),
                           rel_gap=rel_gap, probing=probing, node_limit=node_limit, stop=stop,
                           on_solution=None if on_plan is None else lambda values: on_plan(saved_set(model, values)))
    if got.status == "infeasible":
        return Relaxed("infeasible", None, None)
    bound = max(0.0, got.bound / scale) if got.bound is not None else 0.0
    saved = saved_set(model, got.values) if got.values is not None else None
    return Relaxed(got.status, bound, saved)
