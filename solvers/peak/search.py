"""Local search over saved sets, judged by the exact step simulation (``solvers.liveness``).

The relaxation (``solvers.peak.rows``) under-counts memory, so its plans can overshoot the
budget, and near the smallest peaks it admits no plan that fits. This search needs no model: it moves
between saved sets one flip at a time and simulates every candidate. Moves: save a value the
backward recomputes; recompute a saved value; replace a saved value by the inputs it is made from.
While the step's peak is over the budget, the
move with the least added cost per byte of overshoot removed is taken (moves on values live at the
peak first; two moves when no single one helps); once it fits, moves that lower the recompute cost
(or the peak at equal cost) and keep it fitting are taken (first improvement), and a save that
overshoots is paired with one peak-lowering move when the pair still costs less.

Each saved set is simulated once (a cache); the search stops at a deadline or an evaluation cap,
and only ever returns a state at least as good as its best start.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable

from .. import interrupt
from ..liveness import simulator
from ..problem import Problem, Role

# how many first moves the two-move escape from a local minimum of the peak tries
ESCAPE_WIDTH = 6
# a cost gain smaller than this (relative) does not restart the local search's stall clock; while
# no plan fits, no cost gain does: tiny gains would keep a hopeless search going
STALL_GAIN = 0.003


@dataclass
class StallClock:
    """The stall clock of the local search, kept across searches that resume one another: the
    best (overshoot, cost) seen, the cost at the last real gain, and the search seconds since that
    gain when the last search stopped (the time between searches does not count)."""
    best_seen: tuple[float, float] = (math.inf, math.inf)
    gain_cost: float = math.inf
    quiet_s: float = 0.0


@dataclass(frozen=True)
class SearchState:
    saved: frozenset[str]  # only saved values the backward uses (as ``plan_from_saved`` keeps)
    recomputed: frozenset[str]
    cost: float
    saved_bytes: int
    peak: int
    live: frozenset[str] = frozenset()  # values live at the peak (``MemoryCurve.peak_live``)


class Judge:
    """Closes saved sets into plans and simulates them, once per distinct kept saved set."""

    def __init__(self, problem: Problem, peak_budget: int, budget: int | None,
                 deadline: float, max_evaluations: int, stall_s: float | None = None,
                 clock: StallClock | None = None, quick: bool = False) -> None:
        self.problem = problem
        self.peak_budget = peak_budget
        self.budget = budget
        self.deadline = deadline
        self.max_evaluations = max_evaluations
        self.evaluations = 0
        # stop early once no state has beaten the best (over, cost) for stall_s seconds
        self.stall_s = stall_s
        self.clock = clock if clock is not None else StallClock()
        self.last_gain = time.perf_counter() - self.clock.quiet_s
        self.peaks: dict[frozenset[str], tuple[int, frozenset[str]]] = {}
        # ``quick``: ``fitting`` stops a simulation where the step passes the peak budget;
        # ``passed``: the plans it found past it
        self.quick = quick
        self.passed: set[frozenset[str]] = set()
        self.simulator = simulator(problem)
        # the closure runs for every move considered: integer ids and flat lists keep it cheap
        names = [n.name for n in problem.nodes]
        self.names = names
        self.id = {n: i for i, n in enumerate(names)}
        self.inputs = [tuple(self.id[i] for i in n.inputs) for n in problem.nodes]
        self.recomputable = [problem.can_recompute(n) for n in names]
        self.cost = [problem.recompute_cost_of(n) for n in names]
        self.reads = [self.id[r] for r in sorted(problem.backward_reads, key=problem.index.__getitem__)]

    def out_of_time(self) -> bool:
        now = time.perf_counter()
        return (self.evaluations >= self.max_evaluations or now >= self.deadline or interrupt.requested()
                or self.stall_s is not None and now - self.last_gain > self.stall_s)

    def close(self, saved: Iterable[str]) -> tuple[frozenset[str], frozenset[str], float] | None:
        """(kept saved, recomputed, cost), or None when the saved set leaves the backward stuck
        (the same closure as ``recompute_closure``, on integer ids)."""
        ids = self.id
        saved_ids = {ids[s] for s in saved}
        inputs, recomputable = self.inputs, self.recomputable
        recomputed: set[int] = set()
        used: set[int] = set(self.reads)
        stack = [r for r in self.reads if r not in saved_ids]
        while stack:
            v = stack.pop()
            if v in recomputed:
                continue
            if not recomputable[v]:
                return None
            recomputed.add(v)
            for i in inputs[v]:
                used.add(i)
                if i not in saved_ids and i not in recomputed:
                    stack.append(i)
        names, cost = self.names, self.cost
        kept = frozenset(names[s] for s in saved_ids if s in used)
        return kept, frozenset(names[r] for r in recomputed), math.fsum(cost[r] for r in recomputed)

    def state(self, closed: tuple[frozenset[str], frozenset[str], float]) -> SearchState:
        kept, recomputed, cost = closed
        known = self.peaks.get(kept)
        if known is None:
            known = self.peaks[kept] = self.simulator.peak(kept)
            self.evaluations += 1
        st = SearchState(kept, recomputed, cost, self.problem.saved_bytes(kept), *known)
        seen, clock = (self.over(st), st.cost), self.clock
        if seen < clock.best_seen:
            # the stall clock restarts on a real gain: less overshoot, or a cost STALL_GAIN below
            # the last real gain's
            if seen[0] < clock.best_seen[0] or seen[0] == 0 and seen[1] < clock.gain_cost * (1 - STALL_GAIN):
                self.last_gain, clock.gain_cost = time.perf_counter(), seen[1]
            clock.best_seen = seen
        return st

    def fitting(self, closed: tuple[frozenset[str], frozenset[str], float]) -> SearchState | None:
        """``state(closed)`` where it fits the budgets, else None. With ``quick``, a plan not
        simulated yet is simulated only until it passes the peak budget (one evaluation all the
        same, so the work is that of ``state``; its peak is not kept: ``peaks`` holds exact ones)."""
        kept = closed[0]
        if not self.quick or kept in self.peaks:
            st = self.state(closed)
            return st if self.over(st) == 0 else None
        if kept in self.passed:
            return None
        self.evaluations += 1
        known = self.simulator.peak(kept, limit=self.peak_budget)
        if known[0] > self.peak_budget:
            self.passed.add(kept)
            return None
        self.peaks[kept] = known
        st = self.state(closed)
        return st if self.over(st) == 0 else None

    def over(self, st: SearchState) -> int:
        """Bytes over the budgets (0: the plan fits)."""
        extra = max(0, st.saved_bytes - self.budget) if self.budget is not None else 0
        return max(0, st.peak - self.peak_budget) + extra


def near_peak(problem: Problem, st: SearchState) -> set[str]:
    """Values live at the peak (every member of a live storage) and their neighbours: flipping
    one of them is what can lower the peak."""
    by_name, users = problem.by_name, problem.users
    live = set(st.live)
    core = {n.name for n in problem.candidates if n.storage_id in live or n.name in live}
    near = set(core)
    for v in core:
        near.update(by_name[v].inputs)
        near.update(u for u in users[v] if by_name[u].role is not Role.BACKWARD)
    return near


def moves(problem: Problem, st: SearchState, only: set[str] | None = None,
           skip: set[str] | None = None) -> list[frozenset[str]]:
    """Saved sets one move away: save a recomputed value, recompute a saved one, or save a saved
    value's inputs instead of it (moves on ``only``'s values if given, not on ``skip``'s)."""
    by_name = problem.by_name
    out: list[frozenset[str]] = []

    def wanted(v: str) -> bool:
        return (only is None or v in only) and (skip is None or v not in skip)

    for v in sorted(st.recomputed, key=problem.index.__getitem__):
        if problem.can_save(v) and wanted(v):
            out.append(st.saved | {v})
    for v in sorted(st.saved, key=problem.index.__getitem__):
        if not problem.can_recompute(v) or not wanted(v):
            continue
        rest = st.saved - {v}
        out.append(rest)
        ins = {i for i in by_name[v].inputs if problem.can_save(i)}
        if ins - st.saved:
            out.append(rest | ins)
    return out


