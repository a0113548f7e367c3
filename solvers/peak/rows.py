"""A relaxation of the peak-budget problem whose optimum is a proven lower bound on recompute cost.

Every plan whose simulated step (``solvers.liveness``) peaks at most ``P`` bytes satisfies these
linear conditions on the saved-storage variables ``y_g`` of the saved-bytes program
(``solvers.mip_model``), so the least cost under them bounds the peak problem from below:

* end of the forward: every saved storage is live, with the forward's outputs;
* each backward value k: live are (plan-independent) the backward's own buffers (gradients to the
  end), and every value the backward reads directly from the forward side over its whole reading
  span ``[first read, last read]`` (saved, it lives from the start; recomputed, it is made before
  its first use and freed after its last); and (plan-dependent) each saved storage whose members
  are all first read after k: ``C_k + sum_{F(g) > k} b_g y_g <= P``.

What the conditions leave out only makes the true peak higher: values alive only to feed a
recomputation, saved values read only by recomputation (counted at the forward's end only),
recomputation before the first direct read. The sum is monotone in k, so a chain of partial sums
keeps the program linear in size, and only steps where ``C_k`` reaches a new high can bind.

The presolve of ``solvers.mip_model`` (``for_peak=True``) keeps the bound valid: each reduction
turns a plan into one that costs no more and whose step is nowhere more live (a view's base saved
instead of the view, where the base is not read, directly or through its other consumers, after
the view's last read: the same storage over no longer; a dominated saving replaced by its sole
consumer: the consumer's buffer lives over a sub-span of the pair's; a recompute chain:
recomputed together).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Iterator

from ..liveness import graph_share
from ..mip_model import Model
from ..problem import Problem, Role

_NEVER = 1 << 62  # "no direct read": a position after every backward value


@dataclass(frozen=True)
class PeakRows:
    """What the relaxation needs of a problem, independent of the plan and of the budget."""

    consts: tuple[int, ...]  # C_k per backward position: live bytes every plan has there
    outputs_bytes: int  # forward outputs' storages, live at the forward's end whatever is saved
    output_storages: frozenset[str]
    span: dict[str, tuple[int, int]]  # forward-side value -> (first, last) direct read
    covered: dict[str, list[tuple[int, int]]]  # storage -> disjoint spans where C_k counts it
    earliest: dict[str, int]  # value -> earliest direct read of it or of anything computed from it

    def kept_steps(self) -> list[int]:
        """Positions whose condition can bind: local highs of ``C_k`` (the plan-dependent part
        changes at few places); dropping the others keeps the relaxation valid."""
        c = self.consts
        n = len(c)
        return [k for k in range(n) if (k == 0 or c[k] >= c[k - 1]) and (k == n - 1 or c[k] > c[k + 1])]


def peak_rows(problem: Problem) -> PeakRows:
    problem = graph_share(problem)  # the rows count the graph alone (solve_relaxation's budget too)
    by_name, size = problem.by_name, problem.storage_size
    backward = [n.name for n in problem.nodes if n.role is Role.BACKWARD]
    pos = {name: i for i, name in enumerate(backward)}
    n_steps = len(backward)

    span: dict[str, list[int]] = {}
    for name in backward:
        k = pos[name]
        for u in by_name[name].inputs:
            if by_name[u].role is not Role.BACKWARD:
                s = span.setdefault(u, [k, k])
                s[1] = k
    for r in problem.required:
        if by_name[r].role is not Role.BACKWARD and n_steps:
            s = span.setdefault(r, [n_steps - 1, n_steps - 1])
            s[1] = n_steps - 1
    delta = [0] * (n_steps + 2)
    covered: dict[str, list[tuple[int, int]]] = {}
    per_storage: dict[str, list[tuple[int, int]]] = {}
    for v, (a, b) in span.items():
        g = by_name[v].storage_id
        if problem.counts_memory(g):
            per_storage.setdefault(g, []).append((a, b))
    for g, ivs in per_storage.items():
        merged: list[list[int]] = []
        for a, b in sorted(ivs):
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        covered[g] = [(a, b) for a, b in merged]
        for a, b in merged:
            delta[a] += size[g]
            delta[b + 1] -= size[g]

    # the backward's own buffers (storages no forward-side value shares), gradients to the end
    forward_side = {n.storage_id for n in problem.nodes if n.role is not Role.BACKWARD}
    grads = {by_name[o].storage_id for o in problem.backward_outputs}
    made: dict[str, int] = {}
    last: dict[str, int] = {}
    for name in backward:
        k = pos[name]
        g = by_name[name].storage_id
        if g not in forward_side and problem.counts_memory(g):
            # a multi-output op's outputs exist from its call on (as liveness simulates them)
            producer = by_name[name].allocated_by
            made.setdefault(g, min(k, pos.get(producer, k)) if producer is not None else k)
            last[g] = max(last.get(g, k), k)
        for u in by_name[name].inputs:
            gu = by_name[u].storage_id
            if gu in made:
                last[gu] = k
    for g, a in made.items():
        delta[a] += size[g]
        delta[(n_steps - 1 if g in grads else last[g]) + 1] -= size[g]
    consts, running = [], 0
    for k in range(n_steps):
        running += delta[k]
        consts.append(running)

    # E(v): a value is first needed in the backward no earlier than the first direct read of it
    # or of a value computed from it
    earliest: dict[str, int] = {}
    users = problem.users
    for node in reversed(problem.candidates):
        e = span[node.name][0] if node.name in span else _NEVER
        for w in users[node.name]:
            if w in earliest:
                e = min(e, earliest[w])
        earliest[node.name] = e
    outputs = frozenset(by_name[o].storage_id for o in problem.forward_outputs
                        if problem.counts_memory(by_name[o].storage_id))
    return PeakRows(tuple(consts), sum(size[g] for g in outputs), outputs,
                    {v: (a, b) for v, (a, b) in span.items()}, covered, earliest)


def storage_vars(problem: Problem, model: Model) -> dict[str, int]:
    """Counted storage -> the program's variable that says it holds a saved value."""
    link_of: dict[int, int] = {}
    for y, members in model.storage_links:
        for s in members:
            link_of[s] = y
    mem = set(model.mem_var)
    out: dict[str, int] = {}
    for v, s in model.s_var.items():
        g = problem.by_name[v].storage_id
        var = link_of.get(s, s)
        if var in mem and problem.counts_memory(g):
            out.setdefault(g, var)
    return out


