"""Rows for the forward's own peak, beside ``solvers.peak.rows`` (which counts the forward at its
end only: every saved storage and the outputs).

In the simulated forward (``solvers.liveness``) a storage is allocated when its first member is
computed and freed after its last forward use unless saved (or a forward output). So after the
forward value at position k, live are at least:

* (whatever the plan) every storage allocated at or before k whose last forward use is at or
  after k, and the outputs allocated by then: ``F_k``;
* (the plan) every saved storage allocated at or before k and last used before k: ``y_g``.

After the forward's last own value, before the ``either`` values a plan saves are computed (in
graph order, after it), also the forward inputs of each saved ``either`` value are live (kept for
it): a storage is counted once, saved or kept (``U_g >= y_g``, ``U_g >= s_e``). Without this row
the relaxation saved each layer's fp32 sigmoid (an ``either`` value) as if its fp32 input, live
with it at the forward's end, cost nothing.

``F_k + sum b_g y_g <= P`` holds for every plan whose step peaks at most ``P``: values the plan
adds to the forward (``either`` values it saves) only come after the forward's own values and
keep storages longer. A storage's term is active from its last use on to the end, so the rows'
plan-dependent part only grows with k: a row is implied by a later one with a larger ``F``, and
only positions whose ``F_k`` exceeds every later one's are written, as a chain of partial sums.
The reductions of ``mip_model.presolve`` save a value's sole consumer w instead of it (v): that
plan is more live in the forward while v is still in use (w is kept beside it), so w's term starts
only after v's last forward use (then w, no larger, stands for v's kept storage).

Where it matters: near the largest budgets the relaxation's plans save so much that the forward's
last layer (its fp32 temporaries beside every saved layer below) peaks above the budget while the
backward fits (measured in docs/benchmarks.md, "Why the bound is weak at 7B").
"""

from __future__ import annotations

from typing import Any

from ..liveness import graph_share
from ..mip_model import Model
from ..problem import Problem, Role
from .rows import row_units, storage_vars

# the either-value rows count storages of at least 1 / EITHER_SHARE of the widest either value's
EITHER_SHARE = 4


def forward_terms(problem: Problem) -> tuple[list[int], list[int], dict[str, int]]:
    """(the forward's positions kept, ``F_k`` at each, storage -> the position after its last
    forward use: where its saved term starts). Sizes as the relaxation counts them (the graph's)."""
    problem = graph_share(problem)
    size = problem.storage_size
    order = [n for n in problem.nodes if n.role is Role.FORWARD]
    alloc: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, n in enumerate(order):
        g = n.storage_id
        if problem.counts_memory(g):
            alloc.setdefault(g, k)
            last[g] = k
        for u in n.inputs:
            gu = problem.by_name[u].storage_id
            if gu in alloc:
                last[gu] = k
    outputs = {problem.by_name[o].storage_id for o in problem.forward_outputs}
    delta = [0] * (len(order) + 1)
    for g, a in alloc.items():
        delta[a] += size[g]
        if g not in outputs:
            delta[last[g] + 1] -= size[g]
    consts, running = [], 0
    for k in range(len(order)):
        running += delta[k]
        consts.append(running)
    kept: list[int] = []
    best = -1
    for k in range(len(order) - 1, -1, -1):  # strict suffix maxima of F_k
        if consts[k] > best:
            kept.append(k)
            best = consts[k]
    kept.reverse()
    starts = {g: last[g] + 1 for g in alloc if g not in outputs}
    return kept, [consts[k] for k in kept], starts


def _after_replaced(problem: Problem, model: Model, starts: dict[str, int]) -> None:
    """Presolve saves w instead of v (v's sole recomputable consumer, no larger): v is in forward
    use until its last use either way, so w's kept storage adds to it until then; w's term starts
    after v's last forward use too (then w, no larger, stands for v)."""
    by_name = problem.by_name
    changed = True
    while changed:
        changed = False
        for v, w in model.replaced.items():
            gv, gw = by_name[v].storage_id, by_name[w].storage_id
            if gv != gw and gw in starts and starts.get(gv, -1) > starts[gw]:
                starts[gw] = starts[gv]
                changed = True


def add_forward_rows(m: Any, x: list[Any], problem: Problem, model: Model, peak_budget: int) -> None:
    """Write the rows into the CP-SAT model ``m`` over the program's booleans ``x``; bytes in the
    units of ``rows.row_units`` (rounded down: still a relaxation)."""
    from ortools.sat.python import cp_model

    kept, consts, starts = forward_terms(problem)
    if not kept:
        return
    size = graph_share(problem).storage_size
    _after_replaced(problem, model, starts)
    unit, cap = row_units(peak_budget)
    # each saved storage joins the chain at the first kept position at or after its start
    joins: dict[int, list[tuple[int, int]]] = {}
    for g, var in storage_vars(problem, model).items():
        start = starts.get(g)
        coef = size[g] // unit
        if start is None or coef <= 0:
            continue
        i = next((j for j, k in enumerate(kept) if k >= start), None)
        if i is not None:
            joins.setdefault(i, []).append((coef, var))
    prev = None
    for i in range(len(kept)):
        room = cap - consts[i] // unit
        if room < 0:
            m.add_bool_or([])  # the forward alone exceeds the budget here: no plan
            return
        terms = [x[v] for _, v in joins.get(i, ())]
        coefs = [c for c, _ in joins.get(i, ())]
        if prev is not None:
            terms.append(prev)
            coefs.append(1)
        if not terms:
            continue
        z = m.new_int_var(0, room, "")
        m.add(z == cp_model.LinearExpr.weighted_sum(terms, coefs))
        prev = z
    _add_either_inputs_row(m, x, problem, model, unit, cap)