def _key(judge: Judge, st: SearchState) -> tuple[int, float, int]:
    return judge.over(st), st.cost, st.peak


def _better(judge: Judge, a: SearchState, b: SearchState) -> bool:
    """a is strictly better than b: less overshoot, then less cost, then a lower peak."""
    oa, ob = judge.over(a), judge.over(b)
    if oa != ob:
        return oa < ob
    tol = 1e-9 * max(abs(a.cost), abs(b.cost), 1e-300)
    if abs(a.cost - b.cost) > tol:
        return a.cost < b.cost
    return a.peak < b.peak


def _descend_peak(judge: Judge, st: SearchState) -> SearchState:
    """Descent on the overshoot until the plan fits or no move lowers it. Each step takes the
    move with the least added cost per byte of overshoot removed (cheaper plans, and as low or
    lower smallest peaks, than taking the most bytes removed); a move
    that fits outright is preferred, the cheapest of them."""
    problem = judge.problem
    while judge.over(st) > 0 and not judge.out_of_time():
        over = judge.over(st)
        best, best_rate = st, None
        near = near_peak(problem, st)
        # moves near the peak first; the others only when none of those helps
        for only, skip in ((near, None), (None, near)):
            for saved in moves(problem, st, only=only, skip=skip):
                if judge.out_of_time():
                    break
                closed = judge.close(saved)
                if closed is None:
                    continue
                cand = judge.state(closed)
                gain = over - judge.over(cand)
                if gain <= 0:
                    continue
                rate = (cand.cost - st.cost) / gain
                if judge.over(cand) == 0:
                    if _better(judge, cand, best):
                        best, best_rate = cand, rate
                elif judge.over(best) > 0 and (best_rate is None or rate < best_rate):
                    best, best_rate = cand, rate
            if best is not st:
                break
        if best is st:
            escaped = _escape(judge, st, ESCAPE_WIDTH)
            if escaped is None:
                break
            best = escaped
        st = best
    return st