def storage_segments(problem: Problem, rows: PeakRows) -> dict[str, list[tuple[int, int, tuple[Any, ...]]]]:
    """Per counted storage, the spans ``[lo, hi)`` of backward positions where it is live under a
    condition on the plan (outside the spans ``C_k`` already counts it). Conditions: ``("s", v)``
    (v is saved), ``("r", w)`` (w is recomputed), ``("sr", v, w)`` (v saved, w recomputed).

    * a saved member v: from the forward's end to its first direct read; not read directly,
      until a consumer can be made (``E``), or as long as a view of it is held;
    * a member v with a recomputed consumer w that is read directly before v is: v is needed when
      w is made (no later than w's first read) and lives to its own reads: ``[F(w), F(v))``;
    * a saved member v with a recomputed consumer w: v's saved buffer lives until w is made, which
      is no earlier than E(w): ``[L(v) + 1, E(w))`` (from the start when v is not read directly).
    """
    members: dict[str, list[str]] = {}
    for n in problem.candidates:
        members.setdefault(n.storage_id, []).append(n.name)
    users = problem.users
    n_steps = len(rows.consts)
    by_name = problem.by_name
    # held[v]: a saved v keeps its storage live at least this long. Read directly: until its first
    # read. Otherwise until each consumer is made: a view of the same storage continues it (held
    # recursively), any other consumer w is made no earlier than E(w).
    held: dict[str, int] = {}
    for node in reversed(problem.candidates):
        v = node.name
        if v in rows.span:
            held[v] = rows.span[v][0]
            continue
        h = _NEVER
        for w in users[v]:
            same = by_name[w].storage_id == node.storage_id
            h = min(h, held.get(w, 0) if same else rows.earliest.get(w, 0))
        held[v] = h
    out: dict[str, list[tuple[int, int, tuple[Any, ...]]]] = {}
    for g, vs in members.items():
        if not problem.counts_memory(g):
            continue
        segs: list[tuple[int, int, tuple[Any, ...]]] = []
        for v in vs:  # a saved member holds the storage until held[v]
            if problem.can_save(v):
                segs.append((0, min(held[v], n_steps), ("s", v)))
        for v in vs:
            fv = rows.span.get(v)
            for w in users[v]:
                if not problem.can_recompute(w):
                    continue
                if fv is not None and w in rows.span and rows.span[w][0] < fv[0]:
                    segs.append((rows.span[w][0], fv[0], ("r", w)))
                if problem.can_save(v):
                    lo = fv[1] + 1 if fv is not None else 0
                    segs.append((lo, min(rows.earliest[w], n_steps), ("sr", v, w)))
        segs = [seg for seg in segs if seg[1] > seg[0]]
        if segs:
            out[g] = segs
    return out


