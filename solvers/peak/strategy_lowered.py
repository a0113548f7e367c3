"""The relaxation re-solved at budgets lowered by what its plans overshoot the simulation, then
bisected between the highest budget whose plan overshot and the lowest whose plan fit (or that
admits no plan): plans that fit, near the relaxation's cost."""

from __future__ import annotations

import time

from .settings import LOWERED_SOLVE_SHARE
from .state import PeakState


def run(state: PeakState, seconds: float) -> None:
    peak_budget = state.peak_budget
    fits_at, over_at = None, peak_budget if state.overshoot > 0 else None
    refused_at = None  # the highest budget where the relaxation admits no plan (nor below it)
    target = peak_budget - state.overshoot
    until = time.perf_counter() + seconds
    while over_at is not None and not state.done() and time.perf_counter() < until - 0.5 and state.left() > 0:
        limit = min(until - time.perf_counter(), state.left(), max(1.0, state.share(LOWERED_SOLVE_SHARE)))
        again = state.relax(target, limit)
        if again.status == "unknown" and again.saved is None:
            break  # skipped for want of time, or timed out: a lower target would not do better
        peak = None if again.saved is None else state.offer(again.saved, "relaxation, lowered budget")
        if peak is not None and peak <= peak_budget:
            fits_at = target
        elif again.status == "infeasible":
            refused_at = target
        else:
            over_at = target
        low = max(x for x in (fits_at, refused_at, -1) if x is not None)
        if low >= 0 and over_at - low <= peak_budget // 200:
            break
        if fits_at is None and refused_at is None:
            target -= max(peak - peak_budget if peak is not None else 0, peak_budget // 100)
        else:  # the budget lowered by the overshoot can admit no plan: bisect, not lower further
            target = (low + over_at) // 2
        if target <= 0:
            break
