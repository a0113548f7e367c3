"""Least recompute under a budget on the step's *peak* live memory (and optionally saved bytes).

The liveness model of ``solvers.liveness`` (forward in graph order; backward in graph order with
recomputation just in time; values freed after their last use) written linearly in 0-1 variables
and solved by CP-SAT:

* forward: each storage g is live from its producer to its last forward use, and to the end of the
  forward if saved (``y_g``) or returned. At forward step t the live bytes are a constant ``A_t``
  plus ``sum b_g y_g`` over the storages whose forward life ended before t; only the steps where
  ``A_t`` is a suffix maximum can be binding, and a chain of partial sums keeps it linear in size.
* backward: the backward values are cut into ``stages`` (consecutive groups). ``c[v,k]`` says v is
  computed in the backward in stage k (``r_v = sum_k c[v,k]``); ``avail[v,k] = s_v + sum_{j<=k}
  c[v,j]``. A backward value in stage k reading v needs ``avail[v,k] = 1``; computing w at stage k
  needs its inputs available at k. v is live in stage k when it is available and still used at k or
  later (by a backward value, or by a value computed later): ``live[v,k] >= avail[v,k] + later[w,k]
  - 1`` for each consumer w. Per stage: ``T_k + sum_g b_g live[g,k] <= peak_budget`` where ``T_k``
  is the stage's peak of backward temporaries and gradients.

Counting a value as live for its whole stage (or, in single-value stages, for its whole bucket of
recomputations: ``RECOMPUTE_BUCKETS`` moments in graph order) makes the model an upper bound on
the step's real peak: with one backward value per stage it is exact at the backward values and
conservative only among values recomputed in the same bucket. When the model finds nothing, its
limit is relaxed a few times and the exact simulation decides. Views of a saveable base are not saved (their base is; recomputing a view is free), as
torch's partitioner does. Every plan is re-simulated exactly (``solvers.liveness``): the simulation
is the reported prediction and never exceeds the budget. Since the model is conservative, its
optimum is optimal among the plans it admits: the status says ``feasible`` and
``extra["model_optimal"]`` / ``extra["model_bound"]`` say what was proven (for the model only).

Then a local search judged by the exact simulation (``solvers.peak_search``) starts from the
model's plans and the min-cut frontier: it finds plans the over-counting model cannot see (the
smallest peaks, and cheaper plans at a peak); ``extra["local_search"]`` marks its plans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from . import interrupt
from .liveness import narrow_cut_values, peak_lower_bound, simulate_plan
from .mincut import InfeasibleError
from .peak_search import improve_saved_sets
from .problem import Plan, PlanError, Problem, Role, Status, plan_from_saved, recompute_closure


# backward stages: one per backward value is the most precise but grows with the graph; 24 keeps
# CP-SAT at seconds on small transformer graphs (measured: 16 stages ~1 s, one per value > 30 s)
DEFAULT_STAGES = 24
# recomputation moments per single-value stage: more buckets count fewer values that are never
# alive together (a chain of recomputed values), at the price of more variables
RECOMPUTE_BUCKETS = 4
# share of the time limit kept for the local search after the model (it stops earlier at a local
# optimum; the model also often finishes early and leaves it more)
SEARCH_SHARE = 0.5
# relative gap (cost - proven bound) / cost at which a peak solve stops
DEFAULT_GAP = 0.01
# shares of the time limit for the first relaxation solve and for re-solving it at lowered budgets
RELAX_SHARE = 0.3
SHRINK_SHARE = 0.3
# the stage model (below) joins the search on graphs up to this many values: beyond, CP-SAT rarely
# finds its plans in time (measured: nothing at 32 layers)
STAGE_MODEL_MAX_VALUES = 600
_DEBUG = bool(__import__("os").environ.get("OPT_REMAT_DEBUG_PEAK"))


class PeakInfeasibleError(InfeasibleError):
    """No plan keeps the step's peak under the budget; says the smallest peak found and the floor
    no plan can go below (``solvers.liveness.peak_lower_bound``)."""

    def __init__(self, peak_budget: int, min_peak: int | None, proven: bool,
                 floor: int | None = None, *, infeasible_proven: bool = False) -> None:
        self.peak_budget = peak_budget
        self.min_peak = min_peak
        self.floor = floor
        self.min_feasible_bytes = None
        self.infeasible_proven = infeasible_proven
        proven = proven or (min_peak is not None and min_peak == floor)
        what = "the smallest peak" if proven else "the smallest peak found"
        bound = f"; no plan can peak below {floor} bytes" if floor is not None and not proven else ""
        why = " (proven: no plan fits the relaxation)" if infeasible_proven else ""
        super().__init__(
            f"peak budget {peak_budget} bytes is infeasible{why}: {what} of any plan is "
            f"{min_peak} bytes{'' if proven else ' (not proven minimal in the time limit)'}{bound}; "
            f"raise peak_budget to at least {min_peak}")


@dataclass
class _Layout:
    stage_of_bw: dict[str, int]  # backward value -> stage
    stages: int
    first_read: dict[str, int]  # candidate -> earliest stage a backward value reads it directly
    last_read: dict[str, int]  # candidate -> latest such stage
    window: dict[str, tuple[int, int]]  # candidate -> stages where computing it can be useful
    transient: list[int]  # per stage: peak bytes of backward temporaries and gradients
    transient_before: list[int]  # per single-value stage: those bytes just before it runs
    read_stages: dict[str, set[int]]  # candidate -> stages whose backward values read it
    single: list[bool]  # the stage holds one backward value


def _lifetimes(problem: Problem, order: list[str],
               runs: Callable[[str], bool]) -> tuple[dict[str, int], dict[str, int]]:
    """Per counted storage: the step that first produces it and the last step that reads it,
    over the values of ``order`` for which ``runs`` holds."""
    by_name = problem.by_name
    produced: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, name in enumerate(order):
        if not runs(name):
            continue
        g = by_name[name].storage_id
        if problem.counts_memory(g):
            produced.setdefault(g, i)
            last[g] = max(last.get(g, i), i)
        for u in by_name[name].inputs:
            gu = by_name[u].storage_id
            if gu in produced:
                last[gu] = max(last[gu], i)
    return produced, last


def _layout(problem: Problem, stages: int | None) -> _Layout:
    by_name = problem.by_name
    backward = [n.name for n in problem.nodes if n.role is Role.BACKWARD]
    k = len(backward)
    count = max(1, min(k, stages or k))
    stage_of_bw = {name: (i * count) // max(k, 1) for i, name in enumerate(backward)}

    first_read: dict[str, int] = {}
    last_read: dict[str, int] = {}
    read_stages: dict[str, set[int]] = {}
    for name in backward:
        st = stage_of_bw[name]
        for u in by_name[name].inputs:
            if by_name[u].role is not Role.BACKWARD:
                first_read[u] = min(first_read.get(u, st), st)
                last_read[u] = max(last_read.get(u, st), st)
                read_stages.setdefault(u, set()).add(st)
    for r in problem.required:  # returned directly: needed at the very end
        if by_name[r].role is not Role.BACKWARD:
            read_stages.setdefault(r, set()).add(count - 1)
            first_read[r] = min(first_read.get(r, count - 1), count - 1)
            last_read[r] = count - 1
    # a value may be needed in the backward wherever a later value that reads it is needed
    window: dict[str, tuple[int, int]] = {}
    users = problem.users
    for node in reversed(problem.candidates):
        lo, hi = first_read.get(node.name, count), last_read.get(node.name, -1)
        for w in users[node.name]:
            if w in window:
                lo, hi = min(lo, window[w][0]), max(hi, window[w][1])
        if hi >= 0:
            window[node.name] = (lo, hi)

    # backward temporaries (backward values' own storages) and gradients, per stage
    size = problem.storage_size
    produced, last = _lifetimes(problem, backward, lambda name: True)
    grads = {by_name[o].storage_id for o in problem.backward_outputs}
    delta = [0] * (k + 1)
    for g, start in produced.items():
        end = k - 1 if g in grads else last[g]
        delta[start] += size[g]
        delta[end + 1] -= size[g]
    transient = [0] * count
    transient_before = [0] * count
    members = [0] * count
    allocated_at = [0] * (k + 1)
    for g, start in produced.items():
        allocated_at[start] += size[g]
    running = 0
    for i, name in enumerate(backward):
        running += delta[i]
        st = stage_of_bw[name]
        members[st] += 1
        transient[st] = max(transient[st], running)
        transient_before[st] = running - allocated_at[i]
    return _Layout(stage_of_bw, count, first_read, last_read, window, transient,
                   transient_before, read_stages, [m == 1 for m in members])


def solve_peak(problem: Problem, peak_budget: int, budget: int | None = None, *,
               stages: int | None = None, time_limit_s: float = 60.0, threads: int = 2,
               seed: int = 0, hint_saved: set[str] | None = None, gap: float = DEFAULT_GAP,
               candidates: Iterable[Iterable[str]] = (),
               search_share: float = SEARCH_SHARE) -> Plan:
    """The least-recompute plan whose simulated step peak is <= ``peak_budget`` bytes, with a
    proven lower bound on the cost of every such plan (``plan.bound``; the gap in
    ``extra["gap"]``).

    1. The relaxation of ``solvers.peak_bound`` (CP-SAT) gives the bound, and proves a budget
       infeasible when it admits no plan. Its plan often fits the exact simulation: then it is
       optimal up to the solver's gap.
    2. Otherwise plans that fit: the relaxation re-solved at budgets lowered by its overshoot; every
       plan the project can make cheaply (min-cut across its trade-off, checkpointing every k-th
       residual value, ``hint_saved`` and ``candidates`` such as torch's or the default plan); on
       small graphs the stage model below; then the local search of ``solvers.peak_search`` from
       all of these, judged by the exact simulation.
    The solve returns as soon as the gap is at most ``gap`` (relative). Raises PeakInfeasibleError
    naming the smallest peak found (and whether no plan can fit, proven by the relaxation).
    """
    if peak_budget < 0:
        raise ValueError(f"peak_budget must be >= 0 bytes, got {peak_budget}")
    from .mip_model import build_model, presolve
    from .peak_bound import peak_rows, solve_relaxation

    start = time.perf_counter()
    deadline = start + float(time_limit_s)

    def left() -> float:  # after a Ctrl-C (solvers.interrupt) no time is left: the best plan so far
        return 0.0 if interrupt.requested() else max(0.0, deadline - time.perf_counter())

    frontier = _frontier(problem) + _candidate_plans(
        problem, ([hint_saved] if hint_saved is not None else []) + [set(c) for c in candidates])
    best = _cheapest_fitting(frontier, peak_budget, budget)
    best_plan, best_peak = (best[0], best[1]) if best is not None else (None, None)

    model = presolve(problem, build_model(problem))
    rows = peak_rows(problem)
    relaxed = solve_relaxation(problem, model, rows, peak_budget, budget, threads=threads, seed=seed,
                               time_limit_s=RELAX_SHARE * time_limit_s,
                               hint_saved=set(best_plan.saved) if best_plan is not None else None)
    if relaxed.status == "infeasible":
        raise PeakInfeasibleError(peak_budget, min((pk for _, pk in frontier), default=None), False,
                                  peak_lower_bound(problem), infeasible_proven=True)
    lower = relaxed.bound or 0.0
    tried: list[frozenset[str]] = []

    def offer(saved: Iterable[str], how: str) -> int | None:
        nonlocal best_plan, best_peak
        try:
            plan = plan_from_saved(problem, saved, solver=how, status=Status.HEURISTIC)
        except PlanError:
            return None
        tried.append(plan.saved)
        peak = simulate_plan(problem, plan.saved).peak
        if _DEBUG:
            print(f"[peak] {how}: cost {plan.recompute_cost:.6g} peak {peak} budget {peak_budget} "
                  f"bound {lower:.6g} t={time.perf_counter() - start:.1f}s", flush=True)
        if (peak <= peak_budget and (budget is None or plan.saved_bytes <= budget)
                and (best_plan is None or (plan.recompute_cost, plan.saved_bytes)
                     < (best_plan.recompute_cost, best_plan.saved_bytes))):
            best_plan, best_peak = plan, peak
        return peak

    def done() -> bool:
        return best_plan is not None and best_plan.recompute_cost - lower <= gap * best_plan.recompute_cost

    overshoot = 0
    if relaxed.saved is not None:
        peak = offer(relaxed.saved, "relaxation")
        overshoot = 0 if peak is None else peak - peak_budget
    # plans that fit: the relaxation re-solved at budgets lowered by what its plans overshoot the
    # exact simulation, then bisected between the highest budget whose plan did not fit and the
    # lowest whose plan did; on repeated layers, one decision per position (a far smaller program)
    primal = _tied_model(problem, model)
    fits_at, over_at = None, peak_budget if overshoot > 0 else None
    target, hint = peak_budget - overshoot, relaxed.saved
    shrink_until = time.perf_counter() + SHRINK_SHARE * time_limit_s
    while over_at is not None and not done() and time.perf_counter() < shrink_until - 0.5 and left() > 0:
        again = solve_relaxation(problem, primal, rows, target, budget, threads=threads, seed=seed,
                                 time_limit_s=min(shrink_until - time.perf_counter(), left(),
                                                  max(1.0, 0.1 * time_limit_s)),
                                 hint_saved=set(hint) if hint is not None else None)
        peak = None if again.saved is None else offer(again.saved, "relaxation")
        if peak is not None and peak <= peak_budget:
            fits_at, hint = target, again.saved
        else:
            over_at = target
            if peak is not None:
                hint = again.saved
        if fits_at is None:
            target -= max(peak - peak_budget if peak is not None else 0, peak_budget // 100)
        elif over_at - fits_at <= peak_budget // 200:
            break
        else:
            target = (fits_at + over_at) // 2
        if target <= 0:
            break
    attempts: list[frozenset[str]] = []
    if not done() and len(problem.candidates) <= STAGE_MODEL_MAX_VALUES and left() > 0:
        try:
            plan = _solve_model(problem, peak_budget, budget, stages=stages, time_limit_s=left(),
                                threads=threads, seed=seed, hint_saved=hint_saved,
                                _frontier_plans=frontier,
                                _deadline=time.perf_counter() + (1.0 - search_share) * left(),
                                _attempts=attempts)
            offer(plan.saved, "stage-model")
        except PeakInfeasibleError:
            pass
    found = None
    if not done() and left() > 0:
        starts = ([best_plan.saved] if best_plan is not None else []) + tried + attempts \
            + [p.saved for p, _ in frontier]
        found = improve_saved_sets(problem, starts, peak_budget, budget, time_limit_s=left())
        if found is not None and simulate_plan(problem, found.saved).peak != found.peak:
            raise RuntimeError("opt-remat internal error: the local search's simulation disagrees "
                               "with solvers.liveness")
        if found is not None:
            offer(found.saved, "local-search")
    elapsed = time.perf_counter() - start
    if best_plan is None:
        peaks = [pk for _, pk in frontier] + ([found.peak] if found is not None else [])
        raise PeakInfeasibleError(peak_budget, min(peaks) if peaks else None, False,
                                  peak_lower_bound(problem))
    cost = best_plan.recompute_cost
    lower = min(lower, cost)
    closed = cost - lower <= 1e-12 * max(cost, 1e-30) or relaxed.status == "optimal" and cost <= lower
    rel_gap = 0.0 if cost <= 0 else (cost - lower) / cost
    extra = {"peak": best_peak, "peak_budget": peak_budget, "gap": rel_gap,
             "relaxation_status": relaxed.status, "relaxation_bound": relaxed.bound,
             "found_by": best_plan.solver, "local_search": best_plan.solver == "local-search",
             "floor": peak_lower_bound(problem)}
    return replace(best_plan, solver="cpsat-peak", budget=budget, solve_time_s=elapsed,
                   status=Status.OPTIMAL if closed else Status.FEASIBLE,
                   objective=cost, bound=lower, extra=extra,
                   message=f"simulated peak {best_peak} bytes (peak budget {peak_budget}); "
                           f"plan by {best_plan.solver}; recompute cost within {rel_gap:.2%} of the "
                           "proven bound")


def _candidate_plans(problem: Problem, saved_sets: Iterable[Iterable[str]]) -> list[tuple[Plan, int]]:
    """Callers' plans (the default path's, torch's) with their simulated peaks; invalid ones skipped."""
    out = []
    for saved in saved_sets:
        try:
            plan = plan_from_saved(problem, saved, solver="candidate", status=Status.HEURISTIC)
        except PlanError:
            continue
        out.append((plan, simulate_plan(problem, plan.saved).peak))
    return out


def _tied_model(problem: Problem, model):
    """The program with one decision per repeated-layer position (the last layer free), or the
    program itself when the graph has no repeated layers."""
    from .mip_model import tie
    from .symmetry import find_repeated

    groups = [g[:-1] for g in find_repeated(problem).groups if len(g) > 2]
    if not groups:
        return model
    try:
        return tie(model, groups)
    except InfeasibleError:
        return model


def _solve_model(problem: Problem, peak_budget: int, budget: int | None = None, *,
                 stages: int | None = None, time_limit_s: float = 60.0, threads: int = 2,
                 seed: int = 0, hint_saved: set[str] | None = None,
                 _retries: int = 3, _relax: int = 3, _model_budget: int | None = None,
                 _frontier_plans: list[tuple[Plan, int]] | None = None,
                 _deadline: float | None = None, _attempts: list[frozenset[str]] | None = None) -> Plan:
    """The stage model's plan (its limit relaxed or tightened a few times, the simulation judging),
    or the best fitting frontier plan; every model plan is appended to ``_attempts``."""
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    if _deadline is not None:  # relaxed and tightened re-solves share one time limit
        time_limit_s = max(0.01, min(time_limit_s, _deadline - start))
    lay = _layout(problem, DEFAULT_STAGES if stages is None else stages)
    limit = peak_budget if _model_budget is None else _model_budget  # what the model must meet
    by_name = problem.by_name
    size = problem.storage_size
    m = cp_model.CpModel()
    cand = [n.name for n in problem.candidates if n.name in lay.window or n.name in problem.backward_reads]

    s: dict[str, cp_model.IntVar] = {}
    c: dict[tuple[str, int], cp_model.IntVar] = {}
    r: dict[str, cp_model.LinearExpr] = {}
    for v in cand:
        owner = by_name[v].storage_id
        # views are not saved (their base is, and the view is recomputed for free): saving a view
        # while recomputing its base would hold two buffers of one storage
        view_of_saveable = (owner != v and owner in by_name and problem.counts_memory(owner)
                            and problem.can_save(owner) and problem.can_recompute(v)
                            and owner in by_name[v].inputs)
        if problem.can_save(v) and not view_of_saveable:
            s[v] = m.NewBoolVar(f"s_{v}")
        lo, hi = lay.window.get(v, (0, lay.stages - 1))
        if problem.can_recompute(v):
            for k in range(lo, hi + 1):
                c[v, k] = m.NewBoolVar(f"c_{v}_{k}")
        terms = [c[v, k] for k in range(lo, hi + 1) if (v, k) in c]
        r[v] = sum(terms) if terms else 0
        if v in s or terms:
            m.Add((s[v] if v in s else 0) + r[v] <= 1)

    def avail(v: str, k: int) -> cp_model.LinearExpr:
        lo, _ = lay.window.get(v, (0, -1))
        return (s[v] if v in s else 0) + sum(c[v, j] for j in range(lo, k + 1) if (v, j) in c)

    # reads: available by the first stage that reads it
    for v, k in lay.first_read.items():
        if v in r or v in s:
            m.Add(avail(v, k) >= 1)
        elif by_name[v].role is not Role.INPUT:
            raise InfeasibleError(f"the backward reads {v!r}, which can be neither saved nor recomputed")
    # computing w in stage k needs its inputs there; graph inputs must be saved (free) to be used
    for (w, k), var in c.items():
        for u in by_name[w].inputs:
            if by_name[u].role is Role.INPUT and u in s:
                m.AddImplication(var, s[u])
            elif u in s or any((u, j) in c for j in range(k + 1)):
                m.Add(avail(u, k) >= var)
            else:
                m.Add(var == 0)
    # ... and happens only where it is needed, as just-in-time recomputation does: at a stage that
    # reads w or computes a consumer of w. With availability by the first need, this pins every
    # computation to its first need, so lifetimes end no earlier in the model than when it runs.
    for (w, k), var in c.items():
        if k in lay.read_stages.get(w, ()):
            continue
        later_users = [c[x, k] for x in problem.users[w] if (x, k) in c]
        if later_users:
            m.Add(var <= sum(later_users))
        else:
            m.Add(var == 0)

    # storages: y_g (saved) per counted storage
    y: dict[str, cp_model.IntVar] = {}
    for v, var in s.items():
        g = by_name[v].storage_id
        if not problem.counts_memory(g) or size[g] == 0:
            continue
        if g not in y:
            y[g] = m.NewBoolVar(f"y_{g}")
        m.AddImplication(var, y[g])
    if budget is not None:
        m.Add(sum(size[g] * yg for g, yg in y.items()) <= budget)

    # ---- forward peak ----
    # The forward runs the forward values and the saved ``either`` values, in graph order.
    sequence = [n.name for n in problem.nodes
                if n.role is Role.FORWARD or (n.role is Role.EITHER and n.name in s)]
    position = {name: i for i, name in enumerate(sequence)}
    outputs = {by_name[o].storage_id for o in problem.forward_outputs}
    prod, end = _lifetimes(problem, sequence, lambda name: by_name[name].role is Role.FORWARD)
    # a saved either-value reads forward values late in the forward: they stay alive to its end
    # (counted like saved ones: conservative by at most the steps between)
    kept: dict[str, cp_model.IntVar] = dict(y)
    extended: set[str] = set()
    for name in sequence:
        if by_name[name].role is not Role.EITHER:
            continue
        for u in by_name[name].inputs:
            gu = by_name[u].storage_id
            if gu not in prod or gu in outputs:
                continue
            if gu not in extended:
                keep = m.NewBoolVar(f"keep_{gu}")
                if gu in y:
                    m.AddImplication(y[gu], keep)
                kept[gu] = keep
                extended.add(gu)
            m.AddImplication(s[name], kept[gu])
    nf = len(sequence)
    delta = [0] * (nf + 1)
    ended_at: dict[int, list[str]] = {}
    for g, p in prod.items():
        delta[p] += size[g]
        if g in outputs:
            continue  # alive to the end of the forward
        delta[end[g] + 1] -= size[g]
        ended_at.setdefault(end[g] + 1, []).append(g)
    either_saved = sorted((position[v], v) for v in s if by_name[v].role is Role.EITHER
                          and problem.counts_memory(by_name[v].storage_id))
    const = []
    running = 0
    for i in range(nf):
        running += delta[i]
        const.append(running)
    # only suffix maxima of the constant part can bind: the variable part only grows with t
    binding: list[int] = []
    best = -1
    for i in range(nf - 1, -1, -1):
        if const[i] > best:
            binding.append(i)
            best = const[i]
    binding.reverse()
    ended = sorted((t, g) for t, gs in ended_at.items() for g in gs if g in kept)
    partial, j, e = 0, 0, 0
    for t in binding:
        # a chain of partial sums keeps the model linear in size
        new_terms = []
        while j < len(ended) and ended[j][0] <= t:
            new_terms.append(size[ended[j][1]] * kept[ended[j][1]])
            j += 1
        while e < len(either_saved) and either_saved[e][0] <= t:
            v = either_saved[e][1]
            new_terms.append(size[by_name[v].storage_id] * s[v])
            e += 1
        if new_terms:
            total = m.NewIntVar(0, max(limit, 0), f"fw_kept_{t}")  # over it is infeasible anyway
            m.Add(total == partial + sum(new_terms))
            partial = total
        m.Add(const[t] + partial <= limit)
    # ---- backward peak, per stage ----
    # Moments per stage: for single-value stages, at the backward value itself (values computed in
    # the stage and used only by values computed there are freed by then) and during the
    # recomputation before it, split into buckets of the values that may be recomputed there, in
    # the graph order just-in-time recomputation follows (a value counts in a bucket if it exists
    # by the bucket's end and is used in it or later). Coarse stages count everything computed in
    # the stage at once.
    computable = {w for (w, _) in c}
    consumers = {v: [w for w in problem.users[v] if w in computable] for v in cand}
    bucket: dict[tuple[str, int], int] = {}
    buckets = [1] * lay.stages
    for k in range(lay.stages):
        events = sorted((w for (w, j) in c if j == k), key=problem.index.__getitem__)
        if lay.single[k] and events:
            buckets[k] = min(RECOMPUTE_BUCKETS, len(events))
            for i, w in enumerate(events):
                bucket[w, k] = i * buckets[k] // len(events)
    terms: dict[tuple[int, int | str], list] = {}
    live: dict[tuple[str, int, int | str], cp_model.IntVar] = {}

    def live_var(g: str, k: int, moment: int | str) -> cp_model.IntVar:
        if (g, k, moment) not in live:
            live[g, k, moment] = m.NewBoolVar(f"live_{g}_{k}_{moment}")
            terms.setdefault((k, moment), []).append(size[g] * live[g, k, moment])
        return live[g, k, moment]

    for v in cand:
        g = by_name[v].storage_id
        if not problem.counts_memory(g) or size[g] == 0:
            continue
        lo = 0 if v in s else lay.window.get(v, (lay.stages, -1))[0]
        hi = max([lay.last_read.get(v, -1)] + [lay.window[w][1] for w in consumers[v] if w in lay.window])
        for k in range(max(lo, 0), hi + 1):
            read_here_or_later = lay.last_read.get(v, -1) >= k
            before = avail(v, k - 1) if k > 0 else (s[v] if v in s else 0)
            if lay.single[k]:
                at = live_var(g, k, "at")
                a = avail(v, k)
                if read_here_or_later:
                    m.Add(at >= a)
                for w in consumers[v]:
                    later = [c[w, j] for j in range(k + 1, lay.stages) if (w, j) in c]
                    if later:
                        m.Add(at >= a + sum(later) - 1)
            for b in range(buckets[k]):
                during = live_var(g, k, b)
                here = c[v, k] if (v, k) in c and bucket.get((v, k), 0) <= b else 0
                a = before + here
                if read_here_or_later:
                    m.Add(during >= a)
                for w in consumers[v]:
                    later = [c[w, j] for j in range(k + 1, lay.stages) if (w, j) in c]
                    if (w, k) in c and bucket.get((w, k), 0) >= b:
                        later.append(c[w, k])
                    if later:
                        m.Add(during >= a + sum(later) - 1)
    for k in range(lay.stages):
        if lay.single[k]:
            m.Add(lay.transient[k] + sum(terms.get((k, "at"), [])) <= limit)
            for b in range(buckets[k]):
                m.Add(lay.transient_before[k] + sum(terms.get((k, b), [])) <= limit)
        else:
            m.Add(lay.transient[k] + sum(terms.get((k, 0), [])) <= limit)

    # objective: recompute cost (scaled to integers), tie-break on saved bytes
    costs = {v: problem.recompute_cost_of(v) for v in r}
    positive = [x for x in costs.values() if x > 0]
    scale = (2**40 / sum(positive)) if positive else 1.0
    m.Minimize(sum(int(round(costs[v] * scale)) * r[v] for v in r if costs[v] > 0 and not isinstance(r[v], int)))

    frontier = _frontier(problem) if _frontier_plans is None else _frontier_plans
    warm = None
    if hint_saved is None:  # warm start from the cheapest frontier plan that fits
        best = _cheapest_fitting(frontier, peak_budget, budget)
        if best is not None:
            warm = best[0]
            hint_saved = set(warm.saved)
    if hint_saved is not None:  # warm start: saved values, and recomputation at first need
        first_need = _first_need_stage(problem, lay, set(hint_saved))
        for v, var in s.items():
            m.AddHint(var, int(v in hint_saved))
        for (v, k), var in c.items():
            m.AddHint(var, int(first_need.get(v) == k))
    solver = cp_model.CpSolver()
    # after a Ctrl-C, later solves of the same call only read back their hint
    solver.parameters.max_time_in_seconds = 0.01 if interrupt.requested() else float(time_limit_s)
    solver.parameters.catch_sigint_signal = False  # ours: stops the search and says so
    solver.parameters.num_workers = max(1, int(threads))
    solver.parameters.random_seed = int(seed)
    with interrupt.stop_on_sigint(solver.stop_search):
        status = solver.Solve(m)
    elapsed = time.perf_counter() - start
    if status == cp_model.INFEASIBLE:
        # The model over-counts, so plans it rejects may still fit: relax its limit and let the
        # exact simulation judge (a few times), then the best fitting min-cut plan.
        if _relax > 0:
            return _solve_model(problem, peak_budget, budget, stages=stages, time_limit_s=time_limit_s,
                                threads=threads, seed=seed, _retries=1, _relax=_relax - 1,
                                _model_budget=int(limit * 1.1) + 1, _frontier_plans=frontier,
                                _deadline=_deadline, _attempts=_attempts)
        return _fallback(problem, peak_budget, budget, elapsed, time_limit_s, frontier,
                         model_infeasible=True)
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"opt-remat internal error: invalid peak model: {m.Validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _fallback(problem, peak_budget, budget, elapsed, time_limit_s, frontier)
    elapsed = time.perf_counter() - start
    saved = [v for v, var in s.items() if solver.Value(var)]
    if warm is not None and problem.recompute_cost(recompute_closure(problem, saved)[0]) > warm.recompute_cost:
        saved = list(warm.saved)  # the model could not even represent the warm start as well
    plan = plan_from_saved(problem, saved, solver="cpsat-peak", status=Status.FEASIBLE,
                           solve_time_s=elapsed, budget=budget)
    curve = simulate_plan(problem, plan.saved)
    if _attempts is not None:
        _attempts.append(plan.saved)
    if curve.peak > peak_budget:
        # The model over-counts almost everywhere but not quite everywhere (an unsaved ``either``
        # value computed in the forward only to make a saved one is not in it): tighten by the
        # overshoot and solve again; the simulation has the last word.
        if _retries > 0:
            return _solve_model(problem, peak_budget, budget, stages=stages, time_limit_s=time_limit_s,
                                threads=threads, seed=seed, _retries=_retries - 1, _relax=0,
                                _model_budget=limit - (curve.peak - peak_budget), _frontier_plans=frontier,
                                _deadline=_deadline, _attempts=_attempts)
        return _fallback(problem, peak_budget, budget, elapsed, time_limit_s, frontier,
                         model_infeasible=True)
    model_bound = min(solver.BestObjectiveBound() / scale, plan.recompute_cost)
    proven = status == cp_model.OPTIMAL and limit == peak_budget  # a relaxed model proves nothing
    # The model is a safe (upper) bound on live memory, so its optimum is optimal among the plans
    # it can see; the status stays "feasible" and the model's bound is reported separately.
    return Plan(saved=plan.saved, recomputed=plan.recomputed, saved_bytes=plan.saved_bytes,
                recompute_cost=plan.recompute_cost, solver="cpsat-peak",
                status=Status.FEASIBLE if proven else Status.TIME_LIMIT,
                solve_time_s=elapsed, objective=plan.recompute_cost, bound=None, budget=budget,
                message=(f"simulated peak {curve.peak} bytes (peak budget {peak_budget}); "
                         + ("optimal for the stage model" if proven else "time limit hit")),
                extra={"peak": curve.peak, "peak_budget": peak_budget, "stages": lay.stages,
                       "model_optimal": proven, "model_bound": model_bound,
                       "num_vars": len(s) + len(c) + len(y) + len(live)})


def _frontier(problem: Problem) -> list[tuple[Plan, int]]:
    """Min-cut plans across the memory/recompute trade-off, and checkpointing plans, with their
    simulated peaks: cheap candidates (warm start, fallback, search starts, the smallest peak
    found) computed once per solve."""
    from .mincut import lam_range, solve_mincut
    lo, hi = lam_range(problem)
    out = []
    for lam in [0.0, lo] + [lo * (hi / max(lo, 1e-300)) ** (i / 8) for i in range(1, 9)]:
        try:
            plan = solve_mincut(problem, lam)
        except InfeasibleError:
            continue
        out.append((plan, simulate_plan(problem, plan.saved).peak))
    from .baselines import uniform_checkpoint
    for every in (1, 2, 4, 8):  # what torch.utils.checkpoint every k-th block does
        try:
            plan = uniform_checkpoint(problem, None, every=every)
        except (PlanError, InfeasibleError):
            continue
        out.append((plan, simulate_plan(problem, plan.saved).peak))
    return out + _checkpoint_plans(problem)


# checkpointing starts: every k-th value crossing a cut at most w times the narrowest, for these
# (w, k): narrow cuts and long strides hold little and recompute much, wide cuts the reverse
# (measured on a 32-layer LLaMA graph: peaks 1.04x-1.3x the floor, min-cut plans at 3.3x)
CHECKPOINT_STARTS = ((1.0, 1), (1.0, 2), (1.0, 3), (1.0, 6), (2.0, 1), (2.0, 2), (4.0, 1), (4.0, 2))


def _checkpoint_plans(problem: Problem) -> list[tuple[Plan, int]]:
    """Checkpointing plans: every k-th narrow-cut value saved (and what is free), the rest
    recomputed; low-peak starting points that min-cut plans do not reach."""
    by_name = problem.by_name
    free = {n.name for n in problem.nodes if n.role is Role.INPUT and problem.can_save(n.name)}
    out = []
    values: dict[float, list[str]] = {}
    for widest, k in CHECKPOINT_STARTS:
        if widest not in values:
            values[widest] = narrow_cut_values(problem, widest, largest_only=widest > 1.0)
        saved = {v for v in values[widest][::k] if problem.can_save(v)} | free
        for _ in range(4):  # values that cannot be recomputed (dropout) are saved where needed
            recomputed, _ = recompute_closure(problem, saved)
            needed = {u for v in recomputed for u in by_name[v].inputs} | set(problem.backward_reads)
            must = {u for u in needed - saved - recomputed if problem.can_save(u)}
            if not must:
                break
            saved |= must
        try:
            plan = plan_from_saved(problem, saved, solver="checkpoint", status=Status.HEURISTIC)
        except PlanError:
            continue  # something the backward needs can be neither saved nor recomputed
        out.append((plan, simulate_plan(problem, plan.saved).peak))
    return out


def _cheapest_fitting(frontier: list[tuple[Plan, int]], peak_budget: int,
                      budget: int | None) -> tuple[Plan, int] | None:
    fitting = [(p, peak) for p, peak in frontier
               if peak <= peak_budget and (budget is None or p.saved_bytes <= budget)]
    return min(fitting, key=lambda x: (x[0].recompute_cost, x[0].saved_bytes)) if fitting else None


def _infeasible(problem: Problem, peak_budget: int, frontier: list[tuple[Plan, int]]) -> PeakInfeasibleError:
    """The error naming the smallest simulated peak among the frontier plans (not proven)."""
    return PeakInfeasibleError(peak_budget, min((peak for _, peak in frontier), default=None), False,
                               peak_lower_bound(problem))


def _fallback(problem: Problem, peak_budget: int, budget: int | None, elapsed: float,
              time_limit_s: float, frontier: list[tuple[Plan, int]],
              model_infeasible: bool = False) -> Plan:
    """No plan from CP-SAT in time: the cheapest frontier plan that fits, said so."""
    best = _cheapest_fitting(frontier, peak_budget, budget)
    if best is None:
        raise _infeasible(problem, peak_budget, frontier)
    plan, peak = best
    return Plan(saved=plan.saved, recomputed=plan.recomputed, saved_bytes=plan.saved_bytes,
                recompute_cost=plan.recompute_cost, solver="cpsat-peak",
                status=Status.HEURISTIC if model_infeasible else Status.TIME_LIMIT,
                solve_time_s=elapsed, objective=plan.recompute_cost, bound=None, budget=budget,
                message=("the stage model admits no plan (it over-counts memory): "
                         if model_infeasible else f"CP-SAT found no plan in {time_limit_s} s: ")
                + f"fell back to the {plan.solver} plan with simulated peak {peak} bytes",
                extra={"peak": peak, "peak_budget": peak_budget})


def _first_need_stage(problem: Problem, lay: _Layout, saved: set[str]) -> dict[str, int]:
    """Where just-in-time recomputation computes each value the plan does not save."""
    from .liveness import backward_schedule
    stage = {}
    current = 0
    for name in reversed(backward_schedule(problem, saved)):
        if name in lay.stage_of_bw:
            current = lay.stage_of_bw[name]
        else:
            stage[name] = current
    return stage


def mincut_under_peak(problem: Problem, peak_budget: int, budget: int | None = None, *,
                      candidates: Iterable[Iterable[str]] = ()) -> Plan:
    """The cheapest frontier plan (min-cut or checkpointing, or one of ``candidates``) whose
    simulated peak fits: fast, not proven optimal."""
    start = time.perf_counter()
    frontier = _frontier(problem) + _candidate_plans(problem, candidates)
    best = _cheapest_fitting(frontier, peak_budget, budget)
    if best is None:
        raise _infeasible(problem, peak_budget, frontier)
    plan, peak = best
    return Plan(saved=plan.saved, recomputed=plan.recomputed, saved_bytes=plan.saved_bytes,
                recompute_cost=plan.recompute_cost, solver="mincut", status=Status.HEURISTIC,
                solve_time_s=time.perf_counter() - start, objective=plan.recompute_cost, budget=budget,
                message=f"best {plan.solver} plan of the frontier under the peak budget: simulated peak {peak} bytes",
                extra={"peak": peak, "peak_budget": peak_budget})
