"""Exact least-recompute plans under a saved-bytes budget: one 0-1 program, three solvers.

Model (binaries): for every candidate value v that matters, ``s_v`` (saved) and ``r_v``
(recomputed in the backward); for every counted storage g with several saveable members, ``y_g``.

* every value the backward reads is available:          s_u + r_u >= 1
* a recomputed value needs its inputs available:        s_u + r_u >= r_v   (the clause r_v => s_u | r_u)
* a storage is paid for when any member is saved:       y_g >= s_v
* the budget:                                           sum_g size_g * y_g <= budget
* objective:                                            min sum_v cost_v * r_v  (+ a memory tie-break)

``r_v`` only exists where v may be recomputed (not an input, not banned, inputs obtainable), ``s_v``
only where v may be saved. Exact presolve (cheap, linear time):

* values that nothing in the backward reaches (through reads and recomputation) get no variables;
* *free* values are always available at no cost: saveable values whose storage costs no memory
  (graph inputs unless counted) are simply saved, and zero-cost recomputable values whose inputs
  are free are simply recomputed (saving them instead can never use less memory);
* a storage with a single saveable member uses that member's ``s_v`` as its ``y_g``.

The modules, by job: ``mip_model`` (the program and its exact reductions), ``mip_warm`` (the
min-cut warm start and Lagrangian bound), ``mip_cpsat`` (OR-Tools CP-SAT, one scaled lexicographic
objective), ``mip_milp`` (HiGHS through ``solvers.highs``, or PuLP + CBC; two lexicographic runs),
and this one: the solve (``solve_mip``), solvers "cpsat" and "milp" of ``solvers.catalog``. Every engine is
warm-started from the best min-cut plan that fits the budget, which is also the fallback when a
solver finds nothing in time. ``objective`` and ``bound`` are always reported in true
recompute-cost units (seconds), without the tie-break.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import interrupt
from .budget import format_bytes
from .errors import BudgetInfeasibleError, InfeasibleError, MIPTimeLimitError
from .mip_cpsat import CostScale, EngineResult, Solved, run_cpsat, saved_set, solve_cpsat
from .mip_milp import solve_milp
from .mip_model import Model, build_model, hint_from_plan, normalize_saved, tie
from .mip_model import presolve as presolve_model
from .mip_warm import WarmStart, better, warm_start
from .options import CpsatOptions, MilpOptions
from .problem import Plan, Problem, Status, plan_from_saved
from .symmetry import find_repeated


@dataclass
class _MinBytes:
    best: int | None  # saved bytes of the best plan found
    bound: int  # proven lower bound on the smallest saved bytes
    values: list[int] | None  # that plan's variables


def _min_feasible_bytes(model: Model, *, time_limit_s: float, threads: int,
                        seed: int) -> _MinBytes:
    """The smallest saved bytes of any plan, by CP-SAT on exact integer bytes."""
    obj: dict[int, int] = {}
    for y, size in zip(model.mem_var, model.mem_size):
        obj[y] = obj.get(y, 0) + size
    res = run_cpsat(model, obj, None, None, time_limit_s=time_limit_s, threads=threads, seed=seed)
    if res.status == "infeasible":  # not expected: the model without a budget always has a plan
        raise InfeasibleError("no valid plan (CP-SAT proved the model infeasible)")
    best = int(sum(c * res.values[i] for i, c in obj.items())) if res.values is not None else None
    return _MinBytes(best, int(res.bound) if res.bound is not None else 0, res.values)


def _solve_engine(problem: Problem, model: Model, scale: CostScale, budget: int | None,
                  hint: list[int] | None, *, engine: str, deadline: float, threads: int,
                  seed: int, node_limit: int | None = None, tie_break: bool = True) -> Solved:
    if engine == "cpsat":
        return solve_cpsat(model, scale, budget, hint, threads=threads, seed=seed,
                           time_limit_s=max(deadline - time.perf_counter(), 0.01),
                           tie_break=tie_break)
    return solve_milp(problem, model, scale, budget, hint, engine=engine, deadline=deadline,
                      threads=threads, seed=seed, node_limit=node_limit, tie_break=tie_break)


_TIE_FREE_LAYERS = 1


@dataclass
class _Tied:
    solved: Solved | None  # the tied problem's answer (bound valid for the tied problem only)
    plan: Plan | None  # its plan, on the full problem
    extra: dict[str, object]


def _solve_tied(problem: Problem, model: Model, budget: int | None, warm: Plan | None, *,
                engine: str, threads: int, seed: int, deadline: float,
                node_limit: int | None = None, tie_break: bool = True) -> _Tied:
    """The problem with one decision per repeated-layer group, solved exactly (in time); ``warm``
    (a plan in the presolved program's terms) is its hint."""
    t0 = time.perf_counter()
    sym = find_repeated(problem)
    extra: dict[str, object] = {"symmetry": sym.summary(), "tie_groups": len(sym.groups)}
    # the last member of each group (the last layer) stays free: with every layer alike, the
    # saved bytes move in whole-layer steps and part of the budget goes unused (measured on a
    # 32-layer LLaMA at torch's 0.5 bytes: 14% above the optimum all tied, 4% with one free layer)
    groups = [g[:-_TIE_FREE_LAYERS] for g in sym.groups if len(g) > _TIE_FREE_LAYERS + 1]
    try:
        tied = tie(model, groups)
    except InfeasibleError:
        extra["tie_status"] = "no plan satisfies the ties"
        return _Tied(None, None, extra)
    hint = None if warm is None else hint_from_plan(tied, warm)
    solved = _solve_engine(problem, tied, CostScale.of(tied), budget, hint, engine=engine,
                           deadline=deadline, threads=threads, seed=seed, node_limit=node_limit,
                           tie_break=tie_break)
    extra.update({"tie_vars": tied.num_vars, "tie_status": solved.result.status,
                  "tie_s": time.perf_counter() - t0})
    if solved.plan_saved is None:
        return _Tied(None, None, extra)
    plan = plan_from_saved(problem, solved.plan_saved, solver="tied", status=Status.FEASIBLE)
    extra["tie_cost"] = plan.recompute_cost
    return _Tied(solved, plan, extra)



def _checked_budget(budget: float | None) -> int | None:
    """``budget`` as int bytes; ValueError naming the fix for a bad one."""
    if budget is None:
        return None
    if isinstance(budget, float) and budget.is_integer():
        budget = int(budget)
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"budget must be an integer number of bytes or None, got {budget!r}")  # noqa: TRY004
    if budget < 0:
        raise ValueError(f"budget must be >= 0 bytes, got {budget}")
    return int(budget)


