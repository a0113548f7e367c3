"""The MILP side of the saved-bytes program (``solvers.mip``): HiGHS (``solvers.highs``) or CBC
(through PuLP), solved lexicographically in two runs: least cost, then least memory subject to
``cost <= optimum``, started from the first solution (kept only if its true cost is no higher).

Costs go in as integers in units of their common quantum when they have one (at most 1e8 units),
which lets CBC and HiGHS stop as soon as the gap is below one unit; otherwise as floats divided by
the largest cost, with relative gap 1e-9. (A tie-break term inside one objective makes the
objective fractional and CBC then cannot close the gap.)
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterable

import numpy as np

from .highs import Program, run_highs
from .mip_cpsat import CostScale, EngineResult, Solved, saved_set
from .mip_model import Model
from .problem import Problem, Status, plan_from_saved

_LATTICE_MAX_UNITS = 1e8  # MILP costs go in as integers (units of their quantum) up to this size
_MILP_GAP_REL = 1e-9  # for float costs; integral objectives stop below one unit instead
_MILP_GAP_ABS_FLOAT = 1e-9


def milp_rows(model: Model) -> tuple[list[list[int]], list[list[float]], list[float]]:
    """Constraint rows (columns, coefficients, lower bound) as ``sum >= lower``."""
    cols: list[list[int]] = []
    coefs: list[list[float]] = []
    lows: list[float] = []
    for lits in model.covers:
        cols.append(list(lits))
        coefs.append([1.0] * len(lits))
        lows.append(1.0)
    for a, bs in model.implications:
        cols.append([a] + bs)
        coefs.append([-1.0] + [1.0] * len(bs))
        lows.append(0.0)
    for y, members in model.storage_links:
        for s in members:
            cols.append([s, y])
            coefs.append([-1.0, 1.0])
            lows.append(0.0)
    return cols, coefs, lows


def _summed(cols: Iterable[int], coefs: Iterable[float]) -> dict[int, float]:
    """A row as column -> coefficient; a column twice (variables merged by ties) is one entry."""
    row: dict[int, float] = {}
    for j, a in zip(cols, coefs):
        row[j] = row.get(j, 0.0) + a
    return row


def run_highs_model(model: Model, objective: dict[int, float], budget: int | None,
                    hint: list[int] | None, *, time_limit_s: float, threads: int, seed: int = 0,
                    cap: tuple[dict[int, float], float] | None = None, gap_abs: float,
                    node_limit: int | None = None) -> EngineResult:
    """The program with HiGHS (``solvers.highs.run_highs``); ``cap``: ``objective . x <= cap``.
    ``threads`` is CBC's (the engines share a signature): HiGHS keeps one thread pool per process."""
    cols, coefs, lows = milp_rows(model)
    rows = [_summed(cs, vs) for cs, vs in zip(cols, coefs)]
    ups = [math.inf] * len(rows)
    if budget is not None and sum(model.mem_size) > budget:
        rows.append(_summed(model.mem_var, map(float, model.mem_size)))
        lows.append(-math.inf)
        ups.append(float(budget))
    if cap is not None:
        rows.append(dict(cap[0]))
        lows.append(-math.inf)
        ups.append(cap[1])
    cost = np.zeros(model.num_vars)
    for i, c in objective.items():
        cost[i] += c
    program = Program(cost=cost, lower=np.asarray(model.lower, dtype=np.float64),
                      upper=np.ones(model.num_vars), integer=[True] * model.num_vars, rows=rows,
                      row_lower=lows, row_upper=ups)
    got = run_highs(program, time_limit_s=time_limit_s, hint=hint, rel_gap=_MILP_GAP_REL,
                    abs_gap=gap_abs, seed=seed, node_limit=node_limit)
    if got.status == "failed":
        raise RuntimeError(f"HiGHS failed: {got.detail.get('highs_status')}")
    return EngineResult(got.status, got.values, got.bound, got.detail)


_CBC_BOUND = re.compile(r"^Lower bound:\s*(\S+)", re.MULTILINE)


