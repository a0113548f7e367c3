"""The stage model of the peak problem, solved by CP-SAT: on small graphs it finds plans the
relaxations miss.

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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from . import interrupt
from .liveness import simulate_plan
from .mincut import InfeasibleError
from .peak_candidates import _cheapest_fitting, _frontier, _infeasible
from .problem import Plan, Problem, Role, Status, plan_from_saved, recompute_closure


# backward stages: one per backward value is the most precise but grows with the graph; 24 keeps
# CP-SAT at seconds on small transformer graphs (measured: 16 stages ~1 s, one per value > 30 s)
DEFAULT_STAGES = 24
# recomputation moments per single-value stage: more buckets count fewer values that are never
# alive together (a chain of recomputed values), at the price of more variables
RECOMPUTE_BUCKETS = 4


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
