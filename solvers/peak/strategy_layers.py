"""On graphs of repeated layers: plans taking each layer from a different plan seen so far
(``solvers.peak.layers``, a dynamic program over the chain of layers), with the layers of the
relaxation's plans at looser budgets too."""

from __future__ import annotations

import time

from .layers import find_layers, layer_plans
from .settings import LAYERS_MAX_COST_RATIO, LAYERS_RELAX_LOOSER, LAYERS_RELAX_SHARE
from .state import PeakState


def worth_mixing(state: PeakState) -> bool:
    """The graph has repeated layers and checkpointing every layer costs at most
    ``LAYERS_MAX_COST_RATIO`` x the first bound (beyond, the savings are not in the layers).
    Decided once, at the first ask."""
    memory = state.memory.setdefault("layers", {})
    if "mixing" not in memory:
        layers = find_layers(state.problem)
        every = next((p for p, _ in state.frontier if p.extra.get("every") == 1), None)
        memory["layers"], memory["every"] = layers, every
        memory["mixing"] = layers is not None and every is not None \
            and every.recompute_cost <= LAYERS_MAX_COST_RATIO * state.bound
    return bool(memory["mixing"])


def run(state: PeakState, seconds: float) -> None:
    if not worth_mixing(state):
        return
    memory = state.memory["layers"]
    if "looser" not in memory:  # the relaxation's plans at looser budgets, solved once
        memory["looser"] = []
        for factor in LAYERS_RELAX_LOOSER:
            again = state.relax(int(factor * state.peak_budget), min(state.share(LAYERS_RELAX_SHARE), state.left()))
            if again.saved is not None:
                memory["looser"].append(frozenset(again.saved))
    until = time.perf_counter() + min(seconds, state.left())
    first = state.first_relaxed
    # mixed among themselves too: the frontier's, the looser relaxations' and the first relaxation's
    trusted = [p.saved for p, _ in state.frontier] + memory["looser"] + (
        [frozenset(first.saved)] if first is not None and first.saved is not None else [])
    for plan, _ in layer_plans(state.problem, memory["layers"], memory["every"].saved,
                               [p.saved for p, _ in state.seen], state.peak_budget, state.budget,
                               deadline=until, apart=[trusted]):
        state.offer(plan.saved, "layers")