def elementary_spans(rows: PeakRows, g: str, segs: list[tuple[int, int, tuple[Any, ...]]]
                     ) -> Iterator[tuple[int, int, list[tuple[Any, ...]]]]:
    """The storage's spans cut where a condition starts or ends, outside its covered spans, each
    with the conditions active over all of it (the storage is live there if any holds)."""
    cov = rows.covered.get(g, [])
    cuts = sorted({p for lo, hi, _ in segs for p in (lo, hi)} | {p for a, b in cov for p in (a, b + 1)})
    for lo, hi in zip(cuts, cuts[1:]):
        if any(a <= lo and hi <= b + 1 for a, b in cov):
            continue  # C_k counts it here
        active = [c for a, b, c in segs if a <= lo and hi <= b]
        if active:
            yield lo, hi, active


def relaxed_live(problem: Problem, rows: PeakRows, saved: set[str], recomputed: set[str]) -> list[int]:
    """The relaxation's live bytes at every backward position for a plan (each <= the simulated
    live bytes there: what the tests check)."""
    size = problem.storage_size

    def holds(c: tuple[Any, ...]) -> bool:
        if c[0] == "s":
            return c[1] in saved
        if c[0] == "r":
            return c[1] in recomputed
        return c[1] in saved and c[2] in recomputed

    delta = [0] * (len(rows.consts) + 1)
    for g, segs in storage_segments(problem, rows).items():
        for lo, hi, active in elementary_spans(rows, g, segs):
            if any(holds(c) for c in active):
                delta[lo] += size[g]
                delta[hi] -= size[g]
    out, running = [], 0
    for k, c in enumerate(rows.consts):
        running += delta[k]
        out.append(c + running)
    return out


def condition_literals(c: tuple[Any, ...], x: list[Any], model: Model) -> list[Any] | None:
    """A condition of ``storage_segments`` as the CP-SAT literals whose conjunction it is; None
    if the program has no variable for it (dropping a condition keeps the relaxation valid)."""
    if c[0] == "s":
        return None if c[1] not in model.s_var else [x[model.s_var[c[1]]]]
    if c[0] == "r":
        return None if c[1] not in model.r_var else [x[model.r_var[c[1]]]]
    if c[1] not in model.s_var or c[2] not in model.r_var:
        return None
    return [x[model.s_var[c[1]]], x[model.r_var[c[2]]]]


def at_least_one(m: Any, lits: list[Any]) -> Any:
    """A new CP-SAT boolean forced to 1 by each of ``lits`` (a literal, or a pair that must both
    hold); minimized by the conditions it appears in, it is their OR."""
    t = m.new_bool_var("")
    for lit in lits:
        if isinstance(lit, tuple):
            m.add_bool_or([t, lit[0].Not(), lit[1].Not()])
        else:
            m.add_implication(lit, t)
    return t


