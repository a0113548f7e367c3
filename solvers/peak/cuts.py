"""Cuts for the linear peak relaxation at chosen backward steps: what recompute chains keep live.

``solvers.peak.rows`` knows a recomputed value only from its first direct read, and a saved
value only until the earliest step any plan could need its consumers (``E``, which on a
residual network is the start of the backward for nearly every value). Its plans exploit both:
they save a layer's matmul outputs, recompute the cheap ops after them, and count the saved
buffers as freed at once, or leave runs of layers unsaved whose recomputation keeps every layer
of the run live. At a step ``tau`` these rows count both, exactly for a plan, linearly:

* ``N(w)`` (one per value near ``tau``): w is recomputed and made at or before ``tau``. Made
  when its first direct read is at or before ``tau`` or a recomputed consumer is made:
  ``N(w) >= r_w`` if ``F(w) <= tau``, ``N(w) >= r_w + N(x) - 1`` for each consumer x; and only
  then: ``N(w) <= r_w``, ``N(w) <= sum over consumers x of N(x)`` if ``F(w) > tau``.
* a recomputed value made by ``tau`` and read after it is live at ``tau``: ``N(w)`` with
  ``F(w) > tau``, and ``N(w) + r_x - N(x) - 1`` for each recomputable consumer x (made later,
  from w);
* a saved value v whose recomputed consumer w is not made yet is live at ``tau`` (w is made
  later, from v): ``s_v + r_w - N(w) - 1``;
* the row: ``C_tau + sum_g size_g * U_g <= P``, ``U_g`` at least each of its members' terms and
  of ``rows``' conditions active at ``tau``.

A true plan satisfies every row with N at its true values, so the program stays a relaxation
(``tests/test_peak_bound.py`` pins true plans of random problems at their own simulated peak).
Variables are made for the values possibly made by ``tau`` and read after it (on big graphs for
those that plans cut there needed, and the values read soonest after ``tau``); a consumer without
a variable enters the upper bound as its ``r_x``, the lower bound not at all, which only weakens
the rows.
"""

from __future__ import annotations

from typing import Any

from ..mip_model import Model
from .rows import PeakRows, condition_literals, elementary_spans, row_units, storage_segments
from ..problem import Problem, Role

# values read soonest after a cut step given an N variable whatever the plans (recompute chains)
CHAIN_WINDOW = 400
# at most this many values possibly made by a step and read after it: all of them get a variable
# (the row is then exact at that step for every plan); beyond, the noted and nearest ones
FULL_WINDOW = 4000
# violated_steps: steps this close to a step cut already are cut first
NEAR_CUT = 2


