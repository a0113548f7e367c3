"""Stage 3: turn a budget into bytes and a problem into a verified plan, via ``solvers``."""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import replace
from typing import Any, Callable

from solvers import InfeasibleError, Plan, Problem, Status, catalog, check_plan, interrupt
from solvers.budget import Fraction, format_bytes, parse_budget
from solvers.catalog import label_peak_plan, solve, solve_peak, typed_options
from solvers.mincut import lam_range, solve_mincut
from solvers.mip import solve_mip
from solvers.mip_warm import better
from solvers.options import DefaultOptions, MilpOptions
from solvers.peak import PeakInfeasibleError

from .errors import BudgetError, PeakBudgetError, SolveInterrupted
from .plan_memory import GraphKey, as_solution, cheaper_remembered, recall, remember


def _raise_if_interrupted(problem: Problem, plan: Plan | None, budget: int | None) -> None:
    """Turn a Ctrl-C that stopped a native solve (``solvers.interrupt``) into SolveInterrupted."""
    if not interrupt.requested():
        return
    interrupt.clear()
    if plan is not None and not check_plan(problem, plan, budget=budget).valid:
        plan = None
    raise SolveInterrupted(plan)


# the least time limit a search keeps after the road's preparation, seconds
MIN_SEARCH_S = 1.0


def _less_time_spent(typed: Any, started: float | None) -> Any:
    """``typed`` options with ``time_limit_s`` less the seconds since ``started`` (at least
    ``MIN_SEARCH_S``); as they are where either is missing."""
    limit = getattr(typed, "time_limit_s", None)
    if started is None or limit is None:
        return typed
    return replace(typed, time_limit_s=max(float(limit) - (time.perf_counter() - started), MIN_SEARCH_S))


def choose_peak_plan(problem: Problem, solver: str | None, peak_budget: int, budget: int | None,
                     options: dict[str, Any] | None = None, *,
                     default_lam: float | None = None, count_gradients: bool = True,
                     memory: GraphKey | None = None, device: bool = False, started: float | None = None) -> Plan:
    """A plan whose simulated step peak fits ``peak_budget`` (and saved bytes ``budget``).
    ``solver`` None, ``"default"`` or ``"mincut"``: the fast default (``solvers.fast_peak``);
    ``"peak-search"``, ``"cpsat"`` or ``"milp"``: the search with a proven gap. ``default_lam``:
    the min-cut plan at that ``lam`` (the default path's plan) is a candidate. ``memory``: plans
    remembered from earlier solves of the graph (``opt_remat.plan_memory``) are candidates, one
    that fits and costs less wins, and the plan returned is remembered. ``device``: the peak is the
    device's memory (the problem counts the rank's, ``road``), as errors say."""
    options = dict(options or {})
    interrupt.clear()
    remembered = recall(memory)
    candidates = []
    if default_lam is not None:
        try:
            candidates.append(solve_mincut(problem, default_lam).saved)
        except InfeasibleError:
            pass
    candidates += remembered
    name = solver or catalog.DEFAULT
    plan: Plan | None = None
    failure: PeakInfeasibleError | None
    try:  # the catalog says which solvers have a peak mode and which options they take there
        typed = _less_time_spent(typed_options(name, options, catalog.PEAK), started)
        plan = solve_peak(problem, name, peak_budget, budget, typed, candidates=candidates,
                          count_gradients=count_gradients)
    except PeakInfeasibleError as exc:
        _raise_if_interrupted(problem, None, budget)
        failure = exc
    else:
        failure = None
        _raise_if_interrupted(problem, plan, budget)
    found = cheaper_remembered(problem, remembered, peak_budget, budget, plan, count_gradients=count_gradients)
    if found is not None:
        plan = label_peak_plan(as_solution(found, plan, peak_budget), name)
    if plan is None:
        assert failure is not None
        fast = catalog.resolve(name, catalog.PEAK).name == catalog.DEFAULT  # the search often goes lower
        raise PeakBudgetError(peak_budget, failure.min_peak, getattr(failure, "floor", None),
                              further="peak-search" if fast else None,
                              name="device_memory" if device else "peak_budget") from None
    result = check_plan(problem, plan, budget=budget)
    if not result.valid:
        raise RuntimeError("opt-remat internal error: invalid peak plan: " + "; ".join(result.errors[:5]))
    remember(memory, plan.saved)
    return plan


def least_memory_plan(problem: Problem) -> Plan:
    """The min-cut plan with the fewest saved bytes (memory first, then recompute cost)."""
    lo, _ = lam_range(problem)
    return solve_mincut(problem, lo)


def inputs_only_bytes(problem: Problem) -> int:
    """Saved bytes when everything that may be recomputed is: the bottom of fractional budgets."""
    return solve(problem, "inputs-only").saved_bytes


def resolve_budget(problem: Problem, budget: int | float | str | None,
                   top_anchor: Callable[[], int] | None = None) -> int | None:
    """Bytes for a budget; a fraction f means ``lo + f * (hi - lo)`` where lo is the inputs-only
    plan's saved bytes and hi the saved bytes of torch's default min-cut (``top_anchor``) or, without
    one, of saving everything the backward reads."""
    parsed = parse_budget(budget)
    if parsed is None or not isinstance(parsed, Fraction):
        return parsed
    lo = inputs_only_bytes(problem)
    if top_anchor is not None:
        hi = top_anchor()
    else:
        hi = problem.saved_bytes(n for n in problem.backward_reads if problem.can_save(n))
    hi = max(hi, lo)
    return int(math.floor(lo + float(parsed) * (hi - lo)))


