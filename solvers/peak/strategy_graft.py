"""Grafts of the cheaper plans that overshoot onto the best plan that fits (``solvers.peak.graft``),
again from each better plan found while they gain."""

from __future__ import annotations

import time

from ..problem import Plan
from .graft import graft_plans
from .settings import GRAFT_PLANS
from .state import PeakState


def run(state: PeakState, seconds: float, first: Plan | None = None) -> None:
    """``first``'s grafts before the others' (a cut round's plan)."""
    until = time.perf_counter() + seconds
    while state.best is not None and not state.done() and time.perf_counter() < until and state.left() > 0:
        base = state.best
        cheaper = sorted({p.saved: p for p, pk in state.seen + state.frontier
                          if pk > state.peak_budget and p.recompute_cost < base.recompute_cost}.values(),
                         key=lambda p: (p is not first, p.recompute_cost))[:GRAFT_PLANS]
        for plan, _ in graft_plans(state.problem, base.saved, [p.saved for p in cheaper], state.peak_budget,
                                   state.budget, deadline=min(until, time.perf_counter() + state.left())):
            state.offer(plan.saved, "graft")
        if state.best is base:
            break
