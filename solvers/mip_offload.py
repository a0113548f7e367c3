"""Offload as the third decision in the peak program: keep on the device, offload to host, or recompute.

The program is the peak relaxation of ``solvers.peak.rows`` over the saved-bytes program of
``solvers.mip_model`` (without its presolve: its dominance reductions compare device bytes only),
with, per offload candidate v (``offload_candidates``, and the values that must be offloaded), a
0-1 variable ``o_v <= s_v`` (offloaded implies saved; alone in its storage among saved values) and
the model of ``solvers.offload`` written linearly:

* device memory: in the backward, a saved v's storage is counted before its reload only where it
  is not offloaded (the literal ``k_v >= s_v - o_v`` replaces ``s_v`` there). The reload starts,
  alone on its stream, as late as it can end by the value's first backward need (where the rows
  hold it to, timed by the backward's compute in graph order); at the forward's end, v is off the device
  where ``f_v`` (<= ``o_v``) says its D2H copy, in the FIFO chain below, ended before the last step;
* D2H: copies in order of their release (the end of the value's last forward use); the finish
  times ``C_j >= C_{j-1} + d_j o_j`` and ``C_j >= (r_j + d_j) o_j`` are the FIFO's (least values);
  exposed ``E_d >= C_last - forward time``;
* H2D: all due at fixed deadlines, none before the backward starts: exposed ``E_h >= sum of the
  copies due by d - d`` for every deadline d (earliest-deadline order, the simulator's);
* host bytes ``sum b_v o_v <= cap``; objective: recompute + ``E_d`` + ``E_h``, in one time unit,
  then the least device bytes kept; a rank's memory (``with_rank_memory``) as the rows' constants.

Where this differs from ``offload_timeline`` (deadlines and freeing without the recomputations'
time and the reload stream's contention, the rows' relaxation of the peak), the plan is judged by
the simulator: ``offload_program`` repairs a plan that overshoots by offloading more, and re-solves
with the peak search's cut rows or at a lowered budget; the plan's peak and times come from
``offloaded_curve`` only.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

from .budget import format_bytes, format_seconds
from .errors import PlanError
from .liveness import simulate_plan, without_gradients
from .mip_cpsat import cpsat_program
from .mip_model import Model, build_model
from .offload import HostLink, offload_candidates, offloaded_curve
from .offload_plan import fit_offloads
from .peak.cuts import CutContext, add_cut_rows, simulated_by_step, violated_steps
from .peak.rows import (PeakRows, add_peak_rows, condition_literals, elementary_spans, peak_rows, storage_segments)
from .problem import Plan, Problem, Role, Status, plan_from_saved

TIME_UNITS = 1 << 24  # the program's time unit: the step's total time over this
TIE_UNITS = 1 << 15  # the memory tie-break's resolution: the saved bytes over this
ROUNDS = 8  # solves at most: the first, then with cuts or at a lowered budget while it overshoots
FIRST_SHARE = 0.5  # of the time limit, for the first solve (the re-solves start from its plan)


@dataclass(frozen=True)
class OffloadForm:
    """What the program needs of a problem and a link, independent of the budget; times in the
    program's integer unit (``unit`` seconds)."""
    rows: PeakRows
    names: tuple[str, ...]  # candidates, in D2H release order
    must: frozenset[str]
    nbytes: dict[str, int]
    release: dict[str, int]  # D2H may start (from the forward's start)
    d2h: dict[str, int]
    h2d: dict[str, int]
    deadline: dict[str, int]  # H2D must end (from the backward's start)
    reload_at: dict[str, int]  # backward position the reload starts at (off the device before)
    forward: int
    freed_by: int  # a D2H copy ended by then frees its value before the forward's last step
    unit: float  # seconds per unit
    segments: dict[str, list[tuple[int, int, tuple[Any, ...]]]] = field(default_factory=dict)

    def units(self, seconds: float) -> int:
        return int(round(seconds / self.unit))