def row_units(peak_budget: int) -> tuple[int, int]:
    """(bytes per unit, the budget in units) of every peak row: 2**24 units at most, bytes rounded
    down (constants too), so a row written is implied by the exact one: still a relaxation."""
    unit = max(1, peak_budget >> 24)
    return unit, peak_budget // unit


def add_peak_rows(m: Any, x: list[Any], problem: Problem, model: Model, rows: PeakRows, peak_budget: int, *,
                  segments: Mapping[str, list[tuple[int, int, tuple[Any, ...]]]] | None = None,
                  literals: Callable[[tuple[Any, ...]], list[Any] | None] | None = None,
                  forward_terms: Sequence[tuple[int, Any]] = ()) -> None:
    """Write the relaxation into a CP-SAT model ``m`` over the program's booleans ``x``. Bytes are
    counted in units rounded down (constants too), so the written conditions are implied by the
    exact ones: the relaxation stays a relaxation. ``segments``, ``literals`` and ``forward_terms``
    (bytes, literal) at the forward's end: another program's conditions (``solvers.mip_offload``)."""
    from ortools.sat.python import cp_model

    size = problem.storage_size
    unit, cap = row_units(peak_budget)

    def q(b: int) -> int:
        return b // unit

    # end of the forward: every saved storage, and the outputs
    fw: dict[int, int] = {}
    for g, var in storage_vars(problem, model).items():
        if g not in rows.output_storages:
            fw[var] = fw.get(var, 0) + q(size[g])
    fw = {v: c for v, c in fw.items() if c > 0}
    if fw:
        m.add(cp_model.LinearExpr.weighted_sum([x[v] for v in fw] + [lit for _, lit in forward_terms],
                                               list(fw.values()) + [q(b) for b, _ in forward_terms])
              <= cap - q(rows.outputs_bytes))

    steps = rows.kept_steps()
    if not steps:
        return

    # per storage: elementary spans outside its covered spans, each counted under the OR of the
    # literals active there; a term (coef, literal) counted at kept steps in [lo, hi) joins the
    # chain of partial sums at hi and leaves it at lo
    joins: dict[int, list[tuple[int, object]]] = {}  # chain index -> (coef, cp literal)

    def add_term(lo: int, hi: int, coef: int, literal: object) -> None:
        a = bisect.bisect_left(steps, lo)  # first kept step >= lo
        b = bisect.bisect_left(steps, hi)  # first kept step >= hi
        if a >= b:
            return
        joins.setdefault(b - 1, []).append((coef, literal))
        if a > 0:
            joins.setdefault(a - 1, []).append((-coef, literal))

    for g, segs in (storage_segments(problem, rows) if segments is None else segments).items():
        c = q(size[g])
        if c <= 0:
            continue
        for lo, hi, active in elementary_spans(rows, g, segs):
            conjs = [conj for conj in (condition_literals(cond, x, model) if literals is None else literals(cond)
                                       for cond in active)
                     if conj is not None]
            lits = [conj[0] if len(conj) == 1 else tuple(conj) for conj in conjs]
            if not lits:
                continue
            literal = lits[0] if len(lits) == 1 and not isinstance(lits[0], tuple) else at_least_one(m, lits)
            add_term(lo, hi, c, literal)

    nxt = None
    for j in range(len(steps) - 1, -1, -1):
        terms = [lit for _, lit in joins.get(j, ())]
        coefs = [coef for coef, _ in joins.get(j, ())]
        if nxt is not None:
            terms.append(nxt)
            coefs.append(1)
        room = cap - q(rows.consts[steps[j]])
        if room < 0:
            m.add_bool_or([])  # this step alone exceeds the budget: no plan
            return
        z = m.new_int_var(0, room, "")
        m.add(z == cp_model.LinearExpr.weighted_sum(terms, coefs) if terms else z == 0)
        nxt = z
