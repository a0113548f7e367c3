"""The live memory of a plan's training step: simulated once per plan, in ``step_curve``, kept with
the plan's record (``Record.curve``, results.json) and read by every report (the summary's peaks,
``plots``, ``html_figures``, the HTML hovers). No torch here.

A curve holds, per step, the value computed there, the live bytes after it, the phase and the
largest live buffers. ``live`` maps a kind of bytes to its series; ``"total"`` is every live
buffer, and the kinds of ``solvers.memory_kinds.MemoryKind`` that are ever non-zero go beside it
under their names (activations, temporaries, gradients; under a training set-up also what the rank
holds besides the graph: sharded and gathered parameters, optimizer state, ...), from the same
simulation (``solvers.rank_memory.rank_curve``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from solvers import Problem
from solvers.memory_kinds import MemoryKind
from solvers.problem import Node, Role
from solvers.rank_memory import rank_curve
from solvers.training import TrainingSetup

TOP_LIVE = 6  # the largest live buffers a hover names; the others are counted
# what a live buffer holds: an activation of the forward, a value saved for the backward, a value
# recomputed in the backward, a gradient (a backward output), or another backward temporary
TAGS = {"a": "activation", "s": "saved", "r": "recomputed", "g": "gradient", "t": "backward temporary"}
TOTAL = "total"


@dataclass
class Curve:
    """One plan's step: per step the value computed (an index into the problem's nodes), the live
    bytes after it by kind (``live[TOTAL]``: all of them), its phase (f: forward, b: backward,
    r: recomputation in the backward), the number of live buffers and the largest of them
    (``[value index, tag]``, tags as ``TAGS``)."""
    values: list[int]
    live: dict[str, list[int]]
    phases: str
    live_count: list[int]
    top: list[list[list[Any]]]
    peak_gradients: int  # bytes of gradients live at the peak
    extra: dict[str, Any] = field(default_factory=dict)  # kept from results.json as written

    @property
    def live_bytes(self) -> list[int]:
        return self.live[TOTAL]

    @property
    def peak(self) -> int:
        return max(self.live[TOTAL], default=0)

    @property
    def kinds(self) -> list[str]:
        """The kinds of memory the curve splits its total into (``MemoryKind`` values, in order)."""
        return [k.value for k in MemoryKind if k.value in self.live]

    def peak_by_kind(self) -> dict[str, int]:
        """The bytes of each kind at the (first) peak of the total."""
        total = self.live[TOTAL]
        if not total:
            return {}
        at = total.index(max(total))
        return {k: self.live[k][at] for k in self.kinds}

    @property
    def forward_steps(self) -> int:
        return self.phases.count("f")

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "values": self.values, "live": self.live, "phases": self.phases,
                "live_count": self.live_count, "top": self.top, "peak": self.peak,
                "peak_gradients": self.peak_gradients}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Curve":
        known = {"values", "live", "phases", "live_count", "top", "peak", "peak_gradients"}
        return cls(values=list(data["values"]), live={k: list(v) for k, v in data["live"].items()},
                   phases=str(data["phases"]), live_count=list(data["live_count"]), top=list(data["top"]),
                   peak_gradients=int(data.get("peak_gradients", 0)),
                   extra={k: v for k, v in data.items() if k not in known})


def step_curve(problem: Problem, saved: Iterable[str], setup: TrainingSetup | None = None) -> Curve:
    """The step under a plan that saves ``saved``: the one simulation a report makes of a plan.
    ``setup``: the rank's whole memory as the step is trained (None: the graph's alone)."""
    snapshots: list[tuple[int, list[str]]] = []

    def on_step(live: Mapping[str, int]) -> None:
        snapshots.append((len(live), heapq.nlargest(TOP_LIVE, live, key=live.__getitem__)))

    saved_set = set(saved)
    rank = rank_curve(problem, saved_set, setup, on_step)
    index, by_name = problem.index, problem.by_name
    saved_storages = {by_name[v].storage_id for v in saved_set}
    grads = set(problem.backward_outputs)
    phases, top = [], []
    for (phase, name), (_, buffers) in zip(rank.steps, snapshots):
        phases.append("f" if phase == "forward" else "b" if by_name[name].role is Role.BACKWARD else "r")
        top.append([[index[_value_of(b)], _tag(b, by_name, saved_storages, grads)] for b in buffers])
    series = {k.value: list(v) for k, v in rank.by_kind.items() if any(v)}
    total = [sum(at) for at in zip(*series.values())] if series else [0] * len(rank.steps)
    return Curve(values=[index[name] for _, name in rank.steps], live={TOTAL: total, **series},
                 phases="".join(phases), live_count=[n for n, _ in snapshots], top=top,
                 peak_gradients=rank.peak.by_kind.get(MemoryKind.GRADIENTS, 0))


def _value_of(buffer: str) -> str:
    return buffer[3:] if buffer.startswith("bw:") else buffer


def _tag(buffer: str, by_name: Mapping[str, Node], saved_storages: set[str], grads: set[str]) -> str:
    if not buffer.startswith("bw:"):  # a storage made in the forward
        return "s" if buffer in saved_storages else "a"
    name = buffer[3:]
    if by_name[name].role is not Role.BACKWARD:
        return "r"
    return "g" if name in grads else "t"
