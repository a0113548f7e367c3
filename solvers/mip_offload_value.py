"""An independent reading of the offload program (``solvers.mip_offload``): its objective for a
given plan, or None where the program forbids it. The tests enumerate every keep/offload/recompute
choice of small problems with it (the program's plan must be the least)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate
from typing import Any

from .errors import PlanError
from .mip_model import Model, build_model
from .mip_offload import OffloadForm
from .peak.rows import elementary_spans, storage_vars
from .problem import Problem, Status, plan_from_saved


def program_value(problem: Problem, form: OffloadForm, saved: Iterable[str], offloaded: Iterable[str],
                  peak_budget: int, *, host_cap: int | None = None, budget: int | None = None,
                  model: Model | None = None) -> int | None:
    """The program's objective (time units) for a plan saving ``saved`` (as given) and offloading
    ``offloaded``, recomputing what the backward then needs; None where the program forbids the
    plan. An independent reading of the program (the tests' cross-check by enumeration)."""
    saved, off = frozenset(saved), frozenset(offloaded)
    model = build_model(problem) if model is None else model
    try:
        recomputed = plan_from_saved(problem, saved, solver="check", status=Status.HEURISTIC).recomputed
    except PlanError:
        return None
    by_name, size = problem.by_name, problem.storage_size
    if budget is not None and problem.saved_bytes(saved) > budget:
        return None
    allowed = {v for v in form.names if v in model.s_var}
    if not off <= saved & allowed or any(v in saved and v not in off for v in form.must & allowed):
        return None
    if host_cap is not None and sum(form.nbytes[v] for v in off) > host_cap:
        return None
    for v in off:
        if any(w != v and w in saved and w in model.s_var and by_name[w].storage_id == by_name[v].storage_id
               for w in model.s_var):
            return None
    unit = max(1, peak_budget >> 24)
    finish: dict[str, int] = {}
    clock = 0
    for v in form.names:
        if v in off:
            clock = max(clock, form.release[v]) + form.d2h[v]
            finish[v] = clock
    e_d = max(0, clock - form.forward) if off else 0
    e_h, run = 0, 0
    for v in sorted(off, key=lambda v: (form.deadline[v], problem.index[v])):
        run += form.h2d[v]
        e_h = max(e_h, run - form.deadline[v])
    rows_of = {g for g in storage_vars(problem, model) if g not in form.rows.output_storages and size[g] // unit}
    storages = {by_name[v].storage_id for v in saved if v in model.s_var} & rows_of
    fw = sum(size[g] // unit for g in storages)
    fw += sum(-form.nbytes[v] // unit for v in off if finish[v] <= form.freed_by)
    if rows_of and fw > peak_budget // unit - form.rows.outputs_bytes // unit:
        return None

    def holds(c: tuple[Any, ...]) -> bool:
        s_ok = c[1] in saved and c[1] in model.s_var
        first = {"s": s_ok, "k": s_ok and c[1] not in off, "r": c[1] in recomputed and c[1] in model.r_var}
        if c[0] in first:
            return first[c[0]]
        return c[2] in recomputed and c[2] in model.r_var and (s_ok if c[0] == "sr" else s_ok and c[1] not in off)

    delta = [0] * (len(form.rows.consts) + 1)
    for g, segs in form.segments.items():
        for lo, hi, active in elementary_spans(form.rows, g, segs):
            if any(holds(c) for c in active):
                delta[lo] += size[g] // unit
                delta[hi] -= size[g] // unit
    live = list(accumulate(delta[:-1]))
    if any(form.rows.consts[k] // unit + live[k] > peak_budget // unit for k in form.rows.kept_steps()):
        return None
    return sum(form.units(problem.recompute_cost_of(v)) for v in recomputed if v in model.r_var) + e_d + e_h
