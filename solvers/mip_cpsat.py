"""The CP-SAT side of the saved-bytes program (``solvers.mip``): objective scaling, the model, the
driver, and the scaled lexicographic solve. ``solvers.peak.relaxation`` extends the same model with
its peak rows.

Objective scaling and the memory tie-break (among equal-cost plans, the one saving fewer bytes):
CP-SAT needs integers. Costs are scaled by a power of two ``K`` (exact in floating point) and
rounded *down*: ``C_v = floor(K * cost_v)``, with ``K`` the largest power of two such that
``sum C_v <= 2**cost_bits``. Rounding down makes ``sum C_v r_v / K`` a lower bound on the true cost
of every plan, so CP-SAT's bound divided by ``K`` is a valid bound on the true cost. The resolution
``1/K`` (``extra["cost_resolution"]``) is about ``total cost * 2**-cost_bits``, with cost_bits =
50 - tie_bits: 34 up to 1k storages, 28 at 40k (2 ns for a 0.5 s total, far below any cost model's
accuracy). The plan CP-SAT calls optimal is within ``(#recomputed)/K`` of the true optimum, and
exactly optimal when every cost is a multiple of ``1/K`` (integer costs, or floats with few binary
digits). The tie-break is lexicographic in one objective, ``W * sum C_v r_v + sum mq_g y_g`` with
memory quantized to ``mq_g``, ``sum mq_g < W = 2**tie_bits`` (exact bytes while the total fits in
``tie_bits`` >= 16 bits): a unit of cost outweighs all memory, so the tie-break cannot change which
cost is optimal. The search stops soon after the cost part is proven (``extra["tie_break"]`` says
whether the tie-break was).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import interrupt, progress
from .mip_model import Model

# CP-SAT objective W * sum C + sum mq stays below 2**50: exact in doubles, and well below the
# magnitudes (objective near 2**57 and up) where CP-SAT's LP was seen to return wrong "optimal" answers
_COST_OBJ_BITS = 50

# CP-SAT: this model needs the LP with every clause linearized (``max_lp``, linearization level 2)
# to get a useful bound; the default portfolio only runs it from 8 workers on. Its presolve costs
# more than it gains on these clause-only models (measured: 3-8 s vs 1.5 s at 3k values).
_CPSAT_SUBSOLVERS = ("max_lp", "core", "default_lp", "reduced_costs", "pseudo_costs",
                     "quick_restart", "lb_tree_search")


# ---- objective scaling -------------------------------------------------------------------------
@dataclass(frozen=True)
class CostScale:
    """Integer costs for CP-SAT (``C = floor(K * cost)``) and the memory tie-break weights."""

    k: float  # cost multiplier, a power of two
    int_cost: dict[int, int]
    w: int  # one unit of integer cost in the CP-SAT objective; > sum(mem_q)
    mem_q: list[int]  # quantized memory tie-break per mem_var
    exact: bool  # every cost is exactly a multiple of 1/K (no rounding happened)
    quantum: float  # common quantum of the costs when exact (gcd / K), else 0
    gcd: int  # gcd of the positive integer costs (1 when there are none)

    @staticmethod
    def of(model: Model) -> CostScale:
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
        return CostScale(k=k, int_cost=int_cost, w=2**tie_bits, mem_q=mem_q, exact=exact,
                          quantum=quantum, gcd=g)


# ---- engines -----------------------------------------------------------------------------------
@dataclass
class EngineResult:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    values: list[int] | None
    bound: float | int | None  # in the engine's objective units (an exact int for CP-SAT)
    detail: dict[str, object] = field(default_factory=dict)


def cpsat_program(model: Model, objective: Mapping[int, float], budget: int | None,
                  extend: Callable[[Any, list[Any]], None] | None = None) -> tuple[Any, list[Any]]:
    """The program as a CP-SAT model over booleans ``x`` (indices of the program's variables), its
    objective set; ``extend(m, x)`` adds further conditions (the peak relaxation). Float objective
    weights are for ``solvers.highs.solve_with_highs``, which solves the same model with HiGHS."""
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


@contextlib.contextmanager
def _watching(solver: Any, proven: Callable[[float, float], bool] | None,
              report: Callable[[float], float] | None) -> Iterator[Any]:
    """A solution callback for ``solver`` (None when neither is asked for): once ``proven(incumbent,
    bound)`` holds, the search is stopped after a grace period of a fifth of the time it took to get
    there (at least 1 s); ``report`` (objective -> true cost) sends incumbent and bound to
    ``solvers.progress``."""
    if proven is None and report is None:
        yield None
        return
    from ortools.sat.python import cp_model

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
            if report is not None and now != shown:
                shown = now
                incumbent, bound = (report(v) if math.isfinite(v) else None for v in now)
                progress.report(incumbent, bound, "CP-SAT search")

    watch = _Watch()
    solver.best_bound_callback = watch.on_bound
    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        yield watch
    finally:
        with lock:
            finished.set()
        watcher.join()
        solver.best_bound_callback = None


def run_cpsat(model: Model, objective: dict[int, int], budget: int | None, hint: list[int] | None,
               *, time_limit_s: float, threads: int, seed: int, presolve: bool = False,
               proven: Callable[[float, float], bool] | None = None,
               extend: Callable[[Any, list[Any]], None] | None = None,
               report_as: Callable[[float], float] | None = None) -> EngineResult:
    """Solve with CP-SAT. Once ``proven(incumbent, bound)`` holds (objective values as floats;
    e.g. the part of the objective that matters is proven optimal), the search gets a grace period
    and is then stopped (``_watching``). With ``report_as`` (an objective value -> the true cost), a
    listener of ``solvers.progress`` hears of the incumbent and bound."""
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
    # callbacks only where they were safe before: with ``proven`` (as always), or on a plain model
    # (CP-SAT 9.15 crashes calling them on the peak relaxation's cumulative constraints)
    report = report_as if progress.listening() and (proven is not None or extend is None) else None
    with _watching(solver, proven, report) as watch, interrupt.stop_on_sigint(solver.stop_search):
        status = solver.solve(m, watch)
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {m.validate()}")
    detail: dict[str, object] = {"cpsat_status": solver.status_name(status), "build_s": build_s}
    if interrupt.requested():
        detail["interrupted"] = True
    if status == cp_model.INFEASIBLE:
        return EngineResult("infeasible", None, None, detail)
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
    return EngineResult("optimal" if status == cp_model.OPTIMAL else
                        "feasible" if values is not None else "unknown", values, bound, detail)



def saved_set(model: Model, values: Sequence[int]) -> list[str]:
    return [v for v, i in model.s_var.items() if values[i]] + model.free_saved


@dataclass
class Solved:
    """An engine's answer mapped back to the problem, in true cost units."""

    result: EngineResult
    bound: float | None  # valid lower bound on the true recompute cost
    plan_saved: list[str] | None  # the saved set of the solution, if any
    exact: bool  # costs were represented exactly, so "optimal" is optimal for the true costs
    detail: dict[str, object] = field(default_factory=dict)


def solve_cpsat(model: Model, scale: CostScale, budget: int | None, hint: list[int] | None,
                 *, time_limit_s: float, threads: int, seed: int,
                 extend: Callable[[Any, list[Any]], None] | None = None,
                 tie_break: bool = True, presolve: bool = False) -> Solved:
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

    res = run_cpsat(model, obj, budget, hint, time_limit_s=time_limit_s, threads=threads,
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
    saved = saved_set(model, res.values) if res.values is not None else None
    return Solved(res, bound, saved, scale.exact, detail)

