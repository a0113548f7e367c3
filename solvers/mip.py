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

Solvers: ``cpsat`` (OR-Tools CP-SAT) and ``milp`` (PuLP + CBC by default, or HiGHS driven through
highspy). All are warm-started from the best min-cut plan that fits the budget (a short bisection
over ``lam``), which is also the fallback when a solver finds nothing in time.

Objective scaling and the memory tie-break (among equal-cost plans, the one saving fewer bytes):

* CP-SAT needs integers. Costs are scaled by a power of two ``K`` (exact in floating point) and
  rounded *down*: ``C_v = floor(K * cost_v)``, with ``K`` the largest power of two such that
  ``sum C_v <= 2**cost_bits``. Rounding down makes ``sum C_v r_v / K`` a lower bound on the true
  cost of every plan, so CP-SAT's bound divided by ``K`` is a valid bound on the true cost. The
  resolution ``1/K`` (``extra["cost_resolution"]``) is about ``total cost * 2**-cost_bits``, with
  cost_bits = 50 - tie_bits: 34 up to 1k storages, 28 at 40k (2 ns for a 0.5 s total, far below
  any cost model's accuracy). The plan CP-SAT calls optimal is within ``(#recomputed)/K`` of the
  true optimum, and exactly optimal when every cost is a multiple of ``1/K`` (integer costs, or
  floats with few binary digits). The tie-break is lexicographic in one objective,
  ``W * sum C_v r_v + sum mq_g y_g`` with memory quantized to ``mq_g``, ``sum mq_g < W =
  2**tie_bits`` (exact bytes while the total fits in ``tie_bits`` >= 16 bits): a unit of cost
  outweighs all memory, so the tie-break cannot change which cost is optimal. The search stops as
  soon as the cost part is proven (``extra["tie_break"]`` says whether the tie-break was).
* The MILP solvers solve lexicographically in two runs: least cost, then least memory subject to
  ``cost <= optimum`` started from the first solution (kept only if its true cost is no higher).
  Costs go in as integers in units of their common quantum when they have one (at most 1e8
  units), which lets CBC and HiGHS stop as soon as the gap is below one unit; otherwise as floats
  divided by the largest cost, with relative gap 1e-9. (A tie-break term inside one objective
  makes the objective fractional and CBC then cannot close the gap.)

``objective`` and ``bound`` are always reported in true recompute-cost units (seconds), without the
tie-break. When no two saveable counted values share a storage, the min-cut sweep also gives a
Lagrangian lower bound (``extra["lagrangian_bound"]``): for any plan P within the budget B,
``cut(lam) <= bytes(P) + lam * cost(P) <= B + lam * cost(P)``, so ``cost(P) >= (cut(lam) - B) / lam``.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import interrupt, progress
from .mincut import _INF_BITS, InfeasibleError, lam_range, solve_mincut
from .mip_model import Model, build_model, hint_from_plan, normalize_saved, presolve as presolve_model, tie
from .problem import Plan, Problem, Status, plan_from_saved
from .registry import register
from .symmetry import find_repeated

# CP-SAT objective W * sum C + sum mq stays below 2**50: exact in doubles, and well below the
# magnitudes (objective near 2**57 and up) where CP-SAT's LP was seen to return wrong "optimal" answers
_COST_OBJ_BITS = 50
_LATTICE_MAX_UNITS = 1e8  # MILP costs go in as integers (units of their quantum) up to this size
_MILP_GAP_REL = 1e-9  # for float costs; integral objectives stop below one unit instead
_MILP_GAP_ABS_FLOAT = 1e-9
# CP-SAT: this model needs the LP with every clause linearized (``max_lp``, linearization level 2)
# to get a useful bound; the default portfolio only runs it from 8 workers on. Its presolve costs
# more than it gains on these clause-only models (measured: 3-8 s vs 1.5 s at 3k values).
_CPSAT_SUBSOLVERS = ("max_lp", "core", "default_lp", "reduced_costs", "pseudo_costs",
                     "quick_restart", "lb_tree_search")


class BudgetInfeasibleError(InfeasibleError):
    """The budget is below the smallest saved bytes of any valid plan."""

    def __init__(self, budget: int, min_feasible_bytes: int | None, *, proven: bool = True) -> None:
        self.budget = budget
        self.min_feasible_bytes = min_feasible_bytes
        self.proven = proven
        if min_feasible_bytes is None:
            detail = "the smallest feasible saved bytes could not be determined in the time limit"
        elif proven:
            detail = f"the smallest feasible saved bytes is {min_feasible_bytes}"
        else:
            detail = (f"the smallest saved bytes found is {min_feasible_bytes} "
                      "(not proven minimal within the time limit)")
        super().__init__(f"budget {budget} bytes is infeasible: {detail}")


class MIPTimeLimitError(TimeoutError):
    """The solver found no plan in its time limit and no warm-start plan fits the budget."""


# ---- objective scaling -------------------------------------------------------------------------
@dataclass(frozen=True)
class _CostScale:
    """Integer costs for CP-SAT (``C = floor(K * cost)``) and the memory tie-break weights."""

    k: float  # cost multiplier, a power of two
    int_cost: dict[int, int]
    w: int  # one unit of integer cost in the CP-SAT objective; > sum(mem_q)
    mem_q: list[int]  # quantized memory tie-break per mem_var
    exact: bool  # every cost is exactly a multiple of 1/K (no rounding happened)
    quantum: float  # common quantum of the costs when exact (gcd / K), else 0
    gcd: int  # gcd of the positive integer costs (1 when there are none)

    @staticmethod
    def of(model: Model) -> "_CostScale":
        n_mem = len(model.mem_size)
        tie_bits = max(16, n_mem.bit_length() + 6)
        total_m = sum(model.mem_size)
        cap = 2**tie_bits - 1
        if total_m <= cap:
            mem_q = list(model.mem_size)
        else:  # round up so every storage keeps a positive weight; sum stays <= cap
            unit = -(-total_m // (cap - n_mem))
            mem_q = [-(-m // unit) for m in model.mem_size]
        cost_bits = _COST_OBJ_BITS - tie_bits
        keys = list(model.cost)
        c = np.array([model.cost[i] for i in keys], dtype=np.float64)
        total_c = float(c.sum()) if len(c) else 0.0
        if total_c > 0:
            # largest power of two K with total * K <= 2**cost_bits (a power of two scales exactly)
            k = math.ldexp(1.0, cost_bits - math.frexp(total_c)[1])
            ci = np.floor(c * k)
            exact = bool(np.all(ci == c * k))
            ints = ci.astype(np.int64)
            g = int(np.gcd.reduce(ints[ints > 0])) if np.any(ints > 0) else 1
            quantum = g / k if exact else 0.0
            int_cost = {i: int(x) for i, x in zip(keys, ints.tolist()) if x > 0}
        else:
            k, exact, quantum, int_cost, g = 1.0, True, 0.0, {}, 1
        return _CostScale(k=k, int_cost=int_cost, w=2**tie_bits, mem_q=mem_q, exact=exact,
                          quantum=quantum, gcd=g)


# ---- engines -----------------------------------------------------------------------------------
@dataclass
class _Result:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    values: list[int] | None
    bound: float | int | None  # in the engine's objective units (an exact int for CP-SAT)
    detail: dict[str, object] = field(default_factory=dict)


def cpsat_program(model: Model, objective: dict[int, int | float], budget: int | None,
                  extend: Callable[[Any, list[Any]], None] | None = None) -> tuple[Any, list[Any]]:
    """The program as a CP-SAT model over booleans ``x`` (indices of the program's variables), its
    objective set; ``extend(m, x)`` adds further conditions (the peak relaxation). Float objective
    weights are for ``solvers.highs_cpsat``, which solves the same model with HiGHS."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x = [m.new_bool_var("") for _ in range(model.num_vars)]
    for i, lb in enumerate(model.lower):
        if lb:
            m.add(x[i] == 1)
    add_or, add_imp = m.add_bool_or, m.add_implication
    for lits in model.covers:
        add_or([x[i] for i in lits])
    for a, bs in model.implications:
        if len(bs) == 1:
            add_imp(x[a], x[bs[0]])
        else:  # r_v => s_u | r_u
            add_or([x[a].Not()] + [x[b] for b in bs])
    for y, members in model.storage_links:
        for s in members:
            add_imp(x[s], x[y])
    if budget is not None and sum(model.mem_size) > budget:
        m.add(cp_model.LinearExpr.weighted_sum([x[i] for i in model.mem_var], model.mem_size) <= budget)
    if extend is not None:  # further conditions over the same booleans (the peak relaxation)
        extend(m, x)
    keys = list(objective)
    m.minimize(cp_model.LinearExpr.weighted_sum([x[i] for i in keys], [objective[i] for i in keys]))
    return m, x


def _run_cpsat(model: Model, objective: dict[int, int], budget: int | None, hint: list[int] | None,
               *, time_limit_s: float, threads: int, seed: int, presolve: bool = False,
               proven: Callable[[float, float], bool] | None = None,
               extend: Callable[[Any, list[Any]], None] | None = None,
               report_as: Callable[[float], float] | None = None) -> _Result:
    """Solve with CP-SAT. Once ``proven(incumbent, bound)`` holds (objective values as floats;
    e.g. the part of the objective that matters is proven optimal), the search gets a grace period
    of a fifth of the time it took to get there (at least 1 s) and is then stopped. With
    ``report_as`` (an objective value -> the true cost), a listener of ``solvers.progress`` hears of the
    incumbent and bound."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    m, x = cpsat_program(model, objective, budget, extend)
    keys = list(objective)
    if hint is not None:
        for xi, h in zip(x, hint):
            m.add_hint(xi, h)

    build_s = time.perf_counter() - t0
    solver = cp_model.CpSolver()
    # after a Ctrl-C, later solves of the same call only read back their hint
    solver.parameters.max_time_in_seconds = 0.01 if interrupt.requested() else max(time_limit_s - build_s, 0.01)
    solver.parameters.catch_sigint_signal = False  # ours: stops the search and says so
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_presolve = presolve
    if threads <= 1:
        solver.parameters.linearization_level = 2
    elif threads < 8:
        solver.parameters.subsolvers.extend(_CPSAT_SUBSOLVERS)
    watch = None
    watcher = None
    # callbacks only where they were safe before: with ``proven`` (as always), or on a plain model
    # (CP-SAT 9.15 crashes calling them on the peak relaxation's cumulative constraints)
    report = report_as is not None and progress.listening() and (proven is not None or extend is None)
    if proven is not None or report:
        start = time.perf_counter()
        lock = threading.Lock()
        finished = threading.Event()
        proven_at: list[float] = []  # when the cost was proven (set from CP-SAT's threads)

        class _Watch(cp_model.CpSolverSolutionCallback):
            best, bound = math.inf, -math.inf

            def check(self) -> None:  # called from CP-SAT's threads: only records (starting a
                # thread from there crashes the interpreter)
                with lock:
                    if proven is not None and not proven_at and proven(self.best, self.bound):
                        proven_at.append(time.perf_counter())

            def on_solution_callback(self) -> None:
                self.best = min(self.best, self.objective_value)
                self.check()

            def on_bound(self, b: float) -> None:
                self.bound = max(self.bound, b)
                self.check()

        def poll() -> None:  # started from this thread, before the solve: stops the search after
            # the grace period, and reports progress (from here, not from CP-SAT's threads)
            shown = None
            while not finished.wait(0.05):
                with lock:
                    due = proven_at and time.perf_counter() - proven_at[0] >= max(
                        1.0, 0.2 * (proven_at[0] - start))
                    if due and not finished.is_set():
                        solver.stop_search()
                        return
                    now = (watch.best, watch.bound)
                if report and now != shown and report_as is not None:
                    shown = now
                    progress.report(*(report_as(v) if math.isfinite(v) else None for v in now))

        watch = _Watch()
        solver.best_bound_callback = watch.on_bound
        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
    try:
        with interrupt.stop_on_sigint(solver.stop_search):
            status = solver.solve(m, watch)
    finally:
        if watcher is not None:
            with lock:
                finished.set()
            watcher.join()
            solver.best_bound_callback = None
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {m.validate()}")
    detail: dict[str, object] = {"cpsat_status": solver.status_name(status), "build_s": build_s}
    if interrupt.requested():
        detail["interrupted"] = True
    if status == cp_model.INFEASIBLE:
        return _Result("infeasible", None, None, detail)
    values = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = [int(solver.boolean_value(xi)) for xi in x]
    bound: int | None
    if status == cp_model.OPTIMAL:
        assert values is not None
        bound = sum(objective[i] * values[i] for i in keys)
    else:
        # the double bound loses precision above 2**53: prefer the exact integer one
        b = solver.best_objective_bound
        inner = solver.response_proto.inner_objective_lower_bound
        if math.isfinite(b) and abs(inner - b) <= max(2.0, abs(b) * 1e-12):
            bound = int(inner)
        else:
            bound = math.floor(b * (1 - 2.0**-50)) if math.isfinite(b) else None
    return _Result("optimal" if status == cp_model.OPTIMAL else
                   "feasible" if values is not None else "unknown", values, bound, detail)


def _milp_rows(model: Model) -> tuple[list[list[int]], list[list[float]], list[float]]:
    """Constraint rows (columns, coefficients, lower bound) as ``sum >= lower``."""
    cols: list[list[int]] = []
    coefs: list[list[float]] = []
    lows: list[float] = []
    for lits in model.covers:
        cols.append(lits)
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


def _quiet_highs(highspy: Any) -> Any:
    """A HiGHS instance, without the banner its constructor prints to the process's stdout (it
    comes before any option can turn output off, and lands in the middle of a run's table)."""
    import sys
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _run_highs(model: Model, objective: dict[int, float], budget: int | None,
               hint: list[int] | None, *, time_limit_s: float, threads: int, seed: int = 0,
               cap: tuple[dict[int, float], float] | None = None, gap_abs: float) -> _Result:
    # highspy directly: the model goes in as one CSR matrix, and setSolution gives the warm start
    # (PuLP's HiGHS interface adds rows one by one and has no warm start).
    import highspy

    t0 = time.perf_counter()
    cols, coefs, lows = _milp_rows(model)
    inf = highspy.kHighsInf
    ups = [inf] * len(cols)
    if budget is not None and sum(model.mem_size) > budget:
        cols.append(list(model.mem_var))
        coefs.append([float(s) for s in model.mem_size])
        lows.append(-inf)
        ups.append(float(budget))
    if cap is not None:
        cols.append(list(cap[0]))
        coefs.append(list(cap[0].values()))
        lows.append(-inf)
        ups.append(cap[1])
    lp = highspy.HighsLp()
    lp.num_col_ = model.num_vars
    lp.num_row_ = len(cols)
    cost = np.zeros(model.num_vars)
    for i, c in objective.items():
        cost[i] += c
    lp.col_cost_ = cost
    lp.col_lower_ = np.asarray(model.lower, dtype=np.float64)
    lp.col_upper_ = np.ones(model.num_vars)
    lp.row_lower_ = np.asarray(lows, dtype=np.float64)
    lp.row_upper_ = np.asarray(ups, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = model.num_vars
    lp.a_matrix_.num_row_ = len(cols)
    lengths = np.fromiter((len(c) for c in cols), dtype=np.int64, count=len(cols))
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lp.a_matrix_.index_ = np.fromiter((j for c in cols for j in c), dtype=np.int32,
                                      count=int(lengths.sum()))
    lp.a_matrix_.value_ = np.fromiter((v for c in coefs for v in c), dtype=np.float64,
                                      count=int(lengths.sum()))
    lp.integrality_ = [highspy.HighsVarType.kInteger] * model.num_vars
    h = _quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(time_limit_s - (time.perf_counter() - t0), 0.01))
    h.setOptionValue("mip_rel_gap", _MILP_GAP_REL)
    h.setOptionValue("mip_abs_gap", gap_abs)
    h.setOptionValue("threads", max(1, threads))
    h.setOptionValue("random_seed", seed)
    h.passModel(lp)
    build_s = time.perf_counter() - t0
    if hint is not None:
        sol = highspy.HighsSolution()
        sol.col_value = [float(v) for v in hint]
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    st = h.getModelStatus()
    info = h.getInfo()
    ms = highspy.HighsModelStatus
    detail: dict[str, object] = {"highs_status": h.modelStatusToString(st), "build_s": build_s}
    if st == ms.kModelEmpty:  # nothing to decide: the lower bounds are optimal (costs >= 0)
        return _Result("optimal", list(model.lower), 0.0, detail)
    if st in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
        return _Result("infeasible", None, None, detail)
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = [int(round(v)) for v in h.getSolution().col_value] if has_sol else None
    if values is not None:
        # HiGHS 1.16 can return the start solution itself with the objective of a better one (when
        # its presolve improved the start in the reduced space): check, and solve again without
        got = sum(c * values[i] for i, c in objective.items())
        want = info.objective_function_value
        if abs(got - want) > 1e-6 * max(1.0, abs(want)):
            if hint is not None:
                left = max(time_limit_s - (time.perf_counter() - t0), 0.01)
                again = _run_highs(model, objective, budget, None, time_limit_s=left,
                                   threads=threads, seed=seed, cap=cap, gap_abs=gap_abs)
                again.detail["highs_start_dropped"] = True
                return again
            raise RuntimeError(f"HiGHS returned a solution of objective {got}, reported {want}")
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
    status = ("optimal" if st == ms.kOptimal and has_sol else "feasible" if has_sol else "unknown")
    if st not in (ms.kOptimal, ms.kTimeLimit, ms.kInterrupt, ms.kSolutionLimit,
                  ms.kIterationLimit, ms.kObjectiveBound, ms.kObjectiveTarget):
        raise RuntimeError(f"HiGHS failed: {h.modelStatusToString(st)}")
    return _Result(status, values, bound, detail)


_CBC_BOUND = re.compile(r"^Lower bound:\s*(\S+)", re.MULTILINE)


def _run_cbc(model: Model, objective: dict[int, float], budget: int | None,
             hint: list[int] | None, *, time_limit_s: float, threads: int, seed: int = 0,
             cap: tuple[dict[int, float], float] | None = None, gap_abs: float) -> _Result:
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
    cols, coefs, lows = _milp_rows(model)
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
        opts = dict(msg=False, timeLimit=max(time_limit_s - build_s, 0.01), threads=threads,
                    gapRel=_MILP_GAP_REL, gapAbs=gap_abs, warmStart=hint is not None,
                    logPath=log_path, keepFiles=False)
        solver = pulp.COIN_CMD(**opts)
        if not solver.available():  # no cbc on PATH: PuLP's bundled one (deprecated in PuLP 4)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                solver = pulp.PULP_CBC_CMD(**opts)
        solver.tmpDir = tmp  # PuLP's .mps/.sol/.mst files: removed with the directory, always
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as e:  # cbc exited abnormally: no answer, not a proof
            return _Result("unknown", None, None, {"cbc_error": str(e), "build_s": build_s})
        log = open(log_path).read() if os.path.exists(log_path) else ""
    detail: dict[str, object] = {"cbc_status": pulp.LpStatus[prob.status], "build_s": build_s}
    if prob.status == pulp.LpStatusInfeasible:
        # CBC also says "infeasible" when the time limit cuts its preprocessing short, so the
        # caller double-checks this claim
        return _Result("infeasible", None, None, detail)
    has_sol = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if prob.status == pulp.LpStatusOptimal and has_sol:
        values = [int(round(xi.varValue or 0.0)) for xi in x]
        obj = sum(c * values[i] for i, c in objective.items())
        if prob.sol_status == pulp.LpSolutionOptimal:
            return _Result("optimal", values, obj, detail)
        m = _CBC_BOUND.search(log)
        return _Result("feasible", values, float(m.group(1)) if m else None, detail)
    if prob.status in (pulp.LpStatusNotSolved, pulp.LpStatusOptimal):
        m = _CBC_BOUND.search(log)
        return _Result("unknown", None, float(m.group(1)) if m else None, detail)
    raise RuntimeError(f"CBC failed: {pulp.LpStatus[prob.status]}")


# ---- warm start ---------------------------------------------------------------------------------
@dataclass
class _WarmStart:
    plan: Plan | None  # the least-recompute min-cut plan within the budget
    lagrangian_bound: float | None
    cuts: int
    min_bytes: int | None  # proven smallest feasible saved bytes, when the sweep established it


def _warm_start(problem: Problem, model: Model, budget: int | None, *, cuts: int,
                deadline: float) -> _WarmStart:
    """A short ``lam`` sweep of exact min-cuts: best fitting plan, and a Lagrangian bound."""
    lo, hi = lam_range(problem)
    weights = [problem.save_weight(n.name) for n in problem.candidates if problem.can_save(n.name)]
    total_w = sum(w for w in weights if math.isfinite(w))
    sum_cost = sum(problem.recompute_cost_of(n.name) for n in problem.candidates
                   if problem.can_recompute(n.name))
    n_arcs = 2 * len(problem.candidates) + 1
    # valid only when the cut charges every plan exactly its saved bytes: no shared storages
    lagrange_ok = not model.shared and budget is not None
    best: Plan | None = None
    lb: float | None = None
    done = 0

    def better(p: Plan) -> bool:
        return best is None or _better(p, best)

    def cut(lam: float) -> Plan:
        nonlocal best, lb, done
        p = solve_mincut(problem, lam, budget=budget)
        done += 1
        if budget is None or p.saved_bytes <= budget:
            if better(p):
                best = p
        if lagrange_ok and lam > 0 and p.objective is not None:
            # the max-flow rounds capacities scaled to 2**_INF_BITS: allow that error in full
            total = total_w + lam * sum_cost
            slack = 0.5 * n_arcs * total / (2**_INF_BITS - 1)
            value = p.objective - slack - 1e-12 * abs(p.objective)
            cand = (value - budget) / lam
            lb = cand if lb is None else max(lb, cand)
        return p

    top = cut(hi)
    if budget is None or top.saved_bytes <= budget:
        return _WarmStart(top, lb, done, None)
    if cut(lo).saved_bytes > budget:
        # lam = 0 has integral capacities: exact, and equal to the least memory when no storage
        # is shared (every plan's saved bytes equal its summed save weights)
        zero = cut(0.0)
        exact = not model.shared and total_w < 2**_INF_BITS
        return _WarmStart(best, lb, done, zero.saved_bytes if exact else None)
    a, b = math.log(max(lo, 1e-300)), math.log(hi)
    while done < cuts and time.perf_counter() < deadline and b - a > 1e-6:
        mid = math.exp((a + b) / 2)
        if cut(mid).saved_bytes <= budget:
            a = math.log(mid)
        else:
            b = math.log(mid)
    return _WarmStart(best, lb, done, None)


# ---- the solve ---------------------------------------------------------------------------------
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
    res = _run_cpsat(model, obj, None, None, time_limit_s=time_limit_s, threads=threads, seed=seed)
    if res.status == "infeasible":  # not expected: the model without a budget always has a plan
        raise InfeasibleError("no valid plan (CP-SAT proved the model infeasible)")
    best = int(sum(c * res.values[i] for i, c in obj.items())) if res.values is not None else None
    return _MinBytes(best, int(res.bound) if res.bound is not None else 0, res.values)


def _saved_set(model: Model, values: Sequence[int]) -> list[str]:
    return [v for v, i in model.s_var.items() if values[i]] + model.free_saved


@dataclass
class _Solved:
    """An engine's answer mapped back to the problem, in true cost units."""

    result: _Result
    bound: float | None  # valid lower bound on the true recompute cost
    plan_saved: list[str] | None  # the saved set of the solution, if any
    exact: bool  # costs were represented exactly, so "optimal" is optimal for the true costs
    detail: dict[str, object] = field(default_factory=dict)


def _solve_cpsat(model: Model, scale: _CostScale, budget: int | None, hint: list[int] | None,
                 *, time_limit_s: float, threads: int, seed: int,
                 extend: Callable[[Any, list[Any]], None] | None = None,
                 tie_break: bool = True, presolve: bool = False) -> _Solved:
    # one lexicographic objective: W * (integer cost) + (quantized memory), sum(memory) < W;
    # without the tie-break, cost alone (and no solution callbacks: CP-SAT 9.15 crashes calling
    # them on models with cumulative constraints)
    w, g = (scale.w, scale.gcd) if tie_break else (1, scale.gcd)
    obj: dict[int, int] = {i: w * c for i, c in scale.int_cost.items()}
    for y, q in zip(model.mem_var, scale.mem_q) if tie_break else ():
        obj[y] = obj.get(y, 0) + q

    def cost_bound(b: int) -> int:
        # objective >= b and memory < W: integer cost >= floor(b / W), rounded up to a multiple
        # of the costs' gcd (every plan's integer cost is one)
        return -(-max(b // w, 0) // g) * g

    def cost_proven(incumbent: float, b: float) -> bool:
        # proving the memory tie-break can take far longer than proving the cost: once the cost
        # is proven the search only gets a grace period (objectives are below 2**53, so these
        # floats are exact integers)
        if not math.isfinite(incumbent) or not math.isfinite(b):
            return False
        return cost_bound(math.floor(b)) >= int(incumbent) // w

    res = _run_cpsat(model, obj, budget, hint, time_limit_s=time_limit_s, threads=threads,
                     seed=seed, proven=cost_proven if model.mem_var and tie_break else None,
                     extend=extend, presolve=presolve,
                     report_as=lambda v: (math.floor(v) // w) / scale.k)  # the cost part, in seconds
    detail: dict[str, object] = {"tie_break": "none"}
    bound = None
    if res.bound is not None:
        bound = cost_bound(int(res.bound)) / scale.k  # integer costs are <= K * true costs
    if res.values is not None:
        cost = sum(c * res.values[i] for i, c in scale.int_cost.items())
        if res.status == "optimal":
            detail["tie_break"] = "exact" if scale.mem_q == model.mem_size else "quantized memory"
        elif res.bound is not None and cost_bound(int(res.bound)) >= cost:
            res.status = "optimal"  # the cost is proven optimal; only the tie-break is not
            detail["tie_break"] = "best found (stopped after the cost was proven)"
    saved = _saved_set(model, res.values) if res.values is not None else None
    return _Solved(res, bound, saved, scale.exact, detail)


def _solve_milp(problem: Problem, model: Model, scale: _CostScale, budget: int | None,
                hint: list[int] | None, *, engine: str, deadline: float, threads: int,
                seed: int) -> _Solved:
    # lexicographic in two solves: least cost, then least memory at that cost (a tie-break term in
    # one objective stops CBC from using the objective's integrality and it cannot close the gap)
    run = _run_highs if engine == "highs" else _run_cbc
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
              seed=seed, gap_abs=gap_abs)
    phase1_s = time.perf_counter() - t0
    bound = None
    if res.bound is not None:
        bound = unit * math.ceil(res.bound - 1e-6) if integral else res.bound * unit
        bound = max(bound, 0.0)
    detail: dict[str, object] = {"cost_unit": unit, "integral_costs": integral, "tie_break": "none"}
    if res.values is None:
        return _Solved(res, bound, None, integral, detail)
    saved = _saved_set(model, res.values)
    if res.status != "optimal" or not model.mem_var:
        return _Solved(res, bound, saved, integral, detail)

    # phase 2: least memory among plans of (at most) the optimal cost, started from phase 1,
    # for a fifth of phase 1's time (at least 1 s)
    left = min(deadline - time.perf_counter(), max(1.0, 0.2 * phase1_s))
    if left <= 0.05:
        detail["tie_break"] = "skipped (time limit)"
        return _Solved(res, bound, saved, integral, detail)
    cost1 = sum(c * res.values[i] for i, c in obj.items())
    cap = cost1 + 0.5 if integral else cost1 * (1 + 1e-9) + 1e-12
    g = math.gcd(*model.mem_size)
    mem_obj: dict[int, float] = {}
    for y, size in zip(model.mem_var, model.mem_size):
        mem_obj[y] = mem_obj.get(y, 0.0) + size // g
    res2 = run(model, mem_obj, budget, res.values, time_limit_s=left, threads=threads,
               seed=seed, gap_abs=0.99, cap=(obj, cap))
    detail["tie_break"] = "exact" if res2.status == "optimal" else "best found (time limit)"
    if res2.values is not None:
        saved2 = _saved_set(model, res2.values)
        p1 = plan_from_saved(problem, saved, solver="milp", status=Status.OPTIMAL)
        p2 = plan_from_saved(problem, saved2, solver="milp", status=Status.OPTIMAL)
        # floating-point tolerances must not trade cost for memory: keep phase 2 only if no costlier
        if (p2.recompute_cost <= p1.recompute_cost + 1e-12 * max(1.0, p1.recompute_cost)
                and p2.saved_bytes < p1.saved_bytes):
            saved = saved2
    return _Solved(res, bound, saved, integral, detail)


def _solve_engine(problem: Problem, model: Model, scale: _CostScale, budget: int | None,
                  hint: list[int] | None, *, engine: str, deadline: float, threads: int,
                  seed: int) -> _Solved:
    if engine == "cpsat":
        return _solve_cpsat(model, scale, budget, hint, threads=threads, seed=seed,
                            time_limit_s=max(deadline - time.perf_counter(), 0.01))
    return _solve_milp(problem, model, scale, budget, hint, engine=engine, deadline=deadline,
                       threads=threads, seed=seed)


def _better(a: Plan, b: Plan) -> bool:
    return (a.recompute_cost, a.saved_bytes) < (b.recompute_cost, b.saved_bytes)


_TIE_FREE_LAYERS = 1


@dataclass
class _Tied:
    solved: _Solved | None  # the tied problem's answer (bound valid for the tied problem only)
    plan: Plan | None  # its plan, on the full problem
    extra: dict[str, object]


def _solve_tied(problem: Problem, model: Model, budget: int | None, warm: Plan | None, *,
                engine: str, threads: int, seed: int, deadline: float) -> _Tied:
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
    solved = _solve_engine(problem, tied, _CostScale.of(tied), budget, hint, engine=engine,
                           deadline=deadline, threads=threads, seed=seed)
    extra.update({"tie_vars": tied.num_vars, "tie_status": solved.result.status,
                  "tie_s": time.perf_counter() - t0})
    if solved.plan_saved is None:
        return _Tied(None, None, extra)
    plan = plan_from_saved(problem, solved.plan_saved, solver="tied", status=Status.FEASIBLE)
    extra["tie_cost"] = plan.recompute_cost
    return _Tied(solved, plan, extra)


def solve_mip(problem: Problem, budget: int | None, *, engine: str = "cpsat",
              time_limit_s: float = 60.0, threads: int = 2, seed: int = 0,
              warm_start_cuts: int = 16, presolve: bool = True, symmetry: str = "none") -> Plan:
    """The least-recompute plan whose saved bytes fit ``budget`` (None: no limit), by a MIP.

    Among plans of equal cost it returns one with the least saved bytes. ``engine``: "cpsat"
    (OR-Tools CP-SAT), "cbc" (PuLP + CBC) or "highs" (HiGHS). ``time_limit_s`` bounds the whole
    call (presolve, warm start, model build and solve; the solver gets what is left, at least
    10 ms). Raises ValueError for a negative budget, BudgetInfeasibleError when no plan fits,
    InfeasibleError when no plan exists at all, MIPTimeLimitError when nothing is found in time and
    no warm-start plan fits. The smallest feasible bytes reported for an infeasible budget come
    from the exact min-cut at ``lam = 0`` without shared storages, else from a CP-SAT solve.

    ``symmetry``: "none"; "tie" solves the smaller problem with one decision per group of values
    that repeated layers make interchangeable (``solvers.symmetry``; the last layer stays free to
    use what whole-layer steps leave of the budget), exactly for that restricted
    problem (the plan is valid but its status is never "optimal"; the full problem is solved
    instead if the tied one admits no plan); "warm" solves the tied problem in up to a third of
    the time and starts the full solve from its plan when that beats the min-cut warm start.
    """
    if symmetry not in ("none", "tie", "warm"):
        raise ValueError(f"unknown symmetry {symmetry!r}: use 'none', 'tie' or 'warm'")
    if engine not in ("cpsat", "cbc", "highs"):
        raise ValueError(f"unknown MIP engine {engine!r}: use 'cpsat', 'cbc' or 'highs'")
    if budget is not None:
        if isinstance(budget, float) and budget.is_integer():
            budget = int(budget)
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
            raise ValueError(f"budget must be an integer number of bytes or None, got {budget!r}")
        if budget < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget}")
        budget = int(budget)
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    name = "cpsat" if engine == "cpsat" else "milp"
    start = time.perf_counter()
    deadline = start + time_limit_s

    model = build_model(problem)
    if presolve:
        model = presolve_model(problem, model)
    t_model = time.perf_counter()
    warm = _warm_start(problem, model, budget, cuts=warm_start_cuts,
                       deadline=start + 0.25 * time_limit_s)
    t_warm = time.perf_counter()
    if warm.min_bytes is not None and budget is not None and warm.min_bytes > budget:
        raise BudgetInfeasibleError(budget, warm.min_bytes)
    # the warm start as the presolved program sees it: dominated savings replaced
    start_plan = None if warm.plan is None else plan_from_saved(
        problem, normalize_saved(model, warm.plan.saved), solver="mincut", status=Status.HEURISTIC)
    hint = None if start_plan is None else hint_from_plan(model, start_plan)
    scale = _CostScale.of(model)

    tied: _Tied | None = None
    if symmetry != "none":
        share = 1.0 if symmetry == "tie" else 1 / 3
        tied = _solve_tied(problem, model, budget, start_plan, engine=engine, threads=threads,
                           seed=seed, deadline=time.perf_counter()
                           + share * max(deadline - time.perf_counter(), 0.0))
        if symmetry == "warm" and tied.plan is not None and (
                warm.plan is None or _better(tied.plan, warm.plan)):
            hint = hint_from_plan(model, tied.plan)
    if symmetry == "tie" and tied is not None and tied.solved is not None:
        solved = tied.solved
    else:
        solved = _solve_engine(problem, model, scale, budget, hint, engine=engine,
                               deadline=deadline, threads=threads, seed=seed)
    res = solved.result
    t_solve = time.perf_counter()

    note = ""
    if res.status == "infeasible":
        # a min-cut plan within the budget refutes the claim (CBC makes it when its time limit
        # cuts preprocessing short); otherwise the least-memory solve decides, and names the
        # smallest feasible bytes for the error
        if warm.plan is None:
            if budget is None or warm.min_bytes is not None:  # both were caught earlier
                raise InfeasibleError("no valid plan (the solver proved the model infeasible)")
            mb = _min_feasible_bytes(model, time_limit_s=max(deadline - time.perf_counter(), 1.0),
                                     threads=threads, seed=seed)
            if mb.bound > budget or (engine == "cpsat" and (mb.best is None or mb.best > budget)):
                raise BudgetInfeasibleError(budget, mb.best, proven=mb.best == mb.bound)
            if mb.best is None or mb.best > budget:
                raise MIPTimeLimitError(
                    f"{engine} reported the budget {budget} bytes infeasible, and no plan within "
                    f"it was found in {time_limit_s:g} s (least found: {mb.best} bytes)")
            assert mb.values is not None
            solved = _Solved(_Result("feasible", mb.values, None), None,
                             _saved_set(model, mb.values), False)
            res = solved.result
            note = (f"{engine} reported the budget infeasible, but a least-memory solve found a "
                    "plan within it")
        else:
            solved = _Solved(_Result("unknown", None, None, res.detail), None, None, False)
            res = solved.result
            note = (f"{engine} reported the budget infeasible although a min-cut plan fits it "
                    "(CBC does so when its time limit cuts preprocessing short)")

    # costs are >= 0, so 0 is a valid bound when the solver proved nothing (gap 100%)
    lagrangian = warm.lagrangian_bound or 0.0
    if scale.exact and scale.quantum > 0:  # every plan's cost is a multiple of the quantum
        lagrangian = scale.quantum * math.ceil(lagrangian / scale.quantum - 1e-9)
    used_tie = tied is not None and solved is tied.solved
    # the tied problem's bound holds for the tied problem only: the full one may do better
    bound = max((None if used_tie else solved.bound) or 0.0, lagrangian)
    extra: dict[str, object] = {
        "backend": engine, "num_vars": model.num_vars, "presolve_merged": model.merged, "presolve_fixed": model.fixed, "num_constraints": model.num_constraints,
        "num_candidates": len(problem.candidates), "num_relevant": model.num_relevant,
        "model_s": t_model - start, "warm_start_s": t_warm - t_model, "solve_s": t_solve - t_warm,
        "warm_start_cuts": warm.cuts,
        "warm_start_cost": warm.plan.recompute_cost if warm.plan is not None else None,
        "lagrangian_bound": warm.lagrangian_bound, "cost_resolution": 1.0 / scale.k,
        "shared_storages": model.shared, **solved.detail, **res.detail,
    }
    if tied is not None:
        extra.update(tied.extra)
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
            f"budget {budget} bytes")
    if used_tie and solved.plan_saved is not None:
        # optimal for the restricted problem only; the min-cut warm start may still be cheaper
        status = Status.FEASIBLE if res.status == "optimal" else Status.TIME_LIMIT
        message = ("optimal for the tied problem (one decision per repeated-layer group)"
                   if res.status == "optimal" else "time limit reached on the tied problem")
        tied_plan = plan_from_saved(problem, saved, solver=name, status=status)
        if warm.plan is not None and _better(warm.plan, tied_plan):
            saved = sorted(warm.plan.saved)
            message += "; the min-cut warm start was cheaper and is returned"
    elif symmetry == "tie" and tied is not None:
        note = f"no plan for the tied problem ({tied.extra.get('tie_status')}): solved untied"
    if note:
        message = f"{note}; {message}"
    plan = plan_from_saved(problem, saved, solver=name, status=status, budget=budget)
    if budget is not None and plan.saved_bytes > budget:
        raise RuntimeError(f"{engine}: plan uses {plan.saved_bytes} bytes over the budget {budget}")
    objective = plan.recompute_cost
    bound = min(bound, objective)
    if status is Status.OPTIMAL and solved.exact and not used_tie:
        bound = objective  # costs were represented exactly: the solver's optimum is the truth
    return Plan(saved=plan.saved, recomputed=plan.recomputed, saved_bytes=plan.saved_bytes,
                recompute_cost=plan.recompute_cost, solver=name, status=status,
                solve_time_s=time.perf_counter() - start, objective=objective, bound=bound,
                message=message, budget=budget, extra=extra)


@register("cpsat")
def _cpsat_entry(problem: Problem, budget: int | None, *, time_limit_s: float = 60.0,
                 threads: int = 2, seed: int = 0, warm_start_cuts: int = 16,
                 symmetry: str = "none") -> Plan:
    return solve_mip(problem, budget, engine="cpsat", time_limit_s=time_limit_s, threads=threads,
                     seed=seed, warm_start_cuts=warm_start_cuts, symmetry=symmetry)


@register("milp")
def _milp_entry(problem: Problem, budget: int | None, *, backend: str = "cbc",
                time_limit_s: float = 60.0, threads: int = 2, seed: int = 0,
                warm_start_cuts: int = 16, symmetry: str = "none") -> Plan:
    if backend not in ("cbc", "highs"):
        raise ValueError(f"unknown MILP backend {backend!r}: use 'cbc' or 'highs'")
    return solve_mip(problem, budget, engine=backend, time_limit_s=time_limit_s, threads=threads,
                     seed=seed, warm_start_cuts=warm_start_cuts, symmetry=symmetry)