class CutContext:
    """What the rows need of a problem and its program, computed once for all cut steps."""

    def __init__(self, problem: Problem, model: Model, rows: PeakRows) -> None:
        self.problem, self.model, self.rows = problem, model, rows
        self.order = [n.name for n in problem.candidates]
        self.index = {v: i for i, v in enumerate(self.order)}
        self.first = {v: rows.span[v][0] for v in self.order if v in rows.span}
        self.last = {v: rows.span[v][1] for v in self.order if v in rows.span}
        self.segments = {g: list(elementary_spans(rows, g, segs))
                         for g, segs in storage_segments(problem, rows).items()}
        self.noted: dict[int, set[str]] = {}  # cut step -> values plans there need N for
        # (saved value, recomputable consumer) pairs, by the consumer
        self.holders: dict[str, list[str]] = {}
        for v in self.order:
            if v in model.s_var:
                for w in problem.users[v]:
                    if w in model.r_var and v not in self.holders.get(w, ()):
                        self.holders.setdefault(w, []).append(v)

    def window(self, tau: int) -> set[str]:
        """Values given an N variable at ``tau``: every value possibly made by ``tau`` and read
        after it, when there are at most ``FULL_WINDOW``; else what the plans noted there need
        (``note``), and the values read soonest after ``tau`` with the unread values between them."""
        first, earliest = self.first, self.rows.earliest
        r_var = self.model.r_var
        every = [v for v in r_var if earliest.get(v, 1 << 62) <= tau < first.get(v, 1 << 62)]
        if len(every) <= FULL_WINDOW:
            return set(every)
        chosen = set(self.noted.get(tau, ()))
        later = sorted((f, v) for v, f in first.items() if f > tau and v in r_var)
        near = [v for _, v in later[:CHAIN_WINDOW]]
        if near:
            lo = min(self.index[v] for v in near)
            hi = max(self.index[v] for v in near)
            chosen.update(near)
            chosen.update(v for v in self.order[lo:hi + 1]
                          if v in r_var and v not in first and earliest.get(v, 1 << 62) <= tau)
        return chosen

    def note(self, tau: int, saved: set[str], recomputed: set[str]) -> None:
        """Give N variables at ``tau`` to what makes its row exact for this plan: the recomputed
        values made by ``tau`` and live after it (recompute chains), and from each saved value's
        recomputed consumer not made by ``tau`` the recomputed values it feeds up to where
        the plan saves (what tells the program it is not made yet)."""
        from ..liveness import backward_schedule

        problem, first, earliest = self.problem, self.first, self.rows.earliest
        r_var, users = self.model.r_var, problem.users
        made: dict[str, int] = {}
        k = -1
        for name in backward_schedule(problem, saved):
            if problem.by_name[name].role is Role.BACKWARD:
                k += 1
            else:
                made.setdefault(name, k + 1)
        out = self.noted.setdefault(tau, set())
        for w in recomputed:
            if w in r_var and made.get(w, 1 << 62) <= tau and first.get(w, 1 << 62) > tau:
                out.add(w)
        stack = [w for w, holders in self.holders.items()
                 if w in recomputed and made.get(w, 1 << 62) > tau >= earliest.get(w, 1 << 62)
                 and any(v in saved and self.last.get(v, -1) < tau for v in holders)]
        while stack:
            w = stack.pop()
            if w in out or first.get(w, 1 << 62) <= tau:
                continue
            out.add(w)
            stack.extend(u for u in users[w] if u in recomputed and u in r_var
                         and earliest.get(u, 1 << 62) <= tau)


def add_cut_rows(m: Any, x: list[Any], ctx: CutContext, peak_budget: int, steps: list[int]) -> None:
    """Add the rows at each backward step of ``steps`` to the CP-SAT model ``m`` (booleans ``x``)."""
    from ortools.sat.python import cp_model

    problem, model, rows = ctx.problem, ctx.model, ctx.rows
    size, users, by_name = problem.storage_size, problem.users, problem.by_name
    unit, cap = row_units(peak_budget)
    r_var, s_var = model.r_var, model.s_var

    def r(v: str) -> Any:
        return x[r_var[v]]

    for tau in sorted(set(steps)):
        room = cap - rows.consts[tau] // unit
        if room < 0:
            m.add_bool_or([])
            return
        # in graph order: the same rows in the same order in every process (set order follows
        # string hashing, and HiGHS's path, so its plan, follows the row order)
        chosen = sorted(ctx.window(tau), key=ctx.index.__getitem__)
        need: dict[str, Any] = {v: m.new_bool_var("") for v in chosen}
        for w, n_w in need.items():
            m.add_implication(n_w, r(w))
            made_by: list[Any] = []  # what w being made at or before tau needs: a consumer made by then
            for u in users[w]:
                if u in need:
                    m.add_bool_or([n_w, r(w).Not(), need[u].Not()])
                    made_by.append(need[u])
                elif u in r_var:
                    if ctx.first.get(u, 1 << 62) <= tau:
                        m.add_bool_or([n_w, r(w).Not(), r(u).Not()])
                    if rows.earliest.get(u, 1 << 62) <= tau:  # else no plan makes u by tau
                        made_by.append(r(u))
                elif problem.can_recompute(u) and by_name[u].role is not Role.BACKWARD:
                    break  # a consumer with no variable: no upper bound
            else:  # F(w) > tau: made only for a consumer
                m.add_bool_or([n_w.Not(), *made_by])
        # per counted storage, the literals (or conjunctions) that make it live at tau
        live: dict[str, list[Any]] = {}
        for w, n_w in need.items():
            g = by_name[w].storage_id
            if ctx.first.get(w, -1) > tau:
                live.setdefault(g, []).append([n_w])
            # made by tau, with a recomputed consumer made after it (from it): live at tau too,
            # read directly or not (a view made in the batch before a step and read by a
            # recomputation after it)
            for later in users[w]:
                if later in need:
                    live.setdefault(g, []).append([n_w, r(later), need[later].Not()])
                elif later in r_var and rows.earliest.get(later, 1 << 62) > tau:
                    live.setdefault(g, []).append([n_w, r(later)])
        for w, holders in ctx.holders.items():
            if w in need:
                unmade = need[w].Not()
            elif ctx.first.get(w, 1 << 62) <= tau or rows.earliest.get(w, 1 << 62) <= tau:
                continue  # made by tau, or possibly made by then with no variable to tell
            else:
                unmade = None  # no plan makes it by tau
            for v in holders:
                if ctx.last.get(v, -1) >= tau:
                    continue  # a direct read at or after tau: the rows count it
                conj = [x[s_var[v]], r(w)] + ([unmade] if unmade is not None else [])
                live.setdefault(by_name[v].storage_id, []).append(conj)
        for g, spans in ctx.segments.items():
            for lo, hi, active in spans:
                if lo <= tau < hi:
                    for c in active:
                        literals = condition_literals(c, x, model)
                        if literals is not None:
                            live.setdefault(g, []).append(literals)
        terms, coefs = [], []
        for g, conjs in live.items():
            coef = size[g] // unit
            if coef <= 0 or not problem.counts_memory(g) \
                    or any(a <= tau <= b for a, b in rows.covered.get(g, ())):
                continue
            u_g = m.new_bool_var("")
            for conj in conjs:
                m.add_bool_or([u_g] + [lit.Not() for lit in conj])
            terms.append(u_g)
            coefs.append(coef)
        if terms:
            m.add(cp_model.LinearExpr.weighted_sum(terms, coefs) <= room)


