"""Max-flow/min-cut: the fast path, exact for ``sum of saved bytes + lam * recompute cost``.

Every candidate value v is split into ``v_in -> v_out`` with capacity = its saving weight (its
storage's bytes; graph inputs free unless counted). ``source -> v_in`` costs ``lam * cost(v)``:
cutting it means v runs in the backward. Banned values and graph inputs get an infinite source edge,
values the backward reads an infinite edge to the sink, data dependencies infinite edges
``u_out -> v_in``. A finite cut is then exactly a valid plan: saved = cut node edges, recomputed =
values on the sink side. Views are charged their whole storage, so the cut never underestimates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .budget import format_bytes
from .errors import InfeasibleError
from .options import MincutOptions
from .problem import Plan, Problem, Role, Status, plan_from_saved

_INF_BITS = 40  # finite capacities are scaled to sum to at most 2**40; infinity is 2**42


@dataclass(frozen=True)
class _FlowNetwork:
    tails: np.ndarray
    heads: np.ndarray
    capacities: list[float]  # math.inf for infinite arcs
    names: tuple[str, ...]  # candidate names, index i -> nodes 2i (in) and 2i+1 (out)
    source: int
    sink: int


def _network(problem: Problem, lam: float) -> _FlowNetwork:
    names = tuple(n.name for n in problem.candidates)
    idx = {n: i for i, n in enumerate(names)}
    source, sink = 2 * len(names), 2 * len(names) + 1
    tails: list[int] = []
    heads: list[int] = []
    caps: list[float] = []

    def arc(t: int, h: int, c: float) -> None:
        tails.append(t)
        heads.append(h)
        caps.append(c)

    for i, name in enumerate(names):
        node = problem.by_name[name]
        if not problem.can_recompute(name):
            arc(source, 2 * i, math.inf)
        else:
            c = lam * problem.recompute_cost_of(name)
            if c > 0:
                arc(source, 2 * i, c)
        arc(2 * i, 2 * i + 1, problem.save_weight(name))
        for u in node.inputs:
            arc(2 * idx[u] + 1, 2 * i, math.inf)
    for r in problem.backward_reads:
        arc(2 * idx[r] + 1, sink, math.inf)
    return _FlowNetwork(np.asarray(tails, dtype=np.int64), np.asarray(heads, dtype=np.int64),
                        caps, names, source, sink)


def _cut_ortools(net: _FlowNetwork) -> tuple[float, set[int]]:
    from ortools.graph.python import max_flow

    finite = [c for c in net.capacities if not math.isinf(c)]
    total = sum(finite)
    limit = 2**_INF_BITS - 1
    integral = all(float(c).is_integer() for c in finite)
    scale = 1.0 if (integral and total <= limit) else (limit / total if total > 0 else 1.0)
    inf = 2 ** (_INF_BITS + 2)  # above any sum of rounded finite capacities (<= limit + #arcs)
    caps = np.fromiter(
        (inf if math.isinf(c) else round(c * scale) for c in net.capacities),
        dtype=np.int64, count=len(net.capacities),
    )
    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(net.tails, net.heads, caps)
    status = flow.solve(net.source, net.sink)
    if status != max_flow.SimpleMaxFlow.OPTIMAL:
        raise RuntimeError(f"OR-Tools max-flow failed with status {status}")
    value = flow.optimal_flow()
    if value >= inf:
        return math.inf, set()
    return value / scale, set(flow.get_source_side_min_cut())


def _cut_networkx(net: _FlowNetwork) -> tuple[float, set[int]]:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from([net.source, net.sink])
    for t, h, c in zip(net.tails.tolist(), net.heads.tolist(), net.capacities):
        if g.has_edge(t, h):  # parallel arcs add up
            prev = g[t][h].get("capacity", math.inf)
            c = prev + c
        if math.isinf(c):
            g.add_edge(t, h)  # no capacity attribute: infinite in networkx
        else:
            g.add_edge(t, h, capacity=c)
    try:
        value, (source_side, _) = nx.minimum_cut(g, net.source, net.sink)
    except nx.NetworkXUnbounded:
        return math.inf, set()
    return float(value), set(source_side)


def solve_mincut(problem: Problem, lam: float = 0.0, *, backend: str = "ortools",
                 budget: int | None = None) -> Plan:
    """The plan minimizing ``sum of saved weights + lam * recompute cost``, exactly.

    ``lam`` is in bytes per second of recompute: 0 treats recomputation as free (only memory
    matters); a large value recomputes only what costs nothing.
    """
    if lam < 0 or math.isnan(lam):
        raise ValueError(f"lam must be >= 0, got {lam}")
    start = time.perf_counter()
    net = _network(problem, lam)
    if backend == "ortools":
        value, source_side = _cut_ortools(net)
    elif backend == "networkx":
        value, source_side = _cut_networkx(net)
    else:
        raise ValueError(f"unknown min-cut backend {backend!r}: use 'ortools' or 'networkx'")
    if math.isinf(value):
        raise InfeasibleError(
            "no valid plan: some value the backward reads can be neither saved nor recomputed "
            "(check bans and must-recompute tags)"
        )
    saved = [name for i, name in enumerate(net.names)
             if 2 * i in source_side and 2 * i + 1 not in source_side]
    plan = plan_from_saved(problem, saved, solver="mincut", status=Status.OPTIMAL,
                           solve_time_s=time.perf_counter() - start, objective=value, bound=value,
                           budget=budget, extra={"lam": lam, "backend": backend})
    return plan


def cut_objective(problem: Problem, plan: Plan, lam: float) -> float:
    """The min-cut objective of a plan (for comparing against brute force)."""
    return sum(problem.save_weight(s) for s in plan.saved) + lam * plan.recompute_cost


def lam_range(problem: Problem) -> tuple[float, float]:
    """Weights below which memory strictly dominates and above which recompute cost does."""
    costs = [problem.recompute_cost_of(n.name) for n in problem.candidates
             if problem.can_recompute(n.name)]
    total_cost = sum(costs)
    positive = [c for c in costs if c > 0]
    total_bytes = sum(problem.save_weight(n.name) for n in problem.candidates
                      if problem.can_save(n.name) and n.role is not Role.INPUT)
    lo = 0.5 / total_cost if total_cost > 0 else 0.0
    hi = 2.0 * (total_bytes + 1) / min(positive) if positive else 1.0
    return lo, max(hi, lo)


def mincut_under_budget(problem: Problem, budget: int, *, backend: str = "ortools",
                        iterations: int = 40) -> Plan:
    """The least-recompute min-cut plan whose saved bytes fit ``budget`` (a search over ``lam``).

    Larger ``lam`` saves more and recomputes less, so the search keeps the largest ``lam`` that fits.
    Raises InfeasibleError with the smallest reachable saved bytes when even ``lam -> 0`` does not fit.
    """
    start = time.perf_counter()
    lo, hi = lam_range(problem)
    best = solve_mincut(problem, lo, backend=backend, budget=budget)
    if best.saved_bytes > budget:
        raise InfeasibleError(
            f"budget {format_bytes(budget)} is below the smallest saved bytes the min-cut reaches "
            f"({format_bytes(best.saved_bytes)}, {best.saved_bytes} bytes)"
        )
    top = solve_mincut(problem, hi, backend=backend, budget=budget)
    if top.saved_bytes <= budget:
        best = top
    else:
        a, b = math.log(max(lo, 1e-300)), math.log(hi)
        for _ in range(iterations):
            mid = math.exp((a + b) / 2)
            plan = solve_mincut(problem, mid, backend=backend, budget=budget)
            if plan.saved_bytes <= budget:
                a = math.log(mid)
                if plan.recompute_cost < best.recompute_cost or (
                        plan.recompute_cost == best.recompute_cost and plan.saved_bytes < best.saved_bytes):
                    best = plan
            else:
                b = math.log(mid)
            if b - a < 1e-6:
                break
    return Plan(saved=best.saved, recomputed=best.recomputed, saved_bytes=best.saved_bytes,
                recompute_cost=best.recompute_cost, solver="mincut", status=Status.HEURISTIC,
                solve_time_s=time.perf_counter() - start, objective=best.recompute_cost, bound=None,
                message="best min-cut plan under the budget (lam search); not proven optimal",
                budget=budget, extra={"lam": best.extra.get("lam"), "backend": backend})


def run_mincut(problem: Problem, budget: int | None, options: MincutOptions) -> Plan:
    """Solver ``mincut``: without a budget, the exact cut at ``lam`` (default 0); with one, the
    ``lam`` search."""
    if budget is None:
        return solve_mincut(problem, 0.0 if options.lam is None else options.lam, backend=options.backend)
    return mincut_under_budget(problem, budget, backend=options.backend)