def _escape(judge: Judge, st: SearchState, width: int) -> SearchState | None:
    """Two moves where no single one lowers the overshoot (e.g. two moments at the same peak: a
    move lowers one, the other stays): the first among the ``width`` moves near the peak that raise
    it least, then the one from there that lowers it most below the current state's."""
    problem = judge.problem
    over = judge.over(st)
    firsts = []
    for saved in moves(problem, st, only=near_peak(problem, st)):
        if judge.out_of_time():
            return None
        closed = judge.close(saved)
        if closed is not None:
            firsts.append(judge.state(closed))  # simulated (and cached) by the descent step
    firsts.sort(key=lambda c: (judge.over(c), c.cost))
    for mid in firsts[:width]:
        best = None
        for saved in moves(problem, mid, only=near_peak(problem, mid)):
            if judge.out_of_time():
                return best
            closed = judge.close(saved)
            if closed is None or closed[0] == st.saved:
                continue
            cand = judge.state(closed)
            if judge.over(cand) < over and (best is None or _better(judge, cand, best)):
                best = cand
        if best is not None:
            return best
    return None


def _descend_cost(judge: Judge, st: SearchState, repairs: int) -> SearchState:
    """First-improvement descent on cost among fitting plans; a move that overshoots may be
    repaired by one more move when the pair still costs less than the current plan."""
    problem = judge.problem
    improved = True
    while improved and st.cost > 0 and not judge.out_of_time():  # nothing beats no recompute
        improved = False
        closed_moves = []
        for saved in moves(problem, st):
            if judge.out_of_time():  # on large graphs even the closures of all moves take a while
                return st
            closed = judge.close(saved)
            if closed is not None and closed[0] != st.saved:
                closed_moves.append(closed)
        # the biggest cost gains first; cost-neutral moves (they may lower the peak) after them
        closed_moves.sort(key=lambda c: c[2])
        tol = 1e-9 * max(abs(st.cost), 1e-300)
        for closed in closed_moves:
            if judge.out_of_time():
                break
            if closed[2] > st.cost + tol:
                break  # sorted: nothing cheaper follows
            cand = judge.state(closed)
            if judge.over(cand) == 0 and _better(judge, cand, st):
                st, improved = cand, True
                break
            if judge.over(cand) == 0 or closed[2] >= st.cost - tol or repairs <= 0:
                continue
            fixed = _repair(judge, cand, st, repairs)
            if fixed is not None:
                st, improved = fixed, True
                break
    return st


