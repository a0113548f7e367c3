"""The planner's third choice: keep a saved value on the device, send it to host memory, or recompute it.

``choose_offload`` takes a plan that fits a peak budget (the fast default's or the peak search's)
and looks for one that adds less step time, ``recompute + exposed transfer`` (the model of
``solvers.offload``), while the offload-aware peak (``offloaded_curve``) fits the budget, the host
memory stays under ``HostLink.host_bytes`` and every offloaded value is a candidate
(``offload_candidates``: not banned, at least ``HostLink.min_bytes``).

The search is deterministic and starts from the given plan, so the time it returns is never
higher than the plan's:

* saved sets that recompute less than the plan (min-cut plans over a range of ``lam``, and saving
  all the backward reads) are made to fit by offloading their candidates in forward order (the
  earliest values have the most forward compute to hide their copy behind and are reloaded last);
  the shortest prefix that fits is found by bisection (the peak falls as values leave);
* from the best of those, values still recomputed are saved and offloaded one at a time, the most
  expensive first, kept where the step time falls and the peak still fits;
* offloads that the fit does not need are dropped, the latest first.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .budget import format_bytes, format_seconds
from .errors import InfeasibleError, PlanError
from .liveness import MemoryCurve, simulate_plan, without_gradients
from .mincut import lam_range, solve_mincut
from .offload import HostLink, alone_in_storage, host_bytes, offload_candidates, offloaded_curve
from .problem import Plan, Problem, Status, plan_from_saved

LAM_STEPS = 10  # min-cut plans tried as starting points, geometric in lam over lam_range
IMPROVE_TRIES = 64  # recomputed values tried in the save-and-offload pass
DROP_TRIES = 32  # offloads tried back on the device
TIME_LIMIT_S = 30.0  # the improving passes stop here (a 7B graph's simulation takes ~0.3 s)


@dataclass(frozen=True)
class OffloadCost:
    """What a plan with offloads costs: the offload-aware peak, the added step time and its parts."""
    peak: int
    recompute_s: float
    exposed_s: float
    host_bytes: int

    @property
    def added_s(self) -> float:
        return self.recompute_s + self.exposed_s


def offload_cost(problem: Problem, saved: Iterable[str], offloaded: Iterable[str], link: HostLink, *,
                 count_gradients: bool = True) -> OffloadCost:
    """The model's peak, recompute and exposed transfer time of a plan saving ``saved`` and
    offloading ``offloaded``."""
    if not count_gradients:
        problem = without_gradients(problem)
    saved = frozenset(saved)
    plan = plan_from_saved(problem, saved, solver="check", status=Status.HEURISTIC)
    curve, timeline = offloaded_curve(problem, plan.saved, set(offloaded) & plan.saved, link)
    return OffloadCost(curve.peak, plan.recompute_cost, timeline.exposed_s, timeline.host_bytes)


class _Search:
    """Evaluations of (saved, offloaded) states on one problem, with the constraints."""

    def __init__(self, problem: Problem, link: HostLink, peak_budget: int, budget: int | None,
                 must: frozenset[str], deadline: float) -> None:
        self.problem, self.link, self.peak_budget, self.budget = problem, link, peak_budget, budget
        self.must, self.deadline = must, deadline
        self.allowed = frozenset(offload_candidates(problem, link))
        self.evaluations = 0
        # the last saved set's curve without offload: a search tries many offload sets in a row on
        # one saved set (the fit's bisection, dropping unneeded offloads), and that curve is theirs
        self._base: tuple[frozenset[str], MemoryCurve] | None = None

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline

    def plan(self, saved: Iterable[str]) -> Plan | None:
        try:
            plan = plan_from_saved(self.problem, saved, solver="offload", status=Status.HEURISTIC)
        except PlanError:
            return None
        if self.budget is not None and plan.saved_bytes > self.budget:
            return None
        return plan

    def effective(self, plan: Plan, offloaded: frozenset[str]) -> frozenset[str]:
        """What is offloaded: ``offloaded`` and the must values that the plan saves, each alone in
        its storage among the saved values (torch's async wait frees the storage)."""
        return (offloaded | self.must) & alone_in_storage(self.problem, plan.saved)

    def cost(self, plan: Plan, offloaded: frozenset[str]) -> OffloadCost | None:
        """The cost if the state is feasible (peak, host cap), else None."""
        off = self.effective(plan, offloaded)
        if self.link.host_bytes is not None and host_bytes(self.problem, off) > self.link.host_bytes:
            return None
        self.evaluations += 1
        if self._base is None or self._base[0] != plan.saved:
            self._base = (plan.saved, simulate_plan(self.problem, plan.saved))
        curve, timeline = offloaded_curve(self.problem, plan.saved, off, self.link, self._base[1])
        if curve.peak > self.peak_budget:
            return None
        return OffloadCost(curve.peak, plan.recompute_cost, timeline.exposed_s, timeline.host_bytes)

    def order(self, plan: Plan) -> list[str]:
        """The plan's offload candidates, earliest in the forward first."""
        index = self.problem.index
        alone = self.effective(plan, frozenset(v for v in plan.saved if v in self.allowed))
        return sorted(alone - self.must, key=index.__getitem__)

    def fit(self, plan: Plan) -> tuple[frozenset[str], OffloadCost] | None:
        """The shortest prefix of ``order(plan)`` whose offload makes the plan fit (None: none does)."""
        order = self.order(plan)
        full = self.cost(plan, frozenset(order))
        if full is None:
            return None
        lo, hi, best = 0, len(order), (frozenset(order), full)  # hi fits; find the least that does
        while lo < hi:
            mid = (lo + hi) // 2
            found = self.cost(plan, frozenset(order[:mid]))
            if found is not None:
                hi, best = mid, (frozenset(order[:mid]), found)
            else:
                lo = mid + 1
        return best


def _starts(problem: Problem, plan: Plan) -> list[frozenset[str]]:
    """Saved sets that recompute less than ``plan``: min-cut plans over lam, and saving all reads."""
    lo, hi = lam_range(problem)
    lams = [lo * (hi / lo) ** (i / (LAM_STEPS - 1)) for i in range(LAM_STEPS)] if lo > 0 else [hi]
    out: list[frozenset[str]] = [frozenset(n for n in problem.backward_reads if problem.can_save(n))]
    for lam in sorted(lams, reverse=True):  # least recompute first
        try:
            cut = solve_mincut(problem, lam)
        except InfeasibleError:
            continue
        if cut.recompute_cost < plan.recompute_cost and cut.saved not in out:
            out.append(cut.saved)
    return out


def choose_offload(problem: Problem, plan: Plan, peak_budget: int, link: HostLink, *, budget: int | None = None,
                   must: Iterable[str] = (), count_gradients: bool = True,
                   starts: Sequence[Iterable[str]] = (), time_limit_s: float = TIME_LIMIT_S) -> Plan:
    """A plan fitting ``peak_budget`` whose added step time (recompute + exposed transfer) is at
    most ``plan``'s (with ``must`` offloaded): ``plan`` itself when nothing better is found.
    ``plan`` may peak over the budget (the least peak found without offload): offloads are then
    searched to fit, and ``plan`` comes back without ``extra["offload"]`` if none fits.
    ``must``: values offloaded whatever (MUST_CPU_OFFLOAD); ``starts``: more saved sets to try;
    ``time_limit_s``: the improving passes stop there (the starting points are always tried).
    The plan's ``extra["offload"]`` holds the model's numbers, and those of ``plan`` without
    the chooser's offloads (``without``; None where it did not fit)."""
    began = time.perf_counter()
    sim = without_gradients(problem) if not count_gradients else problem
    search = _Search(sim, link, peak_budget, budget, frozenset(must) & plan.saved, began + time_limit_s)
    base = search.plan(plan.saved)
    without = search.cost(base, frozenset()) if base is not None else None
    best: tuple[Plan, frozenset[str], OffloadCost] | None = None
    if base is not None:  # the plan as it is, else with offloads to fit
        fitted = (frozenset(), without) if without is not None else search.fit(base)
        best = None if fitted is None else (base, *fitted)
    for saved in [*map(frozenset, starts), *_starts(sim, plan)]:
        cand = search.plan(saved)
        if cand is None or (best is not None and cand.recompute_cost >= best[2].added_s):
            continue
        fitted = search.fit(cand)
        if fitted is not None and (best is None or fitted[1].added_s < best[2].added_s):
            best = (cand, *fitted)
    if best is None:  # nothing fits: the plan back, without the offload figures that say it fits
        return plan
    best_plan, best_off, best_cost = _improve(search, *best)
    best_off, best_cost = _drop_unneeded(search, best_plan, best_off, best_cost)
    off = search.effective(best_plan, best_off)
    if best_plan.saved == plan.saved and off == plan.offloaded:
        result = plan
    else:
        result = replace(plan, saved=best_plan.saved, recomputed=best_plan.recomputed,
                         saved_bytes=problem.saved_bytes(best_plan.saved), recompute_cost=best_plan.recompute_cost,
                         offloaded=off, message=(plan.message + "; " if plan.message else "")
                         + f"offload chosen: {len(off)} values, {format_bytes(best_cost.host_bytes)} to host "
                         f"memory, simulated peak {format_bytes(best_cost.peak)} with them, added time "
                         f"{format_seconds(best_cost.added_s)}")
    info = {"peak": best_cost.peak, "recompute_s": best_cost.recompute_s, "exposed_s": best_cost.exposed_s,
            "host_bytes": best_cost.host_bytes, "added_s": best_cost.added_s,
            "evaluations": search.evaluations, "time_s": time.perf_counter() - began,
            "without": None if without is None else {"peak": without.peak, "added_s": without.added_s}}
    return replace(result, extra={**result.extra, "offload": info})


def _improve(search: _Search, plan: Plan, off: frozenset[str], cost: OffloadCost
             ) -> tuple[Plan, frozenset[str], OffloadCost]:
    """Save and offload recomputed values, the most expensive first, while the time falls and it fits."""
    problem = search.problem
    tries = sorted((v for v in plan.recomputed if v in search.allowed),
                   key=lambda v: (-problem.recompute_cost_of(v), problem.index[v]))[:IMPROVE_TRIES]
    for v in tries:
        if search.out_of_time():
            break
        if v not in plan.recomputed:
            continue  # saved already by an earlier move
        cand = search.plan(plan.saved | {v})
        if cand is None or cand.recompute_cost >= cost.added_s:
            continue
        found = search.cost(cand, (off | {v}) & cand.saved)
        if found is not None and found.added_s < cost.added_s:
            plan, off, cost = cand, (off | {v}) & cand.saved, found
    return plan, off, cost


def _drop_unneeded(search: _Search, plan: Plan, off: frozenset[str], cost: OffloadCost
                   ) -> tuple[frozenset[str], OffloadCost]:
    """Keep on the device the offloads the fit does not need, the latest in the forward first,
    where that takes exposed time off."""
    index = search.problem.index
    for v in sorted(off, key=index.__getitem__, reverse=True)[:DROP_TRIES]:
        if cost.exposed_s <= 0 or search.out_of_time():
            break
        found = search.cost(plan, off - {v})
        if found is not None and found.added_s < cost.added_s:
            off, cost = off - {v}, found
    return off, cost


def fit_offloads(problem: Problem, saved: Iterable[str], offloaded: Iterable[str], peak_budget: int,
                 link: HostLink, *, budget: int | None = None) -> tuple[Plan, frozenset[str], OffloadCost] | None:
    """A saved set made to fit by offloading: ``offloaded`` and the fewest more of its candidates
    in forward order (the chooser's fit); None where even all of them do not fit. The repair of
    another planner's plan (``solvers.mip_offload``) that overshoots the budget by the simulator."""
    search = _Search(problem, link, peak_budget, budget, frozenset(offloaded), time.perf_counter() + TIME_LIMIT_S)
    plan = search.plan(saved)
    if plan is None:
        return None
    fitted = search.fit(plan)
    return None if fitted is None else (plan, search.effective(plan, fitted[0]), fitted[1])
