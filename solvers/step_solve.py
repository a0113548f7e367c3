"""Plans for a step of several graphs under one peak or device budget (``solvers.step``): one plan
per key, the cheapest (recompute cost x copies) whose step peak fits. Candidate plans per graph
(save-all, inputs-only, checkpointing, min-cut across its trade-off, and per saved-bytes cap the
fast default's cheapest plan under the own peak that cap leaves in the step) are combined
exactly in the step model: every combination where there are few, else one graph at a time.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from .baselines import inputs_only, save_all, uniform_checkpoints
from .budget import format_bytes
from .errors import StepBudgetError
from .fast_peak import fast_peak_plan
from .memory_kinds import MemoryKind as K
from .mincut import lam_range, mincut_under_budget, solve_mincut
from .problem import Plan, Problem, Status, plan_from_saved, recompute_closure
from .step import GraphStats, Step, StepPeak, copy_rank, input_kinds, stats_peak, with_boundaries
from .training import TrainingSetup


@dataclass(frozen=True)
class StepPlans:
    plans: Mapping[str, Plan]  # per key
    peak: StepPeak
    cost: float  # recompute seconds of the whole step (each graph's times its copies)
    solve_time_s: float = 0.0
    tried: int = 0  # combinations evaluated
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---- the solve ------------------------------------------------------------------------------

CAPS = 12  # caps on what a copy holds tried per free graph (between its plans' least and most)
REFINE = 3  # finer caps on each side of the cheapest plan that fits
MAX_COMBINATIONS = 20_000  # beyond this, one graph at a time (the others kept)
SPEND_EVALUATIONS = 400  # step-model evaluations spending the budget the best combination leaves


def candidate_plans(problem: Problem, step: Step, key: str, budget: int,
                    stats: Mapping[str, GraphStats], setup: TrainingSetup | None) -> list[GraphStats]:
    """Plans of graph ``key`` worth combining: save-all, inputs-only, checkpointing every 1 and 2
    blocks, min-cut across its trade-off, and per cap on what each copy holds the fast default's
    cheapest plan under the own peak that cap leaves in the step (the other graphs at ``stats``),
    on the graph with its boundary (``solvers.step.with_boundaries``: its saved bytes are what a
    copy holds); the caps spread between the plans' least and most held, then refined around the
    cheapest that fits."""
    plans: list[Plan] = [save_all(problem), inputs_only(problem)]
    plans += uniform_checkpoints(problem, (1, 2))
    lo, hi = lam_range(problem)
    plans += [solve_mincut(problem, lo * (hi / lo) ** (i / 4)) for i in range(5)] if lo > 0 else []
    out = {p.saved: step.stats(key, p.saved) for p in plans}
    held = sorted({s.held for s in out.values()})
    ranks = {k: copy_rank(step.graph(k).problem, setup) for k in step.keys()}
    wide = with_boundaries(problem, step.shared(key))
    copies = sum(g.repeat for g in step.graphs if g.key == key)

    boundary = min(out.values(), key=lambda s: s.held)
    tangents = frozenset(input_kinds(problem)[1])

    def at_cap(cap: int) -> None:
        # the room its own peak has with every copy holding ``cap``: the step with a plan of no
        # own buffers, less the budget; on the graph with its boundary, and on the graph alone
        # (its boundary as the least-holding plan's: the two find different plans)
        for graph, probe, saved_cap in (
                (wide, GraphStats(frozenset(), 0.0, cap, 0, 0, 0, 0, {}, {}), cap),
                (problem, replace(boundary, held=cap, forward={K.ACTIVATIONS: boundary.inputs},
                                  backward={K.TEMPORARIES: boundary.tangents}), cap - boundary.saved_inputs)):
            room = budget - stats_peak(step, {**stats, key: probe}, ranks, setup).total
            if room <= 0 or saved_cap < 0:
                continue
            found = []
            try:
                found.append(fast_peak_plan(graph, room, saved_cap))
            except ValueError:  # InfeasibleError
                pass
            if graph is wide:  # where what the copies hold decides, the least recompute under the cap
                try:
                    found.append(mincut_under_budget(wide, saved_cap, iterations=12))
                except ValueError:
                    pass
            for plan in found:
                saved = plan.saved | tangents  # on the graph alone its incoming gradients are inputs it keeps
                if saved not in out:
                    out[saved] = step.stats(key, saved)

    caps = [int(held[0] + (held[-1] - held[0]) * i / max(CAPS - 1, 1)) for i in range(CAPS)] if held else []
    for cap in caps:
        at_cap(cap)
    fitting = [(s.cost, s.held) for s in out.values()
               if stats_peak(step, {**stats, key: s}, ranks, setup).total <= budget]
    if fitting and copies > 0 and len(caps) > 1:  # finer caps on either side of the cheapest that fits,
        step_bytes = (caps[1] - caps[0]) / (REFINE + 1)  # and below the most held that fits
        for centre in {min(fitting)[1], max(h for _, h in fitting)}:
            for j in range(-REFINE, REFINE + 1):
                if j:
                    at_cap(int(centre + j * step_bytes))
    return list(out.values())


def solve_step(step: Step, budget: int, setup: TrainingSetup | None = None,
               spend_evaluations: int = SPEND_EVALUATIONS) -> StepPlans:
    """The cheapest plans, one per key (fixed graphs keep theirs), whose step peak (with the rank's
    states under ``setup``) is at most ``budget`` bytes: the best combination of candidates, then
    the budget it leaves spent (``spend_step``, at most ``spend_evaluations``; 0: none). Raises
    StepBudgetError naming the lowest step peak found."""
    start = time.perf_counter()
    keys = step.keys()
    fixed = {k: step.stats(k, step.graph(k).fixed or ()) for k in keys
             if step.graph(k).fixed is not None}
    free = [k for k in keys if k not in fixed]
    ranks = {k: copy_rank(step.graph(k).problem, setup) for k in keys}
    # start from each free graph's least own-peak plan, then find candidates around the others
    current = dict(fixed)
    for k in free:
        p = step.graph(k).problem
        current[k] = min((step.stats(k, x.saved) for x in (inputs_only(p), *uniform_checkpoints(p, (1,)))),
                         key=lambda s: (s.held, s.cost))
    pools = {k: candidate_plans(step.graph(k).problem, step, k, budget, current, setup) for k in free}
    repeats = {k: sum(g.repeat for g in step.graphs if g.key == k) for k in keys}

    def cost(choice: Mapping[str, GraphStats]) -> float:
        return sum(choice[k].cost * repeats[k] for k in keys)

    best: tuple[float, int, dict[str, GraphStats]] | None = None
    tried = 0
    size = 1
    for k in free:
        size *= len(pools[k])
    if size <= MAX_COMBINATIONS:
        combos: Iterable[Sequence[GraphStats]] = itertools.product(*(pools[k] for k in free))
    else:  # one graph at a time around the starting plans
        combos = [tuple(s if j == i else current[f] for j, f in enumerate(free)) for i, k in enumerate(free)
                  for s in pools[k]]
    for combo in combos:
        choice = {**fixed, **dict(zip(free, combo))}
        tried += 1
        total = cost(choice)
        if best is not None and total > best[0]:
            continue
        peak = stats_peak(step, choice, ranks, setup)
        if peak.total <= budget and (best is None or (total, peak.total) < best[:2]):
            best = (total, peak.total, choice)
    if best is None:
        least = {**fixed, **{k: min(pools[k], key=lambda s: s.held) for k in free}}
        raise StepBudgetError(budget, stats_peak(step, least, ranks, setup))
    combined = best[0]
    choice = spend_step(step, best[2], free, budget, setup, spend_evaluations)
    plans = {k: _as_plan(step.graph(k).problem, choice[k], k in fixed) for k in keys}
    peak = stats_peak(step, choice, ranks, setup)
    total = cost(choice)
    notes = [f"step peak {format_bytes(peak.total)} at {peak.at} under {format_bytes(budget)}"]
    if total < combined:
        notes.append(f"the budget left spent: recompute {combined * 1e3:.3f} -> {total * 1e3:.3f} ms")
    return StepPlans(plans, peak, total, time.perf_counter() - start, tried, tuple(notes))


def spend_step(step: Step, choice: Mapping[str, GraphStats], free: Sequence[str], budget: int,
               setup: TrainingSetup | None = None, evaluations: int = SPEND_EVALUATIONS) -> dict[str, GraphStats]:
    """``choice`` (fitting ``budget``) with the budget it leaves spent (as ``solvers.peak.spend``
    spends a graph's): per free key, most repeated first, save back recomputed values, the most
    recompute removed per byte first, each kept where the step peak still fits and the cost drops.
    The candidate plans are discrete (a cap's plan, min-cut's trade-off): the best combination
    often peaks well under the budget. At most ``evaluations`` step-model evaluations; never costlier."""
    ranks = {k: copy_rank(step.graph(k).problem, setup) for k in step.keys()}
    repeats = {k: sum(g.repeat for g in step.graphs if g.key == k) for k in step.keys()}
    out = dict(choice)
    left = evaluations
    for k in sorted(free, key=lambda x: (-repeats[x], step.keys().index(x))):
        problem = step.graph(k).problem
        rejected: set[str] = set()
        accepted = True
        while accepted and left > 0 and out[k].cost > 0:
            accepted = False
            for v in _ranked(problem, out[k].saved, rejected):
                if left <= 0:
                    break
                if v in out[k].saved:
                    continue
                # what the backward no longer reads is let go: kept, it would only add to the peak
                plan = plan_from_saved(problem, out[k].saved | {v}, solver="step", status=Status.HEURISTIC)
                saved = plan.saved | (out[k].saved & frozenset(input_kinds(problem)[1]))
                if plan.recompute_cost >= out[k].cost:
                    continue  # no longer recomputed since the ranking
                left -= 1
                cand = step.stats(k, saved)
                if cand.cost < out[k].cost and stats_peak(step, {**out, k: cand}, ranks, setup).total <= budget:
                    out[k], accepted = cand, True
                else:
                    rejected.add(v)  # saving more rarely lowers the peak again: not retried
    return out


def _ranked(problem: Problem, saved: frozenset[str], rejected: set[str]) -> list[str]:
    """The plan's recomputed values worth saving back, the most recompute removed (its closure's)
    per byte its storage adds first; ties in graph order."""
    recomputed, _ = recompute_closure(problem, saved)
    cost = problem.recompute_cost(recomputed)
    storages = {problem.by_name[s].storage_id for s in saved}
    index = problem.index
    ranked = []
    for v in recomputed:
        if v in rejected or not problem.can_save(v):
            continue
        gain = cost - problem.recompute_cost(recompute_closure(problem, saved | {v})[0])
        sid = problem.by_name[v].storage_id
        added = 0 if sid in storages else problem.storage_size[sid]
        if gain > 1e-12 * max(cost, 1e-300):
            ranked.append((-gain / max(added, 1), index[v], v))
    ranked.sort()
    return [v for _, _, v in ranked]


def _as_plan(problem: Problem, stats: GraphStats, fixed: bool) -> Plan:
    return plan_from_saved(problem, stats.saved, solver="fixed" if fixed else "step", status=Status.HEURISTIC,
                           message="kept as given" if fixed else "the step's plan for this graph")