def _refute_infeasible(model: Model, warm: WarmStart, budget: int | None, solved: Solved, *,
                       engine: str, deadline: float, time_limit_s: float, threads: int,
                       seed: int) -> tuple[Solved, str]:
    """The engine said "infeasible" although the warm start found no proof of it: a min-cut plan
    within the budget refutes the claim (CBC makes it when its time limit cuts preprocessing
    short); otherwise the least-memory solve decides, and names the smallest feasible bytes for the
    error."""
    if warm.plan is not None:
        return (Solved(EngineResult("unknown", None, None, solved.result.detail), None, None, False),
                (f"{engine} reported the budget infeasible although a min-cut plan fits it "
                "(CBC does so when its time limit cuts preprocessing short)"))
    if budget is None or warm.min_bytes is not None:  # both were caught earlier
        raise InfeasibleError("no valid plan (the solver proved the model infeasible)")
    mb = _min_feasible_bytes(model, time_limit_s=max(deadline - time.perf_counter(), 1.0),
                             threads=threads, seed=seed)
    if mb.bound > budget or (engine == "cpsat" and (mb.best is None or mb.best > budget)):
        raise BudgetInfeasibleError(budget, mb.best, proven=mb.best == mb.bound)
    if mb.best is None or mb.best > budget:
        raise MIPTimeLimitError(
            f"{engine} reported the budget {format_bytes(budget)} infeasible, and no plan within "
            f"it was found in {time_limit_s:g} s (least found: {format_bytes(mb.best)})")
    assert mb.values is not None
    return (Solved(EngineResult("feasible", mb.values, None), None, saved_set(model, mb.values), False),
            f"{engine} reported the budget infeasible, but a least-memory solve found a plan within it")


