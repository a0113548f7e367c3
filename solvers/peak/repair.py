"""Repair of a cheap plan that nearly fits: the cheapest single moves that take its peak under the
budget, judged by the exact simulation.

The relaxation's plans (``solvers.peak``) often overshoot the simulated peak by a few KB while
costing less than every plan that fits. The local search (``solvers.peak.search``) would repair
them, but it simulates every move near the peak (on big graphs more than a thousand, seconds
per step). Here only moves that remove a value live at the peak moment (a saved one recomputed
instead, or a recomputation no longer needed) are simulated, cheapest first, and the first that
fits is the cheapest that does among them.
"""

from __future__ import annotations

import math

from .search import SearchState, Judge, moves, near_peak
from ..problem import Problem

# simulations per step, and steps (each from the move that removed most overshoot per added cost)
REPAIR_TRIES = 24
REPAIR_STEPS = 3


def _removes_live(problem: Problem, st: SearchState,
                  closed: tuple[frozenset[str], frozenset[str], float]) -> bool:
    """The move frees something live at the peak: a value no longer saved or recomputed there.
    (``st.live`` names storages of saved and forward buffers, values of recomputed ones.)"""
    kept, recomputed, _ = closed
    by_name = problem.by_name
    return any(v in st.live or by_name[v].storage_id in st.live
               for v in (st.recomputed - recomputed) | (st.saved - kept))


def repair_overshoot(problem: Problem, saved: frozenset[str], peak_budget: int, budget: int | None,
                     *, cost_below: float, deadline: float) -> SearchState | None:
    """A plan that fits, costs less than ``cost_below`` and is a few moves from ``saved``; None
    when none is found among ``REPAIR_TRIES`` simulations per step, or past ``deadline``."""
    judge = Judge(problem, peak_budget, budget, deadline, REPAIR_STEPS * REPAIR_TRIES + 1)
    closed = judge.close(saved)
    if closed is None:
        return None
    st = judge.state(closed)
    ceiling = cost_below - 1e-9 * abs(cost_below) if math.isfinite(cost_below) else math.inf
    for _ in range(REPAIR_STEPS):
        over = judge.over(st)
        if over == 0:
            return st if st.cost < ceiling else None
        options = []
        for moved in moves(problem, st, only=near_peak(problem, st)):
            if judge.out_of_time():
                return None
            got = judge.close(moved)
            if got is not None and got[2] < ceiling and _removes_live(problem, st, got):
                options.append(got)
        options.sort(key=lambda c: c[2])
        step, step_rate = None, None
        for got in options[:REPAIR_TRIES]:
            if judge.out_of_time():
                return None
            cand = judge.state(got)
            if judge.over(cand) == 0:
                return cand  # the cheapest of the options that fits: they come cheapest first
            gain = over - judge.over(cand)
            rate = (cand.cost - st.cost) / gain if gain > 0 else None
            if rate is not None and (step_rate is None or rate < step_rate):
                step, step_rate = cand, rate
        if step is None:
            return None
        st = step
    return None
