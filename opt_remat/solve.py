"""Stage 3: turn a budget into bytes and a problem into a verified plan, via ``solvers``."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from typing import Any, Callable

from solvers import InfeasibleError, Plan, Problem, Status, check_plan, interrupt
from solvers.budget import Fraction, format_bytes, parse_budget
from solvers.mincut import lam_range, solve_mincut
from solvers.peak import PeakInfeasibleError
from solvers.registry import solve, solve_peak


class BudgetError(ValueError):
    """A budget no plan can meet; says the smallest feasible one."""

    def __init__(self, budget: int, min_feasible_bytes: int, detail: str = "") -> None:
        self.budget = budget
        self.min_feasible_bytes = min_feasible_bytes
        super().__init__(
            f"budget {format_bytes(budget)} ({budget} bytes) is infeasible: the smallest plan of any "
            f"solver saves {format_bytes(min_feasible_bytes)} ({min_feasible_bytes} bytes)"
            + (f"; {detail}" if detail else f". Raise the budget to at least {min_feasible_bytes} bytes")
        )


class SolveInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a solve; ``plan`` is the best plan it had found (checked valid), or None."""

    def __init__(self, plan: Plan | None) -> None:
        super().__init__("interrupted (Ctrl-C) during the solve")
        self.plan = plan


def _raise_if_interrupted(problem: Problem, plan: Plan | None, budget: int | None) -> None:
    """Turn a Ctrl-C that stopped a native solve (``solvers.interrupt``) into SolveInterrupted."""
    if not interrupt.requested():
        return
    interrupt.clear()
    if plan is not None and not check_plan(problem, plan, budget=budget).valid:
        plan = None
    raise SolveInterrupted(plan)


class PeakBudgetError(ValueError):
    """A peak budget no plan can meet; says the smallest peak found and the floor below it."""

    def __init__(self, peak_budget: int, min_peak: int | None, floor: int | None = None) -> None:
        self.peak_budget = peak_budget
        self.min_peak = min_peak
        self.floor = floor
        found = (f"the smallest step peak found is {format_bytes(min_peak)} ({min_peak} bytes). Raise "
                 f"peak_budget to at least {min_peak} bytes" if min_peak is not None
                 else "no valid plan was found at all (check bans and must-recompute tags)")
        if floor is not None and min_peak is not None:
            found += (" (it is the smallest possible)" if floor == min_peak else
                      f"; no plan can peak below {format_bytes(floor)} ({floor} bytes)")
        super().__init__(f"peak_budget {format_bytes(peak_budget)} ({peak_budget} bytes) is infeasible: {found}")


def choose_peak_plan(problem: Problem, solver: str, peak_budget: int, budget: int | None,
                     options: dict[str, Any] | None = None, *,
                     default_lam: float | None = None, count_gradients: bool = True) -> Plan:
    """A plan whose simulated step peak fits ``peak_budget`` (and saved bytes ``budget``).
    ``default_lam``: the min-cut plan at that ``lam`` (the default path's plan) is a candidate."""
    options = dict(options or {})
    interrupt.clear()
    candidates = []
    if default_lam is not None:
        try:
            candidates.append(solve_mincut(problem, default_lam).saved)
        except InfeasibleError:
            pass
    try:  # the catalog says which solvers have a peak mode and which options they take there
        plan = solve_peak(problem, solver, peak_budget, budget, options, candidates=candidates,
                          count_gradients=count_gradients)
    except PeakInfeasibleError as exc:
        _raise_if_interrupted(problem, None, budget)
        err = PeakBudgetError(peak_budget, exc.min_peak, getattr(exc, "floor", None))
        if solver == "mincut":  # the frontier alone: the exact search often goes lower
            err.args = (err.args[0] + " (among min-cut and checkpointing plans only: solver 'cpsat' "
                        "searches further)",)
        raise err from None
    _raise_if_interrupted(problem, plan, budget)
    result = check_plan(problem, plan, budget=budget)
    if not result.valid:
        raise RuntimeError("opt-remat internal error: invalid peak plan: " + "; ".join(result.errors[:5]))
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


def choose_plan(problem: Problem, solver: str, budget: int | None, options: dict[str, Any] | None = None,
                *, fallback: bool = True) -> Plan:
    """Solve and verify. Solver failures fall back to the min-cut plan with a warning; a budget
    that no plan meets raises BudgetError naming the smallest feasible saved bytes."""
    options = dict(options or {})
    interrupt.clear()
    try:
        plan = solve(problem, solver, budget, **options)
    except InfeasibleError as exc:
        _raise_if_interrupted(problem, None, budget)
        if budget is None:
            raise  # no budget at all: the graph's bans and tags conflict; the message says how
        raise BudgetError(budget, _min_feasible(problem, exc)) from None
    except (ValueError, TypeError):
        raise  # bad options or input: the user's to fix, not a solver failure
    except Exception as exc:  # a solver crash must not kill a training run
        _raise_if_interrupted(problem, None, budget)
        if not fallback or solver == "mincut":
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


DEFAULT_CPSAT_SECONDS = 0.8  # the default path's CP-SAT search: proves the tests' models optimal in ~0.3 s


def choose_default_plan(problem: Problem, budget: int | None, mincut_options: dict[str, Any],
                        cpsat_options: dict[str, Any] | None = None) -> Plan:
    """No solver named. Without a budget: the min-cut plan. With one: the min-cut plan, replaced by
    a short CP-SAT search's (warm-started from min-cut plans) when that recomputes less; a CP-SAT
    failure or timeout leaves the min-cut plan, silently."""
    if budget is None:
        return choose_plan(problem, "mincut", None, mincut_options)
    cut: Plan | None = None
    cut_error: BudgetError | None = None
    try:
        cut = choose_plan(problem, "mincut", budget, mincut_options)
    except BudgetError as exc:  # min-cut charges shared storages per member: CP-SAT may still fit
        cut_error = exc
    options = {"time_limit_s": DEFAULT_CPSAT_SECONDS, **(cpsat_options or {})}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exact = choose_plan(problem, "cpsat", budget, options, fallback=False)
    except BudgetError:
        if cut is not None:
            return cut
        raise
    except Exception:
        if cut is None:
            assert cut_error is not None
            raise cut_error from None
        return cut
    if cut is None or (exact.recompute_cost, exact.saved_bytes) < (cut.recompute_cost, cut.saved_bytes):
        return exact
    return cut


def _min_feasible(problem: Problem, exc: Exception | None) -> int:
    value = getattr(exc, "min_feasible_bytes", None)
    if isinstance(value, int):
        return value
    return least_memory_plan(problem).saved_bytes


def _with_message(plan: Plan, message: str) -> Plan:
    return replace(plan, message=message)
