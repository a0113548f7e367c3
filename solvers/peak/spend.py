"""Spending a peak budget a plan leaves unused: from a plan that fits, save recomputed values
again, most recompute saved per byte first, while the simulated step still fits.

The fast default's plans (checkpointing, min-cut, their layer mix) often peak well under the
budget; each value saved back removes its recomputation (and that of what only it needed). The
work is bounded by a count of simulations, never by a clock: the same plan and budget give the
same result on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..problem import Problem
from .search import Judge, SearchState, _descend_peak

# graphs up to this many nodes rank values by their closures' exact gains and bytes
EXACT_RANK_MAX_NODES = 2000


def spend_budget(problem: Problem, saved: Iterable[str], peak_budget: int, budget: int | None = None, *,
                 max_evaluations: int, judge: Judge | None = None,
                 copies: Mapping[str, Iterable[str]] | None = None, byte_power: float = 1.0) -> SearchState | None:
    """The plan reached from ``saved`` (a plan that fits) by saving recomputed values back, one
    at a time, the largest recompute gain per added saved byte first, each kept if the step still
    fits; a value that overshoots is not tried again, nor its ``copies`` (the values at its
    position in the other repeated layers: their saving holds as many bytes over the same peak,
    and trying each spent the simulations on 80 copies of one overshoot). At most
    ``max_evaluations`` simulations. ``byte_power``: the gain is divided by the added bytes to
    this power (below 1, large values rank higher). None when ``saved`` is no valid plan or does
    not fit."""
    judge = judge or Judge(problem, peak_budget, budget, math.inf, max_evaluations)
    closed = judge.close(saved)
    if closed is None:
        return None
    st = judge.state(closed)
    if judge.over(st) > 0:
        return None
    rejected: set[str] = set()
    # passes down the ranking: the ranking is made once per pass (closures of every recomputed
    # value), each value's move closed again against the plan it meets
    while st.cost > 0 and not judge.out_of_time():
        accepted = False
        for v in _ranked(problem, judge, st, rejected, byte_power):
            if judge.out_of_time():
                return st
            if v not in st.recomputed or v in rejected:
                continue  # saved back with an earlier one, no longer needed, or a copy's overshot
            moved = judge.close(st.saved | {v})
            if moved is None or moved[2] >= st.cost:
                continue
            cand = judge.fitting(moved)
            if cand is not None:
                st, accepted = cand, True
            else:
                rejected.add(v)  # saving more rarely lowers the peak again: not retried
                rejected.update(copies.get(v, ()) if copies is not None else ())
        if not accepted:
            break
    return st


def _ranked(problem: Problem, judge: Judge, st: SearchState, rejected: set[str],
            byte_power: float = 1.0) -> list[str]:
    """Recomputed values worth saving back, the largest recompute gain per added byte first. On
    big graphs (``EXACT_RANK_MAX_NODES``) the gain is the value's own cost and the bytes its own
    storage's (a closure per recomputed value per pass took most of a minute at 7B)."""
    index = problem.index
    tol = 1e-12 * max(st.cost, 1e-300)
    ranked = []
    saved_storages = {problem.by_name[s].storage_id for s in st.saved}
    approximate = len(problem.nodes) > EXACT_RANK_MAX_NODES
    exact = {} if approximate else _save_back_gains(problem, judge, st)
    for v in sorted(st.recomputed, key=index.__getitem__):
        if v in rejected or not problem.can_save(v):
            continue
        if approximate:
            gain = problem.recompute_cost_of(v)
            storage = problem.by_name[v].storage_id
            added = 0 if storage in saved_storages else problem.storage_size.get(storage, 0)
            if gain > tol:
                ranked.append((-gain / max(added, 1), index[v], v))
            continue
        gain, added = exact[v]
        if gain <= tol:
            continue
        ranked.append((-gain / max(added, 1) ** byte_power, index[v], v))
    ranked.sort(key=lambda r: r[:2])
    return [v for _, _, v in ranked]


