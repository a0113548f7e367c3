"""Recompute chains in the peak relaxation: when each value is first needed, as CP-SAT intervals.

``solvers.peak_bound``'s linear conditions leave out what recomputation keeps alive before a value
is read directly. This module adds, for the same program, one cumulative constraint over the
backward's steps (capacity: the peak budget) that sees it:

* ``T_w``, the step at which a recomputed value w is first needed, is exactly
  ``min(F(w), T_x for each recomputed consumer x)`` (F: its first direct read; a value is made just
  before the first step that needs it, directly or through a value recomputed for it);
* a recomputed value read directly lives over ``[T_v, F(v))`` before its reads;
* a saved storage's buffer lives from the start until the first direct read of its saved
  members and until each recomputed consumer of a member using that buffer (a saved member, or a
  view recomputed from one) is made, and likewise after the storage's last direct read; clipped
  to where ``C_k`` counts the storage;
* plus what ``peak_bound`` counts: the plan-independent bytes of each step, and each saved storage
  until its first direct read.

All of this holds for the true schedule of any plan (with ``T`` and ``U`` at their true values),
so the program stays a relaxation: a lower bound. Per storage only its base gets variable spans
(views share its buffer and would be counted twice), clipped to where ``C_k`` does not count it.
"""

from __future__ import annotations

from typing import Any

from .mip_model import Model
from .peak_bound import PeakRows, at_least_one, storage_vars
from .problem import Problem


def add_schedule(m: Any, x: list[Any], problem: Problem, model: Model, rows: PeakRows,
                 peak_budget: int) -> None:
    """Add the cumulative constraint to the CP-SAT model ``m`` over the program's booleans ``x``."""
    size = problem.storage_size
    by_name = problem.by_name
    horizon = len(rows.consts)
    if horizon == 0:
        return
    unit = max(1, peak_budget >> 24)  # the same rounding down as peak_bound: a relaxation
    cap = peak_budget // unit

    intervals: list[Any] = []
    demands: list[int] = []

    def fixed(start: int, end: int, demand: int, presence: Any = None, name: str = "") -> None:
        if end <= start or demand <= 0:
            return
        if presence is None:
            intervals.append(m.new_fixed_size_interval_var(start, end - start, ""))
        else:
            intervals.append(m.new_optional_fixed_size_interval_var(start, end - start, presence, name))
        demands.append(demand)

    # plan-independent bytes per step, as runs of equal value
    run_start = 0
    for k in range(1, horizon + 1):
        if k == horizon or rows.consts[k] != rows.consts[run_start]:
            fixed(run_start, k, rows.consts[run_start] // unit)
            run_start = k

    members: dict[str, list[str]] = {}
    for n in problem.candidates:
        members.setdefault(n.storage_id, []).append(n.name)
    svar = storage_vars(problem, model)
    # one value per storage gets variable spans (its base: views share its buffer), kept clear of
    # the spans where C_k already counts the storage
    base = {g: g for g in members if g in problem.by_name and problem.counts_memory(g)}

    # first-need times of recomputed values, from the last value back
    first_need: dict[str, Any] = {}
    gated: dict[str, Any] = {}  # T_w if w is recomputed, else the horizon
    for node in reversed(problem.candidates):
        w = node.name
        if w not in model.r_var:
            continue
        own = rows.span[w][0] if w in rows.span else horizon
        options = [m.new_constant(own)] + [gated[u] for u in problem.users[w] if u in gated]
        t = m.new_int_var(0, own, "")
        m.add_min_equality(t, options)
        first_need[w] = t
        g_t = m.new_int_var(0, horizon, "")
        r = x[model.r_var[w]]
        m.add(g_t == t).only_enforce_if(r)
        m.add(g_t == horizon).only_enforce_if(r.Not())
        gated[w] = g_t

    def at_least(var: Any, time: Any, cap_at: int, when: list[Any]) -> None:
        """var >= min(time, cap_at) whenever all of ``when`` hold."""
        clipped = m.new_int_var(0, cap_at, "")
        m.add_min_equality(clipped, [time, m.new_constant(cap_at)])
        m.add(var >= clipped).only_enforce_if(when)

    for g, vs in members.items():
        demand = size[g] // unit
        if demand <= 0 or not problem.counts_memory(g):
            continue
        covered = rows.covered.get(g, [])
        saved_members = [v for v in vs if v in model.s_var]
        y = svar.get(g)
        if y is not None and saved_members:
            # the saved buffer: live from the start until each saved member's first direct read
            # and each of its recomputed consumers is made (up to where C_k counts the storage),
            # and after the storage's last read until its last recomputed consumer is made
            # members whose backward buffer is the saved one: saved, or views recomputed from one
            holds: dict[str, Any] = {}
            for a in sorted(vs, key=problem.index.__getitem__):
                parent = next((u for u in by_name[a].inputs if u in holds), None)
                lits = ([x[model.s_var[a]]] if a in model.s_var else []) + (
                    [(x[model.r_var[a]], holds[parent])] if parent is not None and a in model.r_var else [])
                if lits:
                    holds[a] = at_least_one(m, lits)
            for begin, ceiling in ((0, covered[0][0] if covered else horizon),
                                   (covered[-1][1] + 1 if covered else horizon, horizon)):
                if begin >= ceiling:
                    continue
                end = m.new_int_var(begin, ceiling, "")
                for a, h in holds.items():
                    if begin == 0 and a in rows.span:
                        at_least(end, m.new_constant(rows.span[a][0]), ceiling, [h])
                    for u in problem.users[a]:
                        if u in first_need and by_name[u].storage_id != g:
                            at_least(end, first_need[u], ceiling, [h, x[model.r_var[u]]])
                length = m.new_int_var(0, ceiling - begin, "")
                m.add(length == end - begin)
                intervals.append(m.new_optional_interval_var(begin, length, end, x[y], g))
                demands.append(demand)
        v = g if g in base else None
        span = rows.span.get(v) if v is not None else None
        if v in first_need and span is not None:  # a recomputed base: alive from its first need
            end = span[0]
            floor = max((b + 1 for a, b in covered if b < end), default=0)
            start = m.new_int_var(floor, end, "")
            m.add_max_equality(start, [first_need[v], m.new_constant(floor)])
            length = m.new_int_var(0, end - floor, "")
            m.add(length == end - start)
            intervals.append(m.new_optional_interval_var(start, length, end, x[model.r_var[v]], g))
            demands.append(demand)
    m.add_cumulative(intervals, demands, cap)