def run_cbc(model: Model, objective: dict[int, float], budget: int | None,
             hint: list[int] | None, *, time_limit_s: float, threads: int, seed: int = 0,
             cap: tuple[dict[int, float], float] | None = None, gap_abs: float,
             node_limit: int | None = None) -> EngineResult:
    import pulp  # (CBC runs with its own fixed seed; ``seed`` is accepted for a uniform call)

    t0 = time.perf_counter()
    prob = pulp.LpProblem("remat", pulp.LpMinimize)
    if hasattr(prob, "add_variable"):  # PuLP >= 3.3; constructing LpVariable is deprecated there
        x = [prob.add_variable(f"x{i}", lowBound=lb, upBound=1, cat=pulp.LpInteger)
             for i, lb in enumerate(model.lower)]
    else:
        x = [pulp.LpVariable(f"x{i}", lowBound=lb, upBound=1, cat=pulp.LpInteger)
             for i, lb in enumerate(model.lower)]
    prob.setObjective(pulp.LpAffineExpression([(x[i], c) for i, c in objective.items()]))
    cols, coefs, lows = milp_rows(model)
    GE, LE = pulp.LpConstraintGE, pulp.LpConstraintLE
    for k, (cs, vs, lo) in enumerate(zip(cols, coefs, lows)):
        expr = pulp.LpAffineExpression([(x[j], v) for j, v in zip(cs, vs)])
        prob.addConstraint(pulp.LpConstraint(expr, GE, rhs=lo), name=f"c{k}")
    if budget is not None and sum(model.mem_size) > budget:
        expr = pulp.LpAffineExpression([(x[j], float(s)) for j, s in zip(model.mem_var, model.mem_size)])
        prob.addConstraint(pulp.LpConstraint(expr, LE, rhs=float(budget)), name="budget")
    if cap is not None:
        expr = pulp.LpAffineExpression([(x[j], c) for j, c in cap[0].items()])
        prob.addConstraint(pulp.LpConstraint(expr, LE, rhs=cap[1]), name="cap")
    if hint is not None:
        for xi, h in zip(x, hint):
            xi.setInitialValue(h)
    build_s = time.perf_counter() - t0  # the .mps file is written inside prob.solve
    with tempfile.TemporaryDirectory(prefix="opt-remat-cbc-") as tmp:
        log_path = os.path.join(tmp, "cbc.log")
        opts = {"msg": False, "timeLimit": max(time_limit_s - build_s, 0.01), "threads": threads,
                    "gapRel": _MILP_GAP_REL, "gapAbs": gap_abs, "warmStart": hint is not None,
                    "logPath": log_path, "keepFiles": False, "maxNodes": node_limit}
        solver = pulp.COIN_CMD(**opts)
        if not solver.available():  # no cbc on PATH: PuLP's bundled one (deprecated in PuLP 4)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                solver = pulp.PULP_CBC_CMD(**opts)
        solver.tmpDir = tmp  # PuLP's .mps/.sol/.mst files: removed with the directory, always
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as e:  # cbc exited abnormally: no answer, not a proof
            return EngineResult("unknown", None, None, {"cbc_error": str(e), "build_s": build_s})
        log = ""
        if os.path.exists(log_path):
            with open(log_path) as f:
                log = f.read()
    detail: dict[str, object] = {"cbc_status": pulp.LpStatus[prob.status], "build_s": build_s}
    if prob.status == pulp.LpStatusInfeasible:
        # CBC also says "infeasible" when the time limit cuts its preprocessing short, so the
        # caller double-checks this claim
        return EngineResult("infeasible", None, None, detail)
    has_sol = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if prob.status == pulp.LpStatusOptimal and has_sol:
        values = [round(xi.varValue or 0.0) for xi in x]
        obj = sum(c * values[i] for i, c in objective.items())
        if prob.sol_status == pulp.LpSolutionOptimal:
            return EngineResult("optimal", values, obj, detail)
        m = _CBC_BOUND.search(log)
        return EngineResult("feasible", values, float(m.group(1)) if m else None, detail)
    if prob.status in (pulp.LpStatusNotSolved, pulp.LpStatusOptimal):
        m = _CBC_BOUND.search(log)
        return EngineResult("unknown", None, float(m.group(1)) if m else None, detail)
    raise RuntimeError(f"CBC failed: {pulp.LpStatus[prob.status]}")


