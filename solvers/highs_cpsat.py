"""Solve a CP-SAT model made only of boolean clauses and linear constraints with HiGHS.

The peak relaxation (``solvers.peak_bound``) is written once, as a CP-SAT model. Its conditions
are linear, and a MIP solver's LP bound suits them: HiGHS proves the relaxation's optimum at the
LLaMA-7B shape in ~2-3 s, where CP-SAT had not closed it in 18 s. Each clause ``OR(lits)`` (with
enforcement literals ``e``: ``AND(e) => OR(lits)``) becomes ``sum(lit) >= 1`` over literals as
``x`` or ``1 - x``; a ``bool_and`` one row per literal; a linear constraint its two-sided row.
Integer variables other than booleans (partial sums) are continuous: they only carry sums of
booleans with integer weights.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

# bounds above this are scaled down for HiGHS (see solve_with_highs)
BOUND_SCALE_ABOVE = 1e6
# HiGHS's presolve rule number of probing (its option presolve_rule_off is a bit mask of rules)
PRESOLVE_RULE_PROBING = 15


@dataclass
class HighsAnswer:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    values: list[int] | None  # the first ``n_values`` variables of the model
    bound: float | None  # proven lower bound on the objective (its units)
    objective: float | None


def _rows(proto: Any) -> tuple[list[dict[int, float]], list[float], list[float]]:
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
    return rows, lows, ups


def solve_with_highs(m: Any, costs: dict[int, float], n_values: int, *, time_limit_s: float,
                     rel_gap: float = 1e-4, probing: bool = True) -> HighsAnswer:
    """Minimize ``sum(costs[i] * x_i)`` over the CP-SAT model ``m`` with HiGHS. ``probing``:
    HiGHS's presolve probes the binaries (off: where the program solves at its root anyway, the
    probing is most of the time)."""
    import highspy

    from .mip import _quiet_highs

    t0 = time.perf_counter()
    proto = m.Proto()
    doms = [list(v.domain) for v in proto.variables]
    n = len(doms)
    rows, lows, ups = _rows(proto)
    if any(not r and lo > 0 for r, lo in zip(rows, lows)):
        return HighsAnswer("infeasible", None, None, None)  # an empty clause
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(rows)
    cost = np.zeros(n)
    for i, c in costs.items():
        cost[i] += c
    lp.col_cost_ = cost
    lp.col_lower_ = np.array([d[0] for d in doms], dtype=np.float64)
    lp.col_upper_ = np.array([d[-1] for d in doms], dtype=np.float64)
    lp.row_lower_ = np.array(lows, dtype=np.float64)
    lp.row_upper_ = np.array(ups, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = len(rows)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lp.a_matrix_.index_ = np.fromiter((j for r in rows for j in r), dtype=np.int32, count=int(lengths.sum()))
    lp.a_matrix_.value_ = np.fromiter((a for r in rows for a in r.values()), dtype=np.float64,
                                      count=int(lengths.sum()))
    binary = highspy.HighsVarType.kInteger
    lp.integrality_ = [binary if d[-1] - d[0] <= 1 else highspy.HighsVarType.kContinuous for d in doms]
    h = _quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", rel_gap)
    if not probing:
        h.setOptionValue("presolve_rule_off", 1 << PRESOLVE_RULE_PROBING)
    # bounds in bytes (the peak rows' right-hand sides, their continuous columns) scaled down by a
    # power of two, as HiGHS's own warning advises: the root's cuts then raise the bound in 20 s
    # as far as 51 s of branching did (measured, 7B shape at 0.45x, a cut round's program)
    wide = [b for d in doms if d[-1] - d[0] > 1 for b in (d[0], d[-1])]  # the continuous columns
    big = max((abs(b) for b in [*lows, *ups, *wide] if math.isfinite(b)), default=0.0)
    if big > BOUND_SCALE_ABOVE:
        h.setOptionValue("user_bound_scale", -math.ceil(math.log2(big / BOUND_SCALE_ABOVE)))
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        raise RuntimeError("HiGHS rejected the peak relaxation's model")
    # the conversion and passModel count too (64-layer small LLaMA: solves ran 0.4-0.9 s over)
    h.setOptionValue("time_limit", max(time_limit_s - (time.perf_counter() - t0), 0.05))
    from . import interrupt
    with interrupt.stop_on_sigint(lambda: h.cancelSolve()):
        h.run()
    st = h.getModelStatus()
    ms = highspy.HighsModelStatus
    if st in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
        return HighsAnswer("infeasible", None, None, None)
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2
    values = [int(round(v)) for v in h.getSolution().col_value[:n_values]] if has_sol else None
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
    status = "optimal" if st == ms.kOptimal and has_sol else "feasible" if has_sol else "unknown"
    return HighsAnswer(status, values, bound, info.objective_function_value if has_sol else None)
