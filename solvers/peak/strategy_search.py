"""The local search (``solvers.peak.search``) from the best plan, the plans offered and the
frontier, judged by the exact simulation, until it stalls. A later turn resumes from the last
turn's plan and its stall clock (the quiet time before it counts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .search import SearchState, StallClock, improve_saved_sets
from .settings import STALL_MIN_S, STALL_SHARE
from .state import PeakState


@dataclass
class _Searches:
    clock: StallClock = field(default_factory=StallClock)
    found: SearchState | None = None  # the last turn's plan


def run(state: PeakState, seconds: float) -> None:
    memory = state.memory.setdefault("search", _Searches())
    starts = ([state.best.saved] if state.best is not None else []) \
        + ([memory.found.saved] if memory.found is not None else []) \
        + [p.saved for p, _ in state.seen] + [p.saved for p, _ in state.frontier]
    got = improve_saved_sets(state.problem, starts, state.peak_budget, state.budget, time_limit_s=seconds,
                             stall_s=max(STALL_MIN_S, state.share(STALL_SHARE)), clock=memory.clock)
    if got is not None:
        memory.found = got
        state.offer(got.saved, "local-search")


def found_the_best(state: PeakState) -> bool:
    """The best plan is the local search's (then the layer mix has new layers to mix)."""
    memory = state.memory.get("search")
    return memory is not None and memory.found is not None and state.best is not None \
        and state.best.saved == memory.found.saved