def solve_milp(problem: Problem, model: Model, scale: CostScale, budget: int | None,
               hint: list[int] | None, *, engine: str, deadline: float, threads: int, seed: int,
               node_limit: int | None = None, tie_break: bool = True) -> Solved:
    """Least cost, then (``tie_break``) least memory at that cost; ``node_limit`` bounds each run's
    branch-and-bound nodes (a deterministic stop, unlike the wall clock)."""
    # lexicographic in two solves: a tie-break term in one objective stops CBC from using the
    # objective's integrality and it cannot close the gap
    run = run_highs_model if engine == "highs" else run_cbc
    cmax = max(model.cost.values(), default=0.0)
    integral = scale.exact and (cmax == 0 or (scale.quantum > 0 and
                                              cmax / scale.quantum <= _LATTICE_MAX_UNITS))
    if integral:  # costs are integers in units of their quantum: an exact integral objective
        unit = scale.quantum if cmax > 0 else 1.0
        obj = {i: float(c // scale.gcd) for i, c in scale.int_cost.items()}
        gap_abs = 0.99  # any incumbent within one unit of the bound is optimal
    else:
        unit = cmax
        obj = {i: c / cmax for i, c in model.cost.items()}
        gap_abs = _MILP_GAP_ABS_FLOAT
    t0 = time.perf_counter()
    res = run(model, obj, budget, hint, time_limit_s=max(deadline - t0, 0.01), threads=threads,
              seed=seed, gap_abs=gap_abs, node_limit=node_limit)
    phase1_s = time.perf_counter() - t0
    bound = None
    if res.bound is not None:
        bound = unit * math.ceil(res.bound - 1e-6) if integral else res.bound * unit
        bound = max(bound, 0.0)
    detail: dict[str, object] = {"cost_unit": unit, "integral_costs": integral, "tie_break": "none"}
    if res.values is None:
        return Solved(res, bound, None, integral, detail)
    saved = saved_set(model, res.values)
    if res.status != "optimal" or not model.mem_var or not tie_break:
        return Solved(res, bound, saved, integral, detail)

    # phase 2: least memory among plans of (at most) the optimal cost, started from phase 1,
    # for a fifth of phase 1's time (at least 1 s)
    left = min(deadline - time.perf_counter(), max(1.0, 0.2 * phase1_s))
    if left <= 0.05:
        detail["tie_break"] = "skipped (time limit)"
        return Solved(res, bound, saved, integral, detail)
    cost1 = sum(c * res.values[i] for i, c in obj.items())
    cap = cost1 + 0.5 if integral else cost1 * (1 + 1e-9) + 1e-12
    g = math.gcd(*model.mem_size)
    mem_obj: dict[int, float] = {}
    for y, size in zip(model.mem_var, model.mem_size):
        mem_obj[y] = mem_obj.get(y, 0.0) + size // g
    res2 = run(model, mem_obj, budget, res.values, time_limit_s=left, threads=threads,
               seed=seed, gap_abs=0.99, cap=(obj, cap), node_limit=node_limit)
    detail["tie_break"] = "exact" if res2.status == "optimal" else "best found (time limit)"
    detail["tie_break_s"] = time.perf_counter() - t0 - phase1_s
    if "nodes" in res2.detail:
        detail["tie_break_nodes"] = res2.detail["nodes"]
    if res2.values is not None:
        saved2 = saved_set(model, res2.values)
        p1 = plan_from_saved(problem, saved, solver="milp", status=Status.OPTIMAL)
        p2 = plan_from_saved(problem, saved2, solver="milp", status=Status.OPTIMAL)
        # floating-point tolerances must not trade cost for memory: keep phase 2 only if no costlier
        if (p2.recompute_cost <= p1.recompute_cost + 1e-12 * max(1.0, p1.recompute_cost)
                and p2.saved_bytes < p1.saved_bytes):
            saved = saved2
    return Solved(res, bound, saved, integral, detail)

