"""The peak solve's schedule: which strategy runs when, for how much of the solve's effort.

Each phase is a strategy (a function ``run(state, seconds)``), its share of the effort (or the
time left: ``EFFORT`` to the effort's end, ``END`` to the end of the solve, less ``keep`` for
the phases after it) and a condition on the state. The solve runs the phases in order, skipping
those whose condition fails, until the gap is closed or the time is spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import strategy_cuts as cuts
from . import strategy_graft as graft
from . import strategy_layers as layers
from . import strategy_lowered as lowered
from . import strategy_relaxation as relaxation
from . import strategy_search as search
from .settings import (CUT_FIRST_NO_PLAN_SHARE, CUT_FIRST_SHARE, CUT_NO_PLAN_SHARE, CUT_SHARE, GRAFT_SHARE,
                       LAYERS_SHARE, RELAX_SHARE, SHRINK_SHARE, SHRINK_SHARE_MIXING,
                       STALL_MIN_S)
from .state import PeakState

EFFORT = "effort"  # until the end of the effort (the time limit scaled to the graph)
END = "end"  # until the end: the effort's once a plan fits, the whole limit's while none does

Condition = Callable[[PeakState], bool]


@dataclass(frozen=True)
class Phase:
    name: str  # what progress reports show
    run: Callable[[PeakState, float], None]
    share: float | str  # of the effort, or EFFORT / END
    when: Condition = lambda state: True
    keep: float = 0.0  # share of the effort left to the phases after it (with EFFORT / END)


def both(*conditions: Condition) -> Condition:
    return lambda state: all(c(state) for c in conditions)


def no(condition: Condition) -> Condition:
    return lambda state: not condition(state)


fits = PeakState.fits  # a plan fits
small = PeakState.small  # a graph the local search still gains on once a plan fits
mixing = layers.worth_mixing  # repeated layers, and checkpointing them is not far off the bound


def overshot(state: PeakState) -> bool:
    """The first relaxation's plan overshoots the simulation: what the cut rounds start from."""
    return state.relaxed_curve is not None and state.overshoot > 0


searching = no(both(fits, no(small)))  # the local search runs: a small graph, or no plan fits yet

SCHEDULE: tuple[Phase, ...] = (
    Phase("relaxation", relaxation.run, RELAX_SHARE),
    # a big graph with a plan that fits: the cut rounds first, with all the time (their first
    # round's HiGHS solve decides the bound, and the phases below rarely beat the rounds' plans)
    Phase("cut rounds", cuts.run_to_end, END, when=both(overshot, no(searching))),
    Phase("lowered budgets", lowered.run, SHRINK_SHARE_MIXING, when=mixing),
    Phase("lowered budgets", lowered.run, SHRINK_SHARE, when=no(mixing)),
    Phase("layer mix", layers.run, LAYERS_SHARE, when=mixing),
    Phase("grafts", graft.run, GRAFT_SHARE, when=fits),
    # a first turn of cut rounds, seeding the local search with their plans
    Phase("cut rounds", cuts.run, CUT_FIRST_SHARE, when=both(overshot, fits, searching)),
    Phase("cut rounds", cuts.run, CUT_FIRST_NO_PLAN_SHARE, when=both(overshot, no(fits))),
    Phase("local search", search.run, EFFORT, keep=CUT_SHARE, when=both(overshot, searching)),
    Phase("local search", search.run, EFFORT, when=both(no(overshot), searching)),
    # still no plan: cut rounds may prove there is none, then the search gets all the time left
    Phase("cut rounds", cuts.run, CUT_NO_PLAN_SHARE, when=both(overshot, no(fits))),
    Phase("local search", search.run, END, when=no(fits)),
    Phase("layer mix", layers.run, LAYERS_SHARE, when=both(mixing, search.found_the_best)),
    Phase("cut rounds", cuts.run_to_end, END),
)


def seconds_for(state: PeakState, phase: Phase) -> float:
    if isinstance(phase.share, str):  # EFFORT or END
        rest = state.effort_left() if phase.share == EFFORT else state.left()
        return max(rest - state.share(phase.keep), min(rest, STALL_MIN_S)) if phase.keep else rest
    return state.share(phase.share)


def run_schedule(state: PeakState, schedule: tuple[Phase, ...] = SCHEDULE) -> None:
    for phase in schedule:
        if state.done() or state.left() <= 0:
            return
        if not phase.when(state):
            continue
        seconds = seconds_for(state, phase)
        if seconds <= 0:
            continue
        state.enter(phase.name)
        phase.run(state, seconds)