def offload_form(problem: Problem, link: HostLink, must: Iterable[str] = (),
                 saved: Iterable[str] | None = None) -> OffloadForm:
    """The program's data; ``saved``: a plan whose simulation tells what the problem's simulator
    counts besides the graph (a rank's memory, ``with_rank_memory``), added to the rows' constants."""
    rows = peak_rows(problem) if saved is None else _with_rank_offsets(problem, peak_rows(problem), set(saved))
    by_name, size = problem.by_name, problem.storage_size
    names = [v for v in dict.fromkeys([*offload_candidates(problem, link), *sorted(must)])
             if v in by_name and problem.can_save(v) and problem.counts_memory(by_name[v].storage_id)]
    fwd = [n.name for n in problem.nodes if n.role is Role.FORWARD or n.name in names]
    f_end = list(accumulate(by_name[v].cost if by_name[v].role is Role.FORWARD else 0.0 for v in fwd))
    forward_s = f_end[-1] if f_end else 0.0
    last: dict[str, int] = {}
    storage_of = {by_name[v].storage_id: v for v in names}
    for i, v in enumerate(fwd):  # a copy starts after the last forward read of the value's storage
        for w in [v, *(storage_of.get(by_name[u].storage_id) for u in by_name[v].inputs)]:
            if w is not None and w in storage_of.values():
                last[w] = i
    bwd = [n for n in problem.nodes if n.role is Role.BACKWARD]
    b_end = list(accumulate(n.cost for n in bwd))
    b_start = [0.0, *b_end]
    nbytes = {v: size[by_name[v].storage_id] for v in names}
    # first needed: a saved value's storage is held to there by the rows (its first direct read,
    # else its consumers' earliest need); no plan reads it earlier
    segments = storage_segments(problem, rows)
    held = {c[1]: hi for segs in segments.values() for _, hi, c in segs if c[0] == "s"}
    need = {v: min(held.get(v, rows.earliest.get(v, len(bwd))), len(bwd)) for v in names}
    deadline = {v: b_start[need[v]] for v in names}
    # alone on its stream, as late as it can end by the deadline, not before the backward starts
    reload_at = {v: min(need[v], bisect.bisect_right(b_end, max(0.0, deadline[v] - nbytes[v] / link.h2d)))
                 for v in names}
    total = forward_s + (b_end[-1] if b_end else 0.0) + sum(nbytes.values()) * (1 / link.d2h + 1 / link.h2d) \
        + sum(problem.recompute_cost_of(n.name) for n in problem.candidates)
    unit = max(total, 1e-30) / TIME_UNITS

    def u(t: float) -> int:
        return int(round(t / unit))

    release = {v: f_end[last[v]] if v in last else 0.0 for v in names}
    ordered = tuple(sorted(names, key=lambda v: (release[v], problem.index[v])))
    return OffloadForm(rows, ordered, frozenset(must) & set(names), nbytes, {v: u(t) for v, t in release.items()},
                       {v: u(b / link.d2h) for v, b in nbytes.items()}, {v: u(b / link.h2d) for v, b in nbytes.items()},
                       {v: u(t) for v, t in deadline.items()}, reload_at, u(forward_s),
                       u(f_end[-2]) if len(f_end) > 1 else 0, unit, _offload_segments(segments, reload_at))


def _with_rank_offsets(problem: Problem, rows: PeakRows, saved: set[str]) -> PeakRows:
    """``rows`` with what the problem's simulator counts besides the graph (the difference to a
    plain copy's simulation of one plan, per backward position and at the forward's end) as
    constants: the rank's states are no plan's to change."""
    plain = replace(problem)  # a copy without the problem's derived simulator
    ours, theirs = simulate_plan(problem, saved), simulate_plan(plain, saved)
    if [b for *_, b in ours.steps] == [b for *_, b in theirs.steps]:
        return rows
    by_step = [max(0, a - b) for a, b in zip(simulated_by_step(problem, ours), simulated_by_step(plain, theirs))]
    if len(by_step) != len(rows.consts):
        return rows
    fw = [a - b for (ph, _, a), (_, _, b) in zip(ours.steps, theirs.steps) if ph == "forward"]
    return replace(rows, consts=tuple(c + d for c, d in zip(rows.consts, by_step)),
                   outputs_bytes=rows.outputs_bytes + max(0, fw[-1] if fw else 0))


def _offload_segments(segments: dict[str, list[tuple[int, int, tuple[Any, ...]]]], reload_at: dict[str, int]
                      ) -> dict[str, list[tuple[int, int, tuple[Any, ...]]]]:
    """The rows' storage segments, with a candidate's saved conditions before its reload made
    conditional on its being kept on the device (``("k", v)``, ``("kr", v, w)``)."""
    out: dict[str, list[tuple[int, int, tuple[Any, ...]]]] = {}
    for g, segs in segments.items():
        new: list[tuple[int, int, tuple[Any, ...]]] = []
        for lo, hi, cond in segs:
            p = reload_at.get(cond[1], 0) if cond[0] in ("s", "sr") else 0
            if lo < p:
                new.append((lo, min(p, hi), ("k" + cond[0][1:], *cond[1:])))
                if p < hi:
                    new.append((p, hi, cond))
            else:
                new.append((lo, hi, cond))
        out[g] = new
    return out