def _outcome(problem: Problem, solved: Solved, warm: WarmStart, tied: _Tied | None, *,
             engine: str, budget: int | None, time_limit_s: float,
             extra: dict[str, object]) -> tuple[Sequence[str], Status, str]:
    """The saved set to return, its status and message: the engine's plan, else the warm start."""
    res = solved.result
    name = "cpsat" if engine == "cpsat" else "milp"
    if solved.plan_saved is not None:
        saved: Sequence[str] = solved.plan_saved
        status = Status.OPTIMAL if res.status == "optimal" else Status.TIME_LIMIT
        message = "" if status is Status.OPTIMAL else "time limit reached; best plan found"
        if interrupt.requested() and status is not Status.OPTIMAL:
            message = "interrupted (Ctrl-C); best plan found"
    elif warm.plan is not None:
        saved = sorted(warm.plan.saved)
        status = Status.TIME_LIMIT
        message = (f"{engine} found no plan in {time_limit_s:g} s; "
                   "fell back to the warm-start min-cut plan")
        extra["fallback"] = True
    else:
        raise MIPTimeLimitError(
            f"{engine} found no plan within {time_limit_s:g} s and no min-cut plan fits the "
            f"budget {format_bytes(budget)}")
    if tied is not None and solved is tied.solved and solved.plan_saved is not None:
        # optimal for the restricted problem only; the min-cut warm start may still be cheaper
        status = Status.FEASIBLE if res.status == "optimal" else Status.TIME_LIMIT
        message = ("optimal for the tied problem (one decision per repeated-layer group)"
                   if res.status == "optimal" else "time limit reached on the tied problem")
        tied_plan = plan_from_saved(problem, saved, solver=name, status=status)
        if warm.plan is not None and better(warm.plan, tied_plan):
            saved = sorted(warm.plan.saved)
            message += "; the min-cut warm start was cheaper and is returned"
    return saved, status, message


def _lagrangian(warm: WarmStart, scale: CostScale) -> float:
    # costs are >= 0, so 0 is a valid bound when the solver proved nothing (gap 100%)
    lagrangian = warm.lagrangian_bound or 0.0
    if scale.exact and scale.quantum > 0:  # every plan's cost is a multiple of the quantum
        lagrangian = scale.quantum * math.ceil(lagrangian / scale.quantum - 1e-9)
    return lagrangian


_DEFAULTS = CpsatOptions()


