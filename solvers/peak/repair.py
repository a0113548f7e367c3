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
# repair_by_rate: steps at most, and the fee per move as a share of the plan's cost
RATE_STEPS = 40
RATE_FEE = 1e-3


def _live_taken(problem: Problem, st: SearchState,
                closed: tuple[frozenset[str], frozenset[str], float]) -> set[str]:
    """Storages of the values live at the peak that the move no longer saves or recomputes.
    (``st.live`` names storages of saved and forward buffers, values of recomputed ones.)"""
    kept, recomputed, _ = closed
    by_name = problem.by_name
    return {by_name[v].storage_id for v in (st.recomputed - recomputed) | (st.saved - kept)
            if v in st.live or by_name[v].storage_id in st.live}


def _removes_live(problem: Problem, st: SearchState,
                  closed: tuple[frozenset[str], frozenset[str], float]) -> bool:
    """The move frees something live at the peak: a value no longer saved or recomputed there."""
    return bool(_live_taken(problem, st, closed))


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


def repair_by_rate(problem: Problem, saved: frozenset[str], peak_budget: int, budget: int | None,
                   *, deadline: float, steps: int = RATE_STEPS) -> SearchState | None:
    """A plan that fits, many moves from ``saved`` (one that overshoots by a few percent of the
    budget): each step simulates the ``REPAIR_TRIES`` moves near the peak whose added cost per byte
    they free at the peak (estimated from the live set, with a fee per move) is least, and takes
    the one that fits, else the one whose added cost per byte of overshoot removed is least. None
    when a step finds no move that lowers the overshoot, after ``steps`` steps, or past ``deadline``.
    (``repair_overshoot`` tries the cheapest moves, which near the floor all add bytes.)"""
    judge = Judge(problem, peak_budget, budget, deadline, steps * REPAIR_TRIES + 1)
    closed = judge.close(saved)
    if closed is None:
        return None
    st = judge.state(closed)
    for _ in range(steps):
        over = judge.over(st)
        if over == 0:
            return st
        fee = RATE_FEE * st.cost  # a move that frees a few bytes at no cost is no progress
        live_storages = set(st.live) | {problem.by_name[v].storage_id for v in st.live if v in problem.by_name}
        ranked = []
        for moved in moves(problem, st, only=near_peak(problem, st)):
            if judge.out_of_time():
                return None
            got = judge.close(moved)
            freed = _freed_at_peak(problem, st, got, live_storages) if got is not None else 0
            if got is not None and freed > 0:
                ranked.append(((got[2] - st.cost + fee) / freed, got))
        ranked.sort(key=lambda r: r[0])
        step: SearchState | None = None
        step_rate = math.inf
        for _, got in ranked[:REPAIR_TRIES]:
            if judge.out_of_time():
                return None
            cand = judge.state(got)
            if judge.over(cand) == 0:
                if step is None or judge.over(step) > 0 or cand.cost < step.cost:
                    step, step_rate = cand, -math.inf
                continue
            gain = over - judge.over(cand)
            rate = (cand.cost - st.cost + fee) / gain if gain > 0 else math.inf
            if rate < step_rate:
                step, step_rate = cand, rate
        if step is None:
            return None
        st = step
    return st if judge.over(st) == 0 else None


def _freed_at_peak(problem: Problem, st: SearchState, closed: tuple[frozenset[str], frozenset[str], float],
                   live_storages: set[str]) -> int:
    """Bytes a move takes off the peak moment, by the live set alone: storages live there that the
    plan no longer saves or recomputes, less storages it newly saves that were not live there
    (``live_storages``: the storages of ``st.live``)."""
    kept, by_name, size = closed[0], problem.by_name, problem.storage_size
    gone = _live_taken(problem, st, closed) - {by_name[v].storage_id for v in kept}
    added = {by_name[v].storage_id for v in kept - st.saved} - live_storages
    return sum(size[g] for g in gone) - sum(size[g] for g in added)