@dataclass
class _Vars:
    o: dict[str, Any]
    exposed: list[Any]


def _write(m: Any, x: list[Any], problem: Problem, model: Model, form: OffloadForm, peak_budget: int,
           host_cap: int | None, cuts: tuple[CutContext, list[int]] | None = None) -> _Vars:
    """The offload variables and conditions, and the peak rows counting them, into CP-SAT model ``m``;
    ``cuts``: the peak search's cut rows at these backward steps, a candidate counted there as kept
    (``k_v``) before its reload (``cut_context``)."""
    from ortools.sat.python import cp_model

    o = {v: m.new_bool_var("") for v in form.names if v in model.s_var}
    kept: dict[str, Any] = {}
    members: dict[str, list[str]] = {}
    for w in model.s_var:
        members.setdefault(problem.by_name[w].storage_id, []).append(w)
    for v, ov in o.items():
        s = x[model.s_var[v]]
        m.add_implication(ov, s)
        if v in form.must:
            m.add_implication(s, ov)
        kept[v] = m.new_bool_var("")  # s_v and not o_v; only ever pushed up
        m.add_bool_or([kept[v], s.Not(), ov])
        for w in members[problem.by_name[v].storage_id]:  # alone in its storage among the saved
            if w != v:
                m.add_bool_or([ov.Not(), x[model.s_var[w]].Not()])

    def literals(cond: tuple[Any, ...]) -> list[Any] | None:
        if cond[0] not in ("k", "kr"):
            return condition_literals(cond, x, model)
        plain = condition_literals(("s" + cond[0][1:], *cond[1:]), x, model)
        if plain is None or cond[1] not in kept:
            return plain
        return [kept[cond[1]], *plain[1:]]

    horizon = form.forward + sum(form.d2h.values()) + 2
    freed: list[tuple[int, Any]] = []
    prev = None
    for v in form.names:  # the D2H FIFO chain, least finish times
        if v not in o:
            continue
        d, r = form.d2h[v], form.release[v]
        c = m.new_int_var(0, horizon, "")
        m.add(c >= (r + d) * o[v])
        if prev is not None:
            m.add(c >= prev + d * o[v])
        f = m.new_bool_var("")  # off the device at the forward's last step
        m.add_implication(f, o[v])
        m.add(c + horizon * f <= form.freed_by + horizon)
        freed.append((-form.nbytes[v], f))
        prev = c
    e_d = m.new_int_var(0, horizon, "")
    if prev is not None:
        m.add(e_d >= prev - form.forward)
    e_h = m.new_int_var(0, sum(form.h2d.values()) + 2, "")
    due, bound = None, sum(form.h2d.values()) + 1
    for v in sorted(o, key=lambda v: (form.deadline[v], problem.index[v])):  # earliest deadline first
        # the copies due by this one's deadline, as a running sum (linear in size)
        run = m.new_int_var(0, bound, "")
        m.add(run == (due if due is not None else 0) + form.h2d[v] * o[v])
        m.add(e_h >= run - form.deadline[v])
        due = run
    if host_cap is not None and o:
        m.add(cp_model.LinearExpr.weighted_sum(list(o.values()), [form.nbytes[v] for v in o]) <= host_cap)
    add_peak_rows(m, x, problem, model, form.rows, peak_budget, segments=form.segments, literals=literals,
                  forward_terms=freed)
    ctx, taus = cuts if cuts is not None else (None, [])
    for tau in sorted(set(taus)):
        # the cut rows read a saved value through x[s_v]: before its reload, its kept literal
        here = list(x)
        for v, k in kept.items():
            if tau < form.reload_at[v]:
                here[model.s_var[v]] = k
        assert ctx is not None
        add_cut_rows(m, here, ctx, peak_budget, [tau])
    return _Vars(o, [e_d, e_h])


def cut_context(problem: Problem, model: Model, form: OffloadForm) -> CutContext:
    """The peak search's cut context over the program's segments (kept conditions read as saved
    ones: ``_write`` hands the cut rows each step's kept literals in place of the saved ones)."""
    ctx = CutContext(problem, model, form.rows)
    plain = {g: [(lo, hi, ("s" + c[0][1:], *c[1:]) if c[0] in ("k", "kr") else c) for lo, hi, c in segs]
             for g, segs in form.segments.items()}
    ctx.segments = {g: list(elementary_spans(form.rows, g, segs)) for g, segs in plain.items()}
    return ctx