def choose_plan(problem: Problem, solver: str, budget: int | None, options: dict[str, Any] | None = None) -> Plan:
    """Solve and verify. Solver failures fall back to the min-cut plan with a warning; a budget
    that no plan meets raises BudgetError naming the smallest feasible saved bytes. The default
    path (no solver named) is ``choose_default_plan``."""
    options = dict(options or {})
    mode = catalog.FREE if budget is None else catalog.SAVED
    typed = typed_options(solver, options, mode)
    interrupt.clear()
    try:
        plan = solve(problem, solver, budget, typed)
    except InfeasibleError as exc:
        _raise_if_interrupted(problem, None, budget)
        if budget is None:
            raise  # no budget at all: the graph's bans and tags conflict; the message says how
        raise BudgetError(budget, _min_feasible(problem, exc)) from None
    except (ValueError, TypeError):
        raise  # bad options or input: the user's to fix, not a solver failure
    except Exception as exc:  # a solver crash must not kill a training run
        _raise_if_interrupted(problem, None, budget)
        if solver == "mincut":
            raise
        warnings.warn(f"opt-remat: solver {solver!r} failed ({type(exc).__name__}: {exc}); "
                      "falling back to the min-cut plan", stacklevel=2)
        plan = solve(problem, "mincut", budget)
        plan = _with_message(plan, f"fallback after {solver} failed: {exc}")
    _raise_if_interrupted(problem, plan, budget)
    if plan.status is Status.INFEASIBLE and budget is not None and plan.saved_bytes > budget:
        raise BudgetError(budget, _min_feasible(problem, None),
                          f"solver {solver!r} cannot get below {format_bytes(plan.saved_bytes)} ({plan.saved_bytes} "
                          "bytes); an optimizing "
                          "solver (cpsat, milp, mincut) reaches the smallest")
    result = check_plan(problem, plan, budget=budget)
    if not result.valid:
        raise RuntimeError(f"opt-remat internal error: solver {solver!r} returned an invalid plan: "
                           + "; ".join(result.errors[:5]))
    return plan


# The default path's exact search (HiGHS through ``solvers.mip``; its time limit, a guard, is
# ``DefaultOptions.time_limit_s``); benchmarks/bench_default.py measures it against the proven
# optimum from the tests' models to the 70B shape.
DEFAULT_MIP_NODES = 1000  # branch-and-bound nodes per HiGHS run: a stop independent of the machine
# the memory tie-break (a second HiGHS run, least saved bytes at the optimal cost) where it is cheap:
# 0.2-0.3 s at the 7B shape (3.3k candidate values), 4 s at the 70B shape (8.3k)
DEFAULT_TIE_BREAK_MAX_VALUES = 5_000


def choose_default_plan(problem: Problem, budget: int | None, mincut_options: dict[str, Any],
                        mip_options: dict[str, Any] | None = None) -> Plan:
    """No solver named. Without a budget: the min-cut plan. With one: the least-recompute plan,
    proven by HiGHS (``solve_mip(engine="highs")``, warm-started from min-cut plans; the memory
    tie-break on graphs of up to ``DEFAULT_TIE_BREAK_MAX_VALUES`` candidate values). Where HiGHS
    proves nothing (node limit, time guard, failure) the min-cut plan is computed too and the
    better of the two returned, its message saying so. ``mip_options`` (the exact search's:
    time_limit_s, threads, seed, warm_start_cuts, symmetry) override the defaults."""
    if budget is None:
        return choose_plan(problem, "mincut", None, mincut_options)
    search = MilpOptions(backend="highs", **{"time_limit_s": DefaultOptions.time_limit_s, **(mip_options or {})})
    interrupt.clear()
    exact: Plan | None = None
    why = ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exact = solve_mip(problem, budget, search, node_limit=DEFAULT_MIP_NODES,
                              tie_break=len(problem.candidates) <= DEFAULT_TIE_BREAK_MAX_VALUES)
    except InfeasibleError:
        pass  # min-cut decides below, and names the smallest feasible bytes
    except (ValueError, TypeError):
        raise  # bad options: the user's to fix
    except Exception as exc:  # a solver crash must not kill a training run
        why = f"the exact search failed ({type(exc).__name__}: {exc})"
    _raise_if_interrupted(problem, exact, budget)
    if exact is not None and not check_plan(problem, exact, budget=budget).valid:
        exact, why = None, "the exact search returned an invalid plan"
    if exact is not None and exact.status is Status.OPTIMAL:
        return exact
    try:
        cut = choose_plan(problem, "mincut", budget, mincut_options)
    except BudgetError:  # min-cut charges shared storages per member: the exact plan may fit
        if exact is None:
            raise
        return exact
    if exact is not None and better(exact, cut):
        return exact  # its message says where the search stopped
    if why:
        warnings.warn(f"opt-remat: {why}; using the min-cut plan", stacklevel=2)
    else:
        why = (f"the exact search proved nothing in its limits ({exact.message})" if exact is not None
               else "the exact search found no plan")
    return _with_message(cut, f"min-cut plan: {why}")


def _min_feasible(problem: Problem, exc: Exception | None) -> int:
    value = getattr(exc, "min_feasible_bytes", None)
    if isinstance(value, int):
        return value
    return least_memory_plan(problem).saved_bytes


def _with_message(plan: Plan, message: str) -> Plan:
    return replace(plan, message=message)
