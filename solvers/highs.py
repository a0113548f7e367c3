"""The one HiGHS driver: a 0-1 program as rows, solved by highspy.

``run_highs`` takes a program written as sparse rows (``Program``) and returns what HiGHS proved
(``HighsAnswer``). Two writers feed it: ``solvers.mip_milp`` (the saved-bytes program of
``solvers.mip_model``) and ``program_from_cpsat`` (any CP-SAT model made of boolean clauses and
linear constraints: the peak relaxation of ``solvers.peak.rows`` is written once, as a CP-SAT
model, and a MIP solver's LP bound suits its linear rows). highspy directly: the matrix goes in as
one CSR block and ``setSolution`` gives the warm start (PuLP's HiGHS interface adds rows one by one
and has no warm start).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import interrupt

# HiGHS's presolve rule number of probing (its option presolve_rule_off is a bit mask of rules)
PRESOLVE_RULE_PROBING = 15
# model statuses after which HiGHS's answer (a solution, a bound, or neither) can be read
_ANSWERED = ("kOptimal", "kTimeLimit", "kInterrupt", "kSolutionLimit", "kIterationLimit",
             "kObjectiveBound", "kObjectiveTarget")


@dataclass
class Program:
    """``min cost . x`` over columns with bounds ``[lower, upper]`` (``integer``: 0-1 or integer,
    else continuous) and rows ``row_lower <= sum(a * x) <= row_upper``; each row a dict column ->
    coefficient."""

    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integer: list[bool]
    rows: list[dict[int, float]]
    row_lower: list[float]
    row_upper: list[float]


@dataclass
class HighsAnswer:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown" | "failed"
    values: list[int] | None  # the first ``n_values`` columns, rounded
    bound: float | None  # proven lower bound on the objective (its units)
    objective: float | None
    detail: dict[str, object] = field(default_factory=dict)


# the process's stdout is switched off while a HiGHS instance is made: one thread at a time, or
# one thread's restore can leave it off for good
_quiet_lock = threading.Lock()


def quiet_highs(highspy: Any) -> Any:
    """A HiGHS instance, without the banner its constructor prints to the process's stdout (it
    comes before any option can turn output off, and lands in the middle of a run's table)."""
    with _quiet_lock:
        return _made_quietly(highspy)


def _made_quietly(highspy: Any) -> Any:
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


