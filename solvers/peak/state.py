"""What one peak solve knows, shared by its strategies (``solvers.peak.schedule``): the plans
offered and the best that fits, the proven bound, the relaxation's program, the clock.

Every plan a strategy makes is ``offer``ed: simulated exactly, kept in ``seen``, and the best
plan if it fits and costs least (so within a solve every fitting plan seen is a candidate). The
bound only rises (``raise_bound``). Both, and the phase, go to ``solvers.progress``'s listener.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Iterable

from .. import interrupt, progress
from ..errors import PlanError
from ..liveness import MemoryCurve, simulate_plan
from ..mip_model import build_model, presolve
from ..problem import Plan, Problem, Status, plan_from_saved
from .cuts import CutContext
from .relaxation import Relaxed, solve_relaxation
from .repair import repair_overshoot
from .rows import peak_rows
from .settings import (EFFORT_POWER, FINISH_SHARE, FULL_EFFORT_VALUES, MIN_EFFORT_S,
                       MIN_RESOLVE_SHARE, NEAR_FIT, RELAX_GAP_SHARE, REPAIR_SHARE,
                       SEARCH_MAX_VALUES)


class Clock:
    """The solve's time: ``effort_s`` (the limit scaled to the graph, what phase shares are of),
    spent by ``deadline``; while no plan fits, up to ``hard_deadline`` (the whole limit, less a
    share kept for finishing)."""

    def __init__(self, time_limit_s: float, values: int) -> None:
        self.start = time.perf_counter()
        self.hard_deadline = self.start + (1.0 - FINISH_SHARE) * float(time_limit_s)
        scaled: float = time_limit_s * min(1.0, values / FULL_EFFORT_VALUES) ** EFFORT_POWER
        self.effort_s = min(float(time_limit_s), max(MIN_EFFORT_S, scaled))
        self.deadline = min(self.start + self.effort_s, self.hard_deadline)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


class PeakState:
    """One solve's state (see the module doc). ``memory`` holds what a strategy keeps between its
    turns, under the strategy's name."""

    def __init__(self, problem: Problem, peak_budget: int, budget: int | None, *, clock: Clock,
                 threads: int, seed: int, gap: float, frontier: list[tuple[Plan, int]]) -> None:
        self.problem, self.peak_budget, self.budget = problem, peak_budget, budget
        self.threads, self.seed, self.gap = threads, seed, gap
        self.clock = clock  # started before the frontier was made: the time limit counts it
        self.frontier = frontier  # the cheap plans the solve starts from (solvers.peak.candidates)
        self.seen: list[tuple[Plan, int]] = []  # every plan offered, with its simulated peak
        self.best: Plan | None = None
        self.best_peak: int | None = None
        for plan, peak in frontier:
            self._consider(plan, peak)
        self.bound = 0.0
        self.phase = "start"
        self.last_curve: tuple[Plan, MemoryCurve] | None = None  # the last plan offered, simulated
        # the relaxation: its program once, its first answer, its last optimal one
        self.model = presolve(problem, build_model(problem), for_peak=True)
        self.rows = peak_rows(problem)
        self.cuts = CutContext(problem, self.model, self.rows)
        self.cut_steps: list[int] = []  # backward steps with cut rows (solvers.peak.cuts)
        self.forward_rows = False  # the forward's rows too (solvers.peak.forward_rows), once a plan needs them
        self.first_relaxed: Relaxed | None = None
        self.relaxed: Relaxed | None = None
        self.relaxed_curve: tuple[Plan, MemoryCurve] | None = None  # the first relaxation's plan
        self.overshoot = 0  # by how much that plan overshoots the budget
        self.first_relax_s: float | None = None
        self.rel_gap = max(1e-4, RELAX_GAP_SHARE * gap)  # HiGHS's gap: a share of the solve's
        self.memory: dict[str, Any] = {}

    # time
    def left(self) -> float:
        """Seconds left: to the effort's end once a plan fits, else to the hard deadline; none
        after a Ctrl-C (solvers.interrupt)."""
        if interrupt.requested():
            return 0.0
        end = self.clock.deadline if self.best is not None else self.clock.hard_deadline
        return max(0.0, end - time.perf_counter())

    def effort_left(self) -> float:
        return max(0.0, min(self.left(), self.clock.deadline - time.perf_counter()))

    def share(self, fraction: float) -> float:
        return fraction * self.clock.effort_s

    # plans and bound
    def fits(self) -> bool:
        return self.best is not None

    def small(self) -> bool:
        """A graph the local search still gains on once a plan fits (``SEARCH_MAX_VALUES``);
        beyond, the cut rounds get its time and repair their own plans."""
        return len(self.problem.candidates) <= SEARCH_MAX_VALUES

    def done(self, gaps: float = 1.0) -> bool:
        """The best plan is within ``gaps`` times the solve's gap of the bound."""
        return self.best is not None \
            and self.best.recompute_cost - self.bound <= gaps * self.gap * self.best.recompute_cost

    def _consider(self, plan: Plan, peak: int) -> bool:
        if peak <= self.peak_budget and (self.budget is None or plan.saved_bytes <= self.budget) \
                and (self.best is None or (plan.recompute_cost, plan.saved_bytes)
                     < (self.best.recompute_cost, self.best.saved_bytes)):
            self.best, self.best_peak = plan, peak
            return True
        return False

    def offer(self, saved: Iterable[str], how: str) -> int | None:
        """Simulate the plan that saves ``saved`` (None if it is no valid plan), keep it, and make
        it the best if it fits and costs least; a relaxation's plan that nearly fits and costs
        less than the best is repaired (solvers.peak.repair). Returns its simulated peak;
        ``last_curve`` is its simulation."""
        try:
            plan = plan_from_saved(self.problem, saved, solver=how, status=Status.HEURISTIC)
        except PlanError:
            return None
        curve = simulate_plan(self.problem, plan.saved)
        self.last_curve = (plan, curve)
        peak = curve.peak
        self.seen.append((plan, peak))
        if self._consider(plan, peak):
            self.report()
        elif how.startswith("relaxation") and 0 < peak - self.peak_budget <= NEAR_FIT * self.peak_budget \
                and (self.best is None or plan.recompute_cost < self.best.recompute_cost) and self.left() > 0:
            fixed = repair_overshoot(self.problem, plan.saved, self.peak_budget, self.budget,
                                     cost_below=self.best.recompute_cost if self.best else math.inf,
                                     deadline=time.perf_counter() + min(self.left(), self.share(REPAIR_SHARE)))
            if fixed is not None:
                self.offer(fixed.saved, "repair")
                self.last_curve = (plan, curve)
        return peak

    def raise_bound(self, bound: float | None) -> bool:
        if bound is None or bound <= self.bound:
            return False
        self.bound = bound
        self.report()
        return True

    def smallest_peak(self) -> int | None:
        """The smallest simulated peak of the plans seen that keep the saved-bytes budget."""
        return min((pk for p, pk in self.frontier + self.seen if self.budget is None or p.saved_bytes <= self.budget),
                   default=None)

    # the relaxation
    def relax(self, target: int, limit: float, probing: bool = True, rel_gap: float | None = None,
              on_plan: Callable[[list[str]], None] | None = None, stop: threading.Event | None = None) -> Relaxed:
        """The relaxation at peak budget ``target`` with the cut rows so far (HiGHS's gap
        ``rel_gap``, by default the solve's share ``self.rel_gap``; ``on_plan``, ``stop``: as
        ``solve_relaxation``'s). A re-solve given much less time than the first took is skipped:
        it would return nothing, and HiGHS's presolve runs past a short limit."""
        if self.first_relax_s is not None and limit < MIN_RESOLVE_SHARE * self.first_relax_s:
            return Relaxed("unknown", None, None)
        began = time.perf_counter()
        got = solve_relaxation(self.problem, self.model, self.rows, target, self.budget,
                               threads=self.threads, seed=self.seed, time_limit_s=limit,
                               cuts=(self.cuts, self.cut_steps), probing=probing, forward=self.forward_rows,
                               rel_gap=self.rel_gap if rel_gap is None else rel_gap, on_plan=on_plan, stop=stop)
        if self.first_relax_s is None:
            self.first_relax_s = time.perf_counter() - began
        return got

    # progress
    def enter(self, phase: str) -> None:
        self.phase = phase
        self.report()

    def report(self) -> None:
        progress.report(self.best.recompute_cost if self.best is not None else None,
                        self.bound if self.bound > 0 or self.relaxed is not None else None, self.phase)