def solve_mip(problem: Problem, budget: int | None, options: CpsatOptions = _DEFAULTS, *,
              presolve: bool = True, node_limit: int | None = None, tie_break: bool = True) -> Plan:
    """The least-recompute plan whose saved bytes fit ``budget`` (None: no limit), by a MIP:
    solvers "cpsat" (``CpsatOptions``: OR-Tools CP-SAT) and "milp" (``MilpOptions``: its
    ``backend``, PuLP + CBC or HiGHS).

    Among plans of equal cost it returns one with the least saved bytes. ``options.time_limit_s``
    bounds the whole call (presolve, warm start, model build and solve; the solver gets what is
    left, at least 10 ms). Raises ValueError for a negative budget, BudgetInfeasibleError when no
    plan fits, InfeasibleError when no plan exists at all, MIPTimeLimitError when nothing is found
    in time and no warm-start plan fits. The smallest feasible bytes reported for an infeasible
    budget come from the exact min-cut at ``lam = 0`` without shared storages, else from a CP-SAT
    solve.

    ``options.symmetry``: "none"; "tie" solves exactly the smaller problem with one decision per
    group of values that repeated layers make interchangeable (``solvers.symmetry``; the last layer
    stays free), its plan valid but never "optimal" (the full problem is solved if the tied one
    admits no plan); "warm" solves the tied problem in up to a third of the time and starts the
    full solve from its plan when that beats the min-cut warm start.

    ``node_limit`` (HiGHS, CBC): at most this many branch-and-bound nodes per run, a stop that does
    not depend on the machine's speed or load (the time limit still applies). ``tie_break=False``:
    least cost only, without the memory tie-break (for HiGHS and CBC a second run).
    """
    engine = options.backend if isinstance(options, MilpOptions) else "cpsat"
    time_limit_s, threads, seed, symmetry = options.time_limit_s, options.threads, options.seed, options.symmetry
    budget = _checked_budget(budget)
    start = time.perf_counter()
    deadline = start + time_limit_s

    model = build_model(problem)
    if presolve:
        model = presolve_model(problem, model)
    t_model = time.perf_counter()
    warm = warm_start(problem, model, budget, cuts=options.warm_start_cuts,
                      deadline=start + 0.25 * time_limit_s)
    t_warm = time.perf_counter()
    if warm.min_bytes is not None and budget is not None and warm.min_bytes > budget:
        raise BudgetInfeasibleError(budget, warm.min_bytes)
    # the warm start as the presolved program sees it: dominated savings replaced
    start_plan = None if warm.plan is None else plan_from_saved(
        problem, normalize_saved(model, warm.plan.saved), solver="mincut", status=Status.HEURISTIC)
    hint = None if start_plan is None else hint_from_plan(model, start_plan)
    scale = CostScale.of(model)

    tied: _Tied | None = None
    if symmetry != "none":
        share = 1.0 if symmetry == "tie" else 1 / 3
        tied = _solve_tied(problem, model, budget, start_plan, engine=engine, threads=threads,
                           seed=seed, deadline=time.perf_counter()
                           + share * max(deadline - time.perf_counter(), 0.0),
                           node_limit=node_limit, tie_break=tie_break)
        if symmetry == "warm" and tied.plan is not None and (
                warm.plan is None or better(tied.plan, warm.plan)):
            hint = hint_from_plan(model, tied.plan)
    if symmetry == "tie" and tied is not None and tied.solved is not None:
        solved = tied.solved
    else:
        solved = _solve_engine(problem, model, scale, budget, hint, engine=engine,
                               deadline=deadline, threads=threads, seed=seed,
                               node_limit=node_limit, tie_break=tie_break)
    t_solve = time.perf_counter()
    note = ""
    if solved.result.status == "infeasible":
        solved, note = _refute_infeasible(model, warm, budget, solved, engine=engine,
                                          deadline=deadline, time_limit_s=time_limit_s,
                                          threads=threads, seed=seed)

    lagrangian = _lagrangian(warm, scale)
    used_tie = tied is not None and solved is tied.solved
    # the tied problem's bound holds for the tied problem only: the full one may do better
    bound = max((None if used_tie else solved.bound) or 0.0, lagrangian)
    extra: dict[str, object] = {
        "backend": engine, "num_vars": model.num_vars, "presolve_merged": model.merged,
        "presolve_fixed": model.fixed, "num_constraints": model.num_constraints,
        "num_candidates": len(problem.candidates), "num_relevant": model.num_relevant,
        "model_s": t_model - start, "warm_start_s": t_warm - t_model, "solve_s": t_solve - t_warm,
        "warm_start_cuts": warm.cuts,
        "warm_start_cost": warm.plan.recompute_cost if warm.plan is not None else None,
        "lagrangian_bound": warm.lagrangian_bound, "cost_resolution": 1.0 / scale.k,
        "shared_storages": model.shared, **solved.detail, **solved.result.detail,
        **(tied.extra if tied is not None else {}),
    }
    saved, status, message = _outcome(problem, solved, warm, tied, engine=engine, budget=budget,
                                      time_limit_s=time_limit_s, extra=extra)
    if symmetry == "tie" and not used_tie:
        note = f"no plan for the tied problem ({extra.get('tie_status')}): solved untied"
    if note:
        message = f"{note}; {message}"
    name = "cpsat" if engine == "cpsat" else "milp"
    plan = plan_from_saved(problem, saved, solver=name, status=status, budget=budget)
    if budget is not None and plan.saved_bytes > budget:
        raise RuntimeError(f"{engine}: plan uses {plan.saved_bytes} bytes over the budget {budget}")
    bound = min(bound, plan.recompute_cost)
    if status is Status.OPTIMAL and solved.exact and not used_tie:
        bound = plan.recompute_cost  # costs were represented exactly: the solver's optimum is the truth
    return Plan(saved=plan.saved, recomputed=plan.recomputed, saved_bytes=plan.saved_bytes,
                recompute_cost=plan.recompute_cost, solver=name, status=status,
                solve_time_s=time.perf_counter() - start, objective=plan.recompute_cost, bound=bound,
                message=message, budget=budget, extra=extra)
