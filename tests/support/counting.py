"""Counting the runs layer's simulations in a test (the simulator itself runs for real)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import solvers.liveness as liveness
import solvers.rank_memory as rank_memory


def count_simulations(monkeypatch: Any, callers: tuple[str, ...] = ("opt_remat.runs",)) -> Counter:
    """Each saved set simulated from now on by a module whose name starts with one of ``callers``
    (not a solver's own searches), with how often: ``simulate_plan`` and ``rank_curve`` (a curve
    split by kind is one simulation too), wherever they were imported."""
    original, original_rank = liveness.simulate_plan, rank_memory.rank_curve
    counted: Counter = Counter()

    def ours() -> bool:
        return sys._getframe(2).f_globals.get("__name__", "").startswith(callers)

    def counting(problem: Any, saved: Any, on_step: Any = None) -> Any:
        if ours():
            counted[frozenset(saved)] += 1
        return original(problem, saved, on_step)

    def counting_rank(problem: Any, saved: Any, setup: Any, on_step: Any = None) -> Any:
        if ours():
            counted[frozenset(saved)] += 1
        return original_rank(problem, saved, setup, on_step)

    for module in list(sys.modules.values()):
        if getattr(module, "simulate_plan", None) is original:
            monkeypatch.setattr(module, "simulate_plan", counting)
        if getattr(module, "rank_curve", None) is original_rank:
            monkeypatch.setattr(module, "rank_curve", counting_rank)
    return counted