def _save_back_gains(problem: Problem, judge: Judge, st: SearchState) -> dict[str, tuple[float, int]]:
    """Per recomputed value v: (the recompute cost saved, the saved bytes added) by saving v too,
    as closing ``st.saved | {v}`` gives them, for all v at once. The values the backward then no
    longer needs are those v dominates in the graph the backward recomputes (rooted at what it
    reads, a saved value a leaf): one dominator tree per plan instead of a closure per value."""
    ids, names, inputs, cost = judge.id, judge.names, judge.inputs, judge.cost
    saved = {ids[s] for s in st.saved}
    recomputed = {ids[r] for r in st.recomputed}
    reads = set(judge.reads)
    preds: dict[int, list[int]] = {}
    for u in recomputed:
        for i in inputs[u]:
            preds.setdefault(i, []).append(u)
    root = len(names)  # above every read
    # graph order is topological (inputs first): the reverse of it, from the root, visits every
    # value after all its users, so one pass gives the dominators exactly (Cooper-Harvey-Kennedy)
    order = sorted(recomputed | {s for s in saved if s in reads or s in preds}, reverse=True)
    rank = {root: 0, **{v: k + 1 for k, v in enumerate(order)}}
    idom = {root: root}
    for v in order:
        parents = ([root] if v in reads else []) + [u for u in preds.get(v, ()) if u in idom]
        d = parents[0]
        for p in parents[1:]:
            while d != p:
                while rank[d] > rank[p]:
                    d = idom[d]
                while rank[p] > rank[d]:
                    p = idom[p]
        idom[v] = d
    below: dict[int, list[int]] = {v: [v] for v in order}
    for v in reversed(order):  # each value's subtree before its dominator's
        if idom[v] != root:
            below[idom[v]].extend(below[v])
    sid = {v: problem.by_name[names[v]].storage_id for v in saved | recomputed}
    held: dict[str, int] = {}
    for s in saved:
        held[sid[s]] = held.get(sid[s], 0) + 1
    out = {}
    for v in recomputed:
        gone = below[v]
        freed: dict[str, int] = {}
        for s in gone:
            if s in saved:
                freed[sid[s]] = freed.get(sid[s], 0) + 1
        delta = -sum(problem.storage_size[g] for g, n in freed.items()
                     if n == held[g] and problem.counts_memory(g))
        g = sid[v]
        if held.get(g, 0) - freed.get(g, 0) == 0 and problem.counts_memory(g):
            delta += problem.storage_size[g]
        out[names[v]] = (math.fsum(cost[u] for u in gone if u in recomputed), delta)
    return out


def fit_then_spend(problem: Problem, saved: Iterable[str], peak_budget: int, budget: int | None = None, *,
                   max_evaluations: int) -> SearchState | None:
    """From a plan that may overshoot (a cheap one: min-cut at a high weight): the local search's
    descent on the overshoot (``search._descend_peak``, least added cost per byte removed) until it
    fits, then ``spend_budget``; both within ``max_evaluations`` simulations. Where it never fits,
    the lowest peak the descent reached (above the budget: a refusal names it); None if the plan
    cannot be closed."""
    # the descent judges by ``state``, exact; the spending only asks what fits
    judge = Judge(problem, peak_budget, budget, math.inf, max_evaluations, quick=True)
    closed = judge.close(saved)
    if closed is None:
        return None
    st = _descend_peak(judge, judge.state(closed))
    if judge.over(st) > 0:
        return st
    return spend_budget(problem, st.saved, peak_budget, budget, max_evaluations=max_evaluations, judge=judge)


class _UntilJudge(Judge):
    """A judge that stops the work at the first plan simulated at most ``enough`` bytes."""

    def __init__(self, problem: Problem, budget: int | None, max_evaluations: int, enough: int | None) -> None:
        super().__init__(problem, 0, budget, math.inf, max_evaluations)
        self.enough = enough
        self.met = False

    def state(self, closed: tuple[frozenset[str], frozenset[str], float]) -> SearchState:
        st = super().state(closed)
        within = self.budget is None or st.saved_bytes <= self.budget
        if self.enough is not None and st.peak <= self.enough and within:
            self.met = True
        return st

    def out_of_time(self) -> bool:
        return self.met or super().out_of_time()


def lowest_peaks(problem: Problem, starts: Iterable[Iterable[str]], targets: Iterable[int],
                 budget: int | None = None, *, max_evaluations: int,
                 enough: int | None = None) -> list[tuple[frozenset[str], int, float]]:
    """The plans met on ``fit_then_spend`` from each of ``starts`` at each of ``targets`` (peak
    budgets, in this order: the descent on the overshoot, then spending what is left), all
    sharing ``max_evaluations`` simulations: those no other beats on both peak and cost, as
    (saved, peak, cost), lowest peak first. Given the same targets, the same for every budget.
    ``enough``: the work stops at the first plan that peaks at most that (a prefix of the same
    work: the lowest peak is at most ``enough`` exactly when the whole work's is)."""
    judge = _UntilJudge(problem, budget, max_evaluations, enough)
    closed_starts = [c for c in (judge.close(saved) for saved in starts) if c is not None]
    for target in targets:
        judge.peak_budget = target
        for closed in closed_starts:
            if not judge.out_of_time():
                st = _descend_peak(judge, judge.state(closed))
                if judge.over(st) == 0:  # as fit_then_spend: the budget left is spent
                    spend_budget(problem, st.saved, target, budget, max_evaluations=max_evaluations, judge=judge)
    found = []
    for kept, (peak, _) in judge.peaks.items():
        plan = judge.close(kept)
        if plan is not None and (budget is None or problem.saved_bytes(kept) <= budget):
            found.append((peak, plan[2], sorted(kept), kept))
    out: list[tuple[frozenset[str], int, float]] = []
    for peak, cost, _, kept in sorted(found):
        if not out or cost < out[-1][2]:
            out.append((kept, peak, cost))
    return out