def _lp(highspy: Any, p: Program) -> Any:
    n, m = len(p.cost), len(p.rows)
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = m
    lp.col_cost_ = np.asarray(p.cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(p.lower, dtype=np.float64)
    lp.col_upper_ = np.asarray(p.upper, dtype=np.float64)
    lp.row_lower_ = np.asarray(p.row_lower, dtype=np.float64)
    lp.row_upper_ = np.asarray(p.row_upper, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = m
    lengths = np.fromiter((len(r) for r in p.rows), dtype=np.int64, count=m)
    nnz = int(lengths.sum())
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lp.a_matrix_.index_ = np.fromiter((j for r in p.rows for j in r), dtype=np.int32, count=nnz)
    lp.a_matrix_.value_ = np.fromiter((a for r in p.rows for a in r.values()), dtype=np.float64,
                                      count=nnz)
    kinds = highspy.HighsVarType
    lp.integrality_ = [kinds.kInteger if i else kinds.kContinuous for i in p.integer]
    return lp


def run_highs(p: Program, *, time_limit_s: float, n_values: int | None = None,
              hint: Sequence[int] | None = None, rel_gap: float = 1e-4, abs_gap: float | None = None,
              seed: int | None = None, probing: bool = True,
              node_limit: int | None = None, on_solution: Callable[[list[int]], None] | None = None,
              stop: threading.Event | None = None) -> HighsAnswer:
    """Solve ``p`` with HiGHS in ``time_limit_s`` (building the model counts). ``hint``: a start
    solution; ``probing``: HiGHS's presolve probes the binaries (off where the program solves at its
    root anyway and the probing is most of the time). HiGHS's bound scaling (``user_bound_scale``)
    stays off: with its presolve's probing it has called a costlier plan optimal (#43). No thread
    count: HiGHS's thread pool is one per process, of the size its first solve set, and a solve
    asking another size fails at once (status "Not Set"). ``on_solution``: called (from HiGHS's
    thread) with the first ``n_values`` values, rounded, of each better solution HiGHS finds on
    the way. ``stop``: set, the solve stops at HiGHS's next check (a few a second) with what it
    has, as after Ctrl-C in the main thread.
    Status "failed": HiGHS stopped for a reason that gives no answer (``detail["highs_status"]``)."""
    import highspy

    t0 = time.perf_counter()
    n_values = len(p.cost) if n_values is None else n_values
    if any(not r and lo > 0 for r, lo in zip(p.rows, p.row_lower)):
        return HighsAnswer("infeasible", None, None, None)  # an empty clause
    h = quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", rel_gap)
    if abs_gap is not None:
        h.setOptionValue("mip_abs_gap", abs_gap)
    if seed is not None:
        h.setOptionValue("random_seed", seed)
    if not probing:
        h.setOptionValue("presolve_rule_off", 1 << PRESOLVE_RULE_PROBING)
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    if h.passModel(_lp(highspy, p)) == highspy.HighsStatus.kError:
        raise RuntimeError("HiGHS rejected the model")
    build_s = time.perf_counter() - t0
    h.setOptionValue("time_limit", max(time_limit_s - build_s, 0.01))
    if hint is not None:
        sol = highspy.HighsSolution()
        sol.col_value = [float(v) for v in hint]
        sol.value_valid = True
        h.setSolution(sol)
    stop = threading.Event() if stop is None else stop
    _subscribe(h, n_values, on_solution, stop)
    with interrupt.stop_on_sigint(stop.set):
        h.run()
    st = h.getModelStatus()
    ms = highspy.HighsModelStatus
    detail: dict[str, object] = {"highs_status": h.modelStatusToString(st), "build_s": build_s}
    if st == ms.kModelEmpty:  # nothing to decide: the lower bounds are optimal (costs >= 0)
        return HighsAnswer("optimal", [round(v) for v in p.lower[:n_values]], 0.0, 0.0, detail)
    if st in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
        return HighsAnswer("infeasible", None, None, None, detail)
    if st.name not in _ANSWERED:
        return HighsAnswer("failed", None, None, None, detail)
    info = h.getInfo()
    detail["nodes"] = int(info.mip_node_count)
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    col = h.getSolution().col_value if has_sol else None
    values = [round(v) for v in col[:n_values]] if col is not None else None
    objective = info.objective_function_value if has_sol else None
    if col is not None:
        # HiGHS 1.16 can return the start solution itself with the objective of a better one (when
        # its presolve improved the start in the reduced space): check, and solve again without
        got = float(np.dot(p.cost, np.asarray(col)))
        assert objective is not None  # a solution has an objective
        if abs(got - objective) > 1e-6 * max(1.0, abs(objective)):
            if hint is None:
                raise RuntimeError(f"HiGHS returned a solution of objective {got}, reported {objective}")
            again = run_highs(p, time_limit_s=max(time_limit_s - (time.perf_counter() - t0), 0.01),
                              n_values=n_values, rel_gap=rel_gap, abs_gap=abs_gap,
                              seed=seed, probing=probing, node_limit=node_limit, on_solution=on_solution,
                              stop=stop)
            again.detail["highs_start_dropped"] = True
            return again
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
    status = "optimal" if st == ms.kOptimal and has_sol else "feasible" if has_sol else "unknown"
    return HighsAnswer(status, values, bound, objective, detail)


def _subscribe(h: Any, n_values: int, on_solution: Callable[[list[int]], None] | None,
               stop: threading.Event) -> None:
    """HiGHS's MIP callbacks: its interrupt check asks ``stop`` (highspy's ``cancelSolve`` does
    nothing unless every simplex iteration calls into Python too); each better solution goes to
    ``on_solution``."""
    def interrupted(event: Any) -> None:
        if stop.is_set():
            event.interrupt()

    h.cbMipInterrupt.subscribe(interrupted)
    if on_solution is not None:
        def improved(event: Any) -> None:
            on_solution([round(v) for v in event.data_out.mip_solution[:n_values]])

        h.cbMipImprovingSolution.subscribe(improved)


# ---- CP-SAT models as programs -------------------------------------------------------------------
def program_from_cpsat(m: Any, costs: dict[int, float]) -> Program:
    """The CP-SAT model ``m`` (boolean clauses and linear constraints only) with objective ``costs``.

    Each clause ``OR(lits)`` (with enforcement literals ``e``: ``AND(e) => OR(lits)``) becomes
    ``sum(lit) >= 1`` over literals as ``x`` or ``1 - x``; a ``bool_and`` one row per literal; a
    linear constraint its two-sided row. Integer variables other than booleans (partial sums) are
    continuous: they only carry sums of booleans with integer weights."""
    proto = m.Proto()
    doms = [list(v.domain) for v in proto.variables]
    rows: list[dict[int, float]] = []
    lows: list[float] = []
    ups: list[float] = []

    def clause(lits: list[int]) -> None:
        # sum of literals >= 1, a negated literal (-i-1) being 1 - x_i
        row: dict[int, float] = {}
        const = 0.0
        for lit in lits:
            if lit >= 0:
                row[lit] = row.get(lit, 0.0) + 1.0
            else:
                row[-lit - 1] = row.get(-lit - 1, 0.0) - 1.0
                const += 1.0
        rows.append({j: a for j, a in row.items() if a})
        lows.append(1.0 - const)
        ups.append(math.inf)

    for c in proto.constraints:
        unless = [-e - 1 for e in c.enforcement_literal]  # AND(e) => ... is OR(not e, ...)
        if c.has_bool_or():
            clause(list(c.bool_or.literals) + unless)
        elif c.has_bool_and():
            for lit in c.bool_and.literals:
                clause([lit] + unless)
        elif c.has_linear() and not unless:
            row: dict[int, float] = {}
            for v, a in zip(c.linear.vars, c.linear.coeffs):
                row[v] = row.get(v, 0.0) + float(a)
            dom = list(c.linear.domain)
            if len(dom) != 2:
                raise ValueError("HiGHS: a linear constraint with a domain of holes")
            rows.append({j: a for j, a in row.items() if a})
            lows.append(-math.inf if dom[0] <= -(2**62) else float(dom[0]))
            ups.append(math.inf if dom[1] >= 2**62 else float(dom[1]))
        else:
            raise ValueError(f"HiGHS: unsupported CP-SAT constraint {c}")
    cost = np.zeros(len(doms))
    for i, c in costs.items():
        cost[i] += c
    return Program(cost=cost, lower=np.array([d[0] for d in doms], dtype=np.float64),
                   upper=np.array([d[-1] for d in doms], dtype=np.float64),
                   integer=[d[-1] - d[0] <= 1 for d in doms], rows=rows, row_lower=lows,
                   row_upper=ups)


def solve_with_highs(m: Any, costs: dict[int, float], n_values: int, *, time_limit_s: float,
                     rel_gap: float = 1e-4, probing: bool = True, node_limit: int | None = None,
                     on_solution: Callable[[list[int]], None] | None = None,
                     stop: threading.Event | None = None) -> HighsAnswer:
    """Minimize ``sum(costs[i] * x_i)`` over the CP-SAT model ``m`` with HiGHS; the answer's values
    are the first ``n_values`` variables (``on_solution``, ``stop``: as ``run_highs``'s)."""
    t0 = time.perf_counter()
    p = program_from_cpsat(m, costs)
    got = run_highs(p, time_limit_s=max(time_limit_s - (time.perf_counter() - t0), 0.05),
                    n_values=n_values, rel_gap=rel_gap, probing=probing,
                    node_limit=node_limit, on_solution=on_solution, stop=stop)
    if got.status == "failed":
        got.status = "unknown"  # a relaxation that proved nothing: its callers fall back to 0
    return got
