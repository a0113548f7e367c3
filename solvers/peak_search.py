"""Local search over saved sets, judged by the exact step simulation (``solvers.liveness``).

The CP-SAT peak model over-counts memory (``solvers.peak``), so near the smallest peaks it misses
plans that fit. This search needs no model: it moves between saved sets one flip at a time and
simulates every candidate. Moves: save a value the backward recomputes; recompute a saved value;
replace a saved value by the inputs it is made from. While the step's peak is over the budget, the
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

from . import interrupt
from .problem import Problem, Role

# OPT_REMAT_DEBUG_PEAK=1: the peak solve (solvers.peak) and this search print their progress
DEBUG = bool(__import__("os").environ.get("OPT_REMAT_DEBUG_PEAK"))


# how many first moves the two-move escape from a local minimum of the peak tries
ESCAPE_WIDTH = 6
# a cost gain smaller than this (relative) does not restart the local search's stall clock; while
# no plan fits, no cost gain does (measured, 4-layer GPT at 1/4 of floor..min-cut, no plan found:
# 16.3 s -> 14.0 s; its solves at 1/2 and 3/4 and the library-model tests unchanged)
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


class _Simulator:
    """``simulate_plan`` (peak and what is live at it) on integer ids, with the problem's structure
    prepared once: the search simulates thousands of saved sets of one problem. Equal to
    ``simulate_plan`` by construction (and by test); the final plan is re-simulated there anyway."""

    def __init__(self, problem: Problem) -> None:
        nodes = problem.nodes
        self.names = [n.name for n in nodes]
        ids = {name: i for i, name in enumerate(self.names)}
        storages: dict[str, int] = {}
        self.sid = [storages.setdefault(n.storage_id, len(storages)) for n in nodes]
        self.storage_names = list(storages)
        self.counted = [problem.counts_memory(g) for g in storages]
        self.size = [problem.storage_size[g] for g in storages]
        self.inputs = [tuple(ids[i] for i in n.inputs) for n in nodes]
        self.is_view = [n.storage_id != n.name for n in nodes]
        self.role = [n.role for n in nodes]
        self.alloc_by = [ids.get(n.allocated_by, -1) if n.allocated_by is not None else -1 for n in nodes]
        self.forward_nodes = [i for i, n in enumerate(nodes) if n.role is Role.FORWARD]
        self.input_nodes = [i for i, n in enumerate(nodes) if n.role is Role.INPUT]
        self.backward_nodes = [i for i, n in enumerate(nodes) if n.role is Role.BACKWARD]
        self.outputs = {self.sid[ids[o]] for o in problem.forward_outputs}
        self.grads = [ids[o] for o in problem.backward_outputs]
        self.ids = ids

    def _run(self, order: list[int], buffer: dict[int, int] | None, live: dict[int, int],
             keep: set[int], top: list) -> None:
        sid, inputs, counted, size, alloc_by = self.sid, self.inputs, self.counted, self.size, self.alloc_by
        buf = sid.__getitem__ if buffer is None else buffer.__getitem__
        has = (lambda v: True) if buffer is None else buffer.__contains__
        last_use: dict[int, int] = {}
        for i, v in enumerate(order):
            if has(v):
                last_use[buf(v)] = i
            for u in inputs[v]:
                if has(u):
                    last_use[buf(u)] = i
        frees: dict[int, list[int]] = {}
        for b, i in last_use.items():
            if b not in keep:
                frees.setdefault(i, []).append(b)
        in_order = set(order)
        allocates: dict[int, list[int]] = {}
        for v in order:
            p = alloc_by[v]
            key = p if p >= 0 and has(p) and p in in_order else v
            allocates.setdefault(key, []).append(v)
        total = sum(live.values())
        for i, v in enumerate(order):
            for w in allocates.get(v, ()):
                b = buf(w)
                g = sid[w]
                if b not in live and counted[g]:
                    live[b] = size[g]
                    total += size[g]
            if total > top[0]:
                top[0], top[1] = total, frozenset(live)
            for dead in frees.get(i, ()):
                total -= live.pop(dead, 0)

    def peak(self, saved: Iterable[str]) -> tuple[int, frozenset[str]]:
        ids, sid, inputs, role = self.ids, self.sid, self.inputs, self.role
        saved_ids = {ids[v] for v in saved}
        needed = set(self.forward_nodes)
        stack = [v for v in saved_ids if role[v] is Role.EITHER]
        while stack:
            v = stack.pop()
            if v in needed:
                continue
            needed.add(v)
            stack.extend(u for u in inputs[v] if role[u] is Role.EITHER)
        forward = sorted(needed)
        done = saved_ids | set(self.input_nodes)
        backward: list[int] = []
        for b in self.backward_nodes:
            pending: set[int] = set()
            stack = [i for i in inputs[b] if i not in done]
            while stack:
                x = stack.pop()
                if x in pending or x in done:
                    continue
                pending.add(x)
                stack.extend(i for i in inputs[x] if i not in done)
            backward.extend(sorted(pending))
            done.update(pending)
            backward.append(b)
            done.add(b)
        # backward buffers: a storage's id (saved values, inputs) or n_storages + value id (fresh)
        fresh = len(self.size)
        bw: dict[int, int] = {v: sid[v] for v in saved_ids}
        for v in self.input_nodes:
            bw[v] = sid[v]
        for v in backward:
            g = sid[v]
            if not self.counted[g]:
                bw[v] = g
                continue
            base = next((i for i in inputs[v] if sid[i] == g and i in bw), None)
            bw[v] = bw[base] if base is not None and self.is_view[v] else fresh + v
        top: list = [-1, frozenset()]
        live: dict[int, int] = {}
        saved_storages = {sid[v] for v in saved_ids}
        self._run(forward, None, live, saved_storages | self.outputs, top)
        read = set()
        for n in backward:
            for v in (n, *inputs[n]):
                if v in bw:
                    read.add(bw[v])
        for b in [b for b in live if b not in saved_storages or b not in read]:
            live.pop(b)
        self._run(backward, bw, live, {bw[o] for o in self.grads if o in bw}, top)
        if top[0] < 0:
            return 0, frozenset()
        names = self.names
        return top[0], frozenset(self.storage_names[b] if b < fresh else names[b - fresh] for b in top[1])


class _Judge:
    """Closes saved sets into plans and simulates them, once per distinct kept saved set."""

    def __init__(self, problem: Problem, peak_budget: int, budget: int | None,
                 deadline: float, max_evaluations: int, stall_s: float | None = None,
                 clock: StallClock | None = None) -> None:
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
        self.simulator = _Simulator(problem)
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
            # the last real gain's (measured, 4-layer GPT: gains of 0.1% kept it going for 60 s)
            if seen[0] < clock.best_seen[0] or seen[0] == 0 and seen[1] < clock.gain_cost * (1 - STALL_GAIN):
                self.last_gain, clock.gain_cost = time.perf_counter(), seen[1]
            clock.best_seen = seen
            if DEBUG:
                print(f"[search] over {seen[0]} cost {seen[1]:.6g} at {time.perf_counter():.1f}", flush=True)
        return st

    def over(self, st: SearchState) -> int:
        """Bytes over the budgets (0: the plan fits)."""
        extra = max(0, st.saved_bytes - self.budget) if self.budget is not None else 0
        return max(0, st.peak - self.peak_budget) + extra


def _near_peak(problem: Problem, st: SearchState) -> set[str]:
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


def _moves(problem: Problem, st: SearchState, only: set[str] | None = None,
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


def _key(judge: _Judge, st: SearchState) -> tuple[int, float, int]:
    return judge.over(st), st.cost, st.peak


def _better(judge: _Judge, a: SearchState, b: SearchState) -> bool:
    """a is strictly better than b: less overshoot, then less cost, then a lower peak."""
    oa, ob = judge.over(a), judge.over(b)
    if oa != ob:
        return oa < ob
    tol = 1e-9 * max(abs(a.cost), abs(b.cost), 1e-300)
    if abs(a.cost - b.cost) > tol:
        return a.cost < b.cost
    return a.peak < b.peak


def _descend_peak(judge: _Judge, st: SearchState) -> SearchState:
    """Descent on the overshoot until the plan fits or no move lowers it. Each step takes the
    move with the least added cost per byte of overshoot removed (measured on the 2-layer models:
    cheaper plans, and as low or lower smallest peaks, than taking the most bytes removed); a move
    that fits outright is preferred, the cheapest of them."""
    problem = judge.problem
    while judge.over(st) > 0 and not judge.out_of_time():
        over = judge.over(st)
        best, best_rate = st, None
        near = _near_peak(problem, st)
        # moves near the peak first; the others only when none of those helps
        for moves in (lambda: _moves(problem, st, only=near), lambda: _moves(problem, st, skip=near)):
            for saved in moves():
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
            best = _escape(judge, st, ESCAPE_WIDTH)
            if best is None:
                break
        st = best
    return st


def _escape(judge: _Judge, st: SearchState, width: int) -> SearchState | None:
    """Two moves where no single one lowers the overshoot (e.g. two moments at the same peak: a
    move lowers one, the other stays): the first among the ``width`` moves near the peak that raise
    it least, then the one from there that lowers it most below the current state's."""
    problem = judge.problem
    over = judge.over(st)
    firsts = []
    for saved in _moves(problem, st, only=_near_peak(problem, st)):
        if judge.out_of_time():
            return None
        closed = judge.close(saved)
        if closed is not None:
            firsts.append(judge.state(closed))  # simulated (and cached) by the descent step
    firsts.sort(key=lambda c: (judge.over(c), c.cost))
    for mid in firsts[:width]:
        best = None
        for saved in _moves(problem, mid, only=_near_peak(problem, mid)):
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


def _descend_cost(judge: _Judge, st: SearchState, repairs: int) -> SearchState:
    """First-improvement descent on cost among fitting plans; a move that overshoots may be
    repaired by one more move when the pair still costs less than the current plan."""
    problem = judge.problem
    improved = True
    while improved and st.cost > 0 and not judge.out_of_time():  # nothing beats no recompute
        improved = False
        closed_moves = []
        for saved in _moves(problem, st):
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


def _repair(judge: _Judge, cand: SearchState, current: SearchState, repairs: int) -> SearchState | None:
    """One move from an overshooting ``cand`` that fits and still beats ``current``."""
    options = []
    tol = 1e-9 * max(abs(current.cost), 1e-300)
    problem = judge.problem
    for saved in _moves(problem, cand, only=_near_peak(problem, cand)):  # what can lower its peak
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
    judge = _Judge(problem, peak_budget, budget, time.perf_counter() + float(time_limit_s),
                   int(max_evaluations), stall_s, clock)
    try:
        return _search(judge, starts, max_starts, repairs)
    finally:
        judge.clock.quiet_s = time.perf_counter() - judge.last_gain


def _search(judge: _Judge, starts: Iterable[Iterable[str]], max_starts: int,
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