def _repair(judge: Judge, cand: SearchState, current: SearchState, repairs: int) -> SearchState | None:
    """One move from an overshooting ``cand`` that fits and still beats ``current``."""
    options = []
    tol = 1e-9 * max(abs(current.cost), 1e-300)
    problem = judge.problem
    for saved in moves(problem, cand, only=near_peak(problem, cand)):  # what can lower its peak
        if judge.out_of_time():
            return None
        dropped = cand.saved - saved
        # recomputing a saved value costs at least its own cost: skip the closure when that is
        # already more than the gain
        if dropped and cand.cost + sum(problem.recompute_cost_of(v) for v in dropped) >= current.cost - tol:
            continue
        closed = judge.close(saved)
        if closed is not None and closed[2] < current.cost - tol:
            options.append(closed)
    options.sort(key=lambda c: c[2])
    for closed in options[:repairs]:
        if judge.out_of_time():
            return None
        fixed = judge.state(closed)
        if judge.over(fixed) == 0:
            return fixed
    return None


def improve_saved_sets(problem: Problem, starts: Iterable[Iterable[str]], peak_budget: int,
                       budget: int | None = None, *, time_limit_s: float = 10.0,
                       max_evaluations: int = 20_000, repairs: int = 8,
                       max_starts: int = 16, stall_s: float | None = None,
                       clock: StallClock | None = None) -> SearchState | None:
    """The best plan the local search reaches from ``starts`` (saved sets; invalid ones skipped).

    Best means: fits ``peak_budget`` (and ``budget`` saved bytes) if any state does, then least
    recompute cost, then lowest peak; when nothing fits, the least overshoot. None when no start
    is a valid plan. The result is never worse than the best start. Up to ``max_starts`` starts
    are descended, most promising first, while time and evaluations last (a start ranked low can
    descend furthest: on the 2-layer GPT the smallest peak came from the 9th-16th of them).
    ``stall_s``: stop once no state has beaten the best for that many seconds; ``clock``: the
    stall clock of an earlier search this one resumes (updated when this one stops).
    """
    judge = Judge(problem, peak_budget, budget, time.perf_counter() + float(time_limit_s),
                   int(max_evaluations), stall_s, clock)
    try:
        return _search(judge, starts, max_starts, repairs)
    finally:
        judge.clock.quiet_s = time.perf_counter() - judge.last_gain


def _search(judge: Judge, starts: Iterable[Iterable[str]], max_starts: int,
            repairs: int) -> SearchState | None:
    states: list[SearchState] = []
    seen: set[frozenset[str]] = set()
    for saved in starts:
        closed = judge.close(saved)
        if closed is None or closed[0] in seen:
            continue
        seen.add(closed[0])
        states.append(judge.state(closed))
    if not states:
        return None
    states.sort(key=lambda s: _key(judge, s))
    best = states[0]
    for st in states[:max_starts]:
        if judge.out_of_time():
            break
        st = _descend_peak(judge, st)
        if judge.over(st) == 0:
            st = _descend_cost(judge, st, repairs)
        if _better(judge, st, best):
            best = st
    return best