@dataclass(frozen=True)
class ProgramAnswer:
    """The program's plan and its value under the program's own model (seconds)."""
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    saved: frozenset[str] | None
    offloaded: frozenset[str]
    objective_s: float | None
    bound_s: float | None


def solve_offload_program(problem: Problem, form: OffloadForm, peak_budget: int, *, host_cap: int | None = None,
                          budget: int | None = None, engine: str = "cpsat", time_limit_s: float = 30.0,
                          threads: int = 1, seed: int = 0, hint: tuple[Iterable[str], Iterable[str]] | None = None,
                          model: Model | None = None, cuts: tuple[CutContext, list[int]] | None = None
                          ) -> ProgramAnswer:
    """Least recompute + exposed transfer under the program at ``peak_budget`` by CP-SAT or HiGHS
    (``engine="highs"``); ``hint``: a (saved, offloaded) plan to start from (CP-SAT); ``model``:
    ``build_model(problem)`` if the caller has it; ``cuts``: cut rows (``cut_context``, steps)."""
    if engine not in ("cpsat", "highs"):
        raise ValueError(f"solve_offload_program: engine must be 'cpsat' or 'highs', got {engine!r}")
    from ortools.sat.python import cp_model

    model = build_model(problem) if model is None else model
    got: list[_Vars] = []
    m, x = cpsat_program(model, {}, budget,
                         lambda m, x: got.append(_write(m, x, problem, model, form, peak_budget, host_cap, cuts)))
    ov = got[0]
    timed = [(x[i], form.units(c)) for i, c in model.cost.items()] + [(e, 1) for e in ov.exposed]
    timed = [(t, c) for t, c in timed if c]
    # among plans of equal time, the least device bytes saved and kept (the simulator's peak is
    # above the rows': the plan with room left fits it more often); a unit of time outweighs it all
    total_m = sum(model.mem_size) or 1
    q = [(-(-b * TIE_UNITS // total_m)) for b in model.mem_size]
    ties = [(x[y], c) for y, c in zip(model.mem_var, q)]
    ties += [(var, form.nbytes[v] * TIE_UNITS // -total_m) for v, var in ov.o.items()]  # -ceil
    w = sum(q) + 1
    terms = [(t, w * c) for t, c in timed] + ties
    objective = {t.index: c for t, c in terms}
    if engine == "highs":
        from .highs import solve_with_highs

        n = len(m.Proto().variables)
        ans = solve_with_highs(m, {i: float(c) for i, c in objective.items()}, n, time_limit_s=time_limit_s,
                               rel_gap=1e-9)
        values = ans.values
        status, bound = ans.status, ans.bound
        value = (lambda var: values[var.index]) if values is not None else None
    else:
        m.minimize(cp_model.LinearExpr.weighted_sum([t for t, _ in terms], [c for _, c in terms]))
        if hint is not None:
            hs, ho = set(hint[0]), set(hint[1])
            try:
                hr = plan_from_saved(problem, hs, solver="hint", status=Status.HEURISTIC).recomputed
            except PlanError:
                hr = frozenset()
            for v, i in model.s_var.items():
                m.add_hint(x[i], int(v in hs))
            for v, i in model.r_var.items():
                m.add_hint(x[i], int(v in hr))
            for v, var in ov.o.items():
                m.add_hint(var, int(v in ho and v in hs))
            solver_hint_repair = True
        else:
            solver_hint_repair = False
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(time_limit_s, 0.05)
        solver.parameters.num_workers = max(1, threads)
        solver.parameters.random_seed = seed
        solver.parameters.repair_hint = solver_hint_repair  # a hint the program refuses: its nearest
        if threads <= 1:
            solver.parameters.linearization_level = 2
        code = solver.solve(m)
        status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                  cp_model.INFEASIBLE: "infeasible"}.get(code, "unknown")
        bound = solver.best_objective_bound if status in ("optimal", "feasible") else None
        value = (lambda var: solver.value(var)) if status in ("optimal", "feasible") else None
    if value is None:
        return ProgramAnswer(status, None, frozenset(), None, None)
    saved = frozenset([v for v, i in model.s_var.items() if value(x[i]) > 0.5] + model.free_saved)
    offloaded = frozenset(v for v, var in ov.o.items() if value(var) > 0.5)
    total = sum(c * value(t) for t, c in timed)
    return ProgramAnswer(status, saved, offloaded, total * form.unit,
                         None if bound is None else math.floor(bound / w) * form.unit)


def offload_program(problem: Problem, plan: Plan, peak_budget: int, link: HostLink, *, budget: int | None = None,
                    must: Iterable[str] = (), count_gradients: bool = True, engine: str = "cpsat",
                    time_limit_s: float = 30.0, threads: int = 1) -> Plan | None:
    """The program's plan, judged by the simulator (``offloaded_curve``): solved at ``peak_budget``;
    where its simulated peak overshoots, repaired by offloading more (``offload_plan.fit_offloads``),
    and re-solved with the peak search's cut rows at the backward steps it overshoots
    (``solvers.peak.cuts``), or where none is left to cut, at a budget lowered by the overshoot
    (``ROUNDS`` solves at most; the first gets ``FIRST_SHARE`` of the time). ``plan``: the plan to
    start from (the hint). None where nothing it found fits; else the plan adding the least time,
    with ``extra["offload"]`` from the simulator and ``extra["offload_program"]`` the tries."""
    began = time.perf_counter()
    sim = without_gradients(problem) if not count_gradients else problem
    form = offload_form(sim, link, must, plan.saved)
    model = build_model(sim)
    ctx: CutContext | None = None
    steps: list[int] = []
    target, hint = peak_budget, (plan.saved, plan.offloaded)
    tries: list[dict[str, Any]] = []
    best: tuple[float, Plan, dict[str, Any]] | None = None

    def offer(cand: Plan, off: frozenset[str], curve: Any, timeline: Any, how: str) -> None:
        nonlocal best
        added = cand.recompute_cost + timeline.exposed_s
        if curve.peak <= peak_budget and (best is None or added < best[0]):
            best = (added, replace(cand, offloaded=off), {
                "peak": curve.peak, "recompute_s": cand.recompute_cost, "exposed_s": timeline.exposed_s,
                "host_bytes": timeline.host_bytes, "added_s": added, "found_by": how})

    for round_ in range(ROUNDS):
        left = time_limit_s - (time.perf_counter() - began)
        if left <= 0.5:
            break
        ans = solve_offload_program(sim, form, target, host_cap=link.host_bytes, budget=budget, engine=engine,
                                    time_limit_s=left * FIRST_SHARE if round_ == 0 else left, threads=threads,
                                    hint=hint, model=model, cuts=(ctx, steps) if ctx is not None else None)
        if ans.saved is None:
            tries.append({"budget": target, "cuts": len(steps), "status": ans.status})
            if ans.status == "unknown" and round_ == 0:
                continue  # nothing found in the first share: the rest of the time
            break
        try:
            cand = plan_from_saved(sim, ans.saved, solver="offload-program", status=Status.HEURISTIC)
        except PlanError:
            break
        off = ans.offloaded & cand.saved
        curve, timeline = offloaded_curve(sim, cand.saved, off, link)
        tries.append({"budget": target, "cuts": len(steps), "status": ans.status, "objective_s": ans.objective_s,
                      "bound_s": ans.bound_s, "peak": curve.peak, "added_s": cand.recompute_cost + timeline.exposed_s})
        offer(cand, off, curve, timeline, "program")
        if curve.peak <= peak_budget:
            break  # more cuts or a lower budget cost no less under the program
        fitted = fit_offloads(sim, cand.saved, off, peak_budget, link, budget=budget)
        if fitted is not None:
            offer(fitted[0], fitted[1], *offloaded_curve(sim, fitted[0].saved, fitted[1], link),
                  "program, more offloaded to fit")
        new = violated_steps(sim, curve, target, skip=set(steps)) if (cand.saved, off) != hint else []
        if new:
            ctx = cut_context(sim, model, form) if ctx is None else ctx
            for k in new:
                ctx.note(k, set(cand.saved), set(cand.recomputed))
            steps += new
        else:  # the overshoot is in the forward, at steps cut already, or the cuts changed nothing
            target -= curve.peak - peak_budget
        hint = (cand.saved, off)
    if best is None:
        return None
    _, found, info = best
    result = replace(plan, saved=found.saved, recomputed=found.recomputed, saved_bytes=problem.saved_bytes(found.saved),
                     recompute_cost=found.recompute_cost, offloaded=found.offloaded,
                     message=(plan.message + "; " if plan.message else "")
                     + f"offload program ({engine}): {len(found.offloaded)} values, "
                     f"{format_bytes(info['host_bytes'])} to host memory, simulated peak {format_bytes(info['peak'])}, "
                     f"added time {format_seconds(info['added_s'])}")
    program = {"engine": engine, "tries": tries, "time_s": time.perf_counter() - began}
    return replace(result, extra={**result.extra, "offload": info, "offload_program": program})