def _kept_for(problem: Problem, name: str, moment: int, outputs: set[str]) -> set[str]:
    """Storages live at graph position ``moment`` (after the forward's own values) because the
    either value ``name`` (at or after it) is computed later: its inputs, either values made
    before the moment, and, through either inputs made after it, their inputs in turn."""
    by_name, index = problem.by_name, problem.index
    out: set[str] = set()
    stack, seen = [name], {name}
    while stack:
        for u in by_name[stack.pop()].inputs:
            node = by_name[u]
            g = node.storage_id
            if not problem.counts_memory(g) or g in outputs:
                continue
            if node.role is Role.FORWARD:
                out.add(g)
            elif node.role is Role.EITHER and index[u] < moment:
                out.add(g)
            elif node.role is Role.EITHER and u not in seen:
                seen.add(u)
                stack.append(u)
    return out


def _add_either_inputs_row(m: Any, x: list[Any], problem: Problem, model: Model, unit: int, cap: int) -> None:
    """Rows at the ``either`` values a plan may save (each at the moment it would be computed):
    saved forward storages and outputs, the saved either values computed by then, and the storages
    kept for the saved either values from it on (``_kept_for``), each storage counted once. Only
    rows at either values, and kept storages, of at least ``1 / EITHER_SHARE`` of the widest (fewer
    rows and terms: still valid). The saved forward storages are summed once for all rows, the
    saved either values as a chain in graph order."""
    from ortools.sat.python import cp_model

    share = graph_share(problem)
    size, by_name, index = share.storage_size, share.by_name, share.index
    forward = [n for n in share.nodes if n.role is Role.FORWARD]
    if not forward:
        return
    end = index[forward[-1].name]
    made = {n.storage_id for n in forward if share.counts_memory(n.storage_id)}
    outputs = {by_name[o].storage_id for o in share.forward_outputs} & made
    saved_var = storage_vars(problem, model)
    eithers = [n for n in share.nodes if n.role is Role.EITHER and index[n.name] > end and n.name in model.s_var]
    if not eithers:
        return
    widest = max(size[n.storage_id] for n in eithers)
    big = [n for n in eithers if size[n.storage_id] * EITHER_SHARE >= widest]
    stand_ins = set(model.replaced.values())
    # what each row counts through y variables: saved forward storages, saved either values by then
    fw = {g: v for g, v in saved_var.items() if g in made and g not in outputs}
    z_fw = m.new_int_var(0, cap, "")
    m.add(z_fw == cp_model.LinearExpr.weighted_sum([x[v] for v in fw.values()], [size[g] // unit for g in fw]))
    own_at: list[dict[str, int]] = []  # per row: either storages counted through y by then
    counted: dict[str, int] = {}
    pos = 0
    for e in big:
        while pos < len(eithers) and index[eithers[pos].name] <= index[e.name]:
            n = eithers[pos]
            if n.storage_id in saved_var and n.storage_id not in made and n.name not in stand_ins:
                counted[n.storage_id] = saved_var[n.storage_id]
            pos += 1
        own_at.append(dict(counted))
    # per row: kept storages, each with the saved either values from this row's on that keep it
    keepers: list[dict[str, list[Any]]] = []
    for e in big:
        keep: dict[str, list[Any]] = {}
        for n in eithers:  # a stand-in's inputs are kept only in presolve's plan, not in the one it stands for
            if index[n.name] >= index[e.name] and n.name not in stand_ins:
                for g in _kept_for(share, n.name, index[e.name], outputs):
                    if size[g] * EITHER_SHARE >= widest:
                        keep.setdefault(g, []).append(x[model.s_var[n.name]])
        keepers.append(keep)
    rows_terms: list[tuple[list[Any], list[int]]] = [([], []) for _ in big]
    for i in range(len(big)):
        terms, coefs = rows_terms[i]
        for g, lits in sorted(keepers[i].items()):
            u_g = m.new_bool_var("")  # kept for a saved value from here on, or saved: counted once
            for lit in lits:
                m.add_implication(lit, u_g)
            y = fw.get(g, own_at[i].get(g))
            if y is not None:  # replaces the y term counted in the sums
                m.add_implication(x[y], u_g)
                terms.append(x[y])
                coefs.append(-(size[g] // unit))
            terms.append(u_g)
            coefs.append(size[g] // unit)
    base = cap - sum(size[g] for g in outputs) // unit
    chain = None
    for i in range(len(big)):
        fresh = own_at[i].keys() - (own_at[i - 1].keys() if i else set())
        e_terms = [x[own_at[i][g]] for g in sorted(fresh)] + ([chain] if chain is not None else [])
        e_coefs = [size[g] // unit for g in sorted(fresh)] + ([1] if chain is not None else [])
        chain = m.new_int_var(0, cap, "")
        m.add(chain == cp_model.LinearExpr.weighted_sum(e_terms, e_coefs) if e_terms else chain == 0)
        terms, coefs = rows_terms[i]
        m.add(cp_model.LinearExpr.weighted_sum([z_fw, chain] + terms, [1, 1] + coefs) <= base)