def simulated_by_step(problem: Problem, curve: Any) -> list[int]:
    """The simulated live bytes per backward position: the most at the position's value or at the
    recomputations just before it (where a cut row at that position is written)."""
    backward = {n.name for n in problem.nodes if n.role is Role.BACKWARD}
    out: list[int] = []
    batch = 0
    for phase, name, live in curve.steps:
        if phase != "backward":
            continue
        batch = max(batch, live)
        if name in backward:
            out.append(batch)
            batch = 0
    return out


def violated_steps(problem: Problem, curve: Any, peak_budget: int, count: int = 4,
                   apart: int = 40, skip: frozenset[int] | set[int] = frozenset(),
                   relaxed: list[int] | None = None) -> list[int]:
    """Up to ``count`` backward positions not in ``skip`` (steps cut already) where the plan's
    simulation exceeds the budget, at least ``apart`` positions from each other: those it exceeds
    most; given ``relaxed`` (the relaxation's live bytes per position for the plan,
    ``rows.relaxed_live``), in turn the one where the relaxation counts most and the one the
    plan exceeds most. Where the relaxation has room left, a row may only move the overshoot to
    another step at no cost; where it is nearly tight, the row's new terms must be paid for
    (which pays on some graphs, the most overshooting steps on others)."""
    by_step = simulated_by_step(problem, curve)
    over = [k for k, live in enumerate(by_step) if live > peak_budget and k not in skip]
    rankings = [sorted(over, key=lambda k: (by_step[k], k), reverse=True)]
    # first the steps next to a step cut already: its row misses what the recomputations just
    # before it keep live
    beside = [k for k in rankings[0] if any(abs(k - j) <= NEAR_CUT for j in skip)]
    if beside:
        rankings.insert(0, beside)
    if relaxed is not None:
        # the relaxation's counts within 1% of the budget as ties, the more overshooting first
        unit = max(1, peak_budget // 100)
        rankings.insert(0, sorted(over, key=lambda k: (relaxed[k] // unit, by_step[k]), reverse=True))
    out: list[int] = []
    turn = 0
    while len(out) < count and any(rankings):
        ranked = rankings[turn % len(rankings)]
        turn += 1
        while ranked:
            k = ranked.pop(0)
            if k not in out and all(abs(k - j) >= apart for j in out):
                out.append(k)
                break
    return out
