"""The step's live memory under a plan: forward, then backward with just-in-time recomputation.

Execution model (what ``opt_remat.lower`` produces and torch's FX code runs):

* forward: forward values in graph order, plus the ``either`` values the plan saves. A value's
  storage is allocated when it is computed (views allocate nothing) and freed after its last
  forward use, unless a member is saved or is a forward output (outputs are dropped at the end of
  the forward, once the caller has turned them into a loss).
* backward: backward values in graph order; before each one, every value it needs that is not
  saved and not computed yet is computed, in graph order (recomputation just in time). A storage is
  freed after its last use in the backward; saved values are freed after their last use too;
  gradients (backward outputs) stay alive to the end.
* live bytes are counted after each value is computed, while its inputs are still alive. Graph
  inputs (parameters, data) and tangents are never counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .problem import Problem, Role


@dataclass(frozen=True)
class MemoryCurve:
    steps: tuple[tuple[str, str, int], ...]  # (phase, value name, live bytes after computing it)
    peak: int
    peak_phase: str
    peak_at: str

    @property
    def forward_peak(self) -> int:
        return max((b for ph, _, b in self.steps if ph == "forward"), default=0)

    @property
    def backward_peak(self) -> int:
        return max((b for ph, _, b in self.steps if ph == "backward"), default=0)


def backward_schedule(problem: Problem, saved: Iterable[str]) -> list[str]:
    """The backward's execution order: each backward value preceded by what it needs, just in time."""
    saved_set = set(saved)
    by_name = problem.by_name
    done: set[str] = set(saved_set)
    done.update(n.name for n in problem.nodes if n.role is Role.INPUT)
    order: list[str] = []
    index = problem.index
    for node in problem.nodes:
        if node.role is not Role.BACKWARD:
            continue
        # the not-yet-available ancestors of this node, through values that are not available
        pending: set[str] = set()
        stack = [i for i in node.inputs if i not in done]
        while stack:
            name = stack.pop()
            if name in pending or name in done:
                continue
            pending.add(name)
            stack.extend(i for i in by_name[name].inputs if i not in done)
        for name in sorted(pending, key=index.__getitem__):
            order.append(name)
            done.add(name)
        order.append(node.name)
        done.add(node.name)
    return order


def simulate_plan(problem: Problem, saved: Iterable[str]) -> MemoryCurve:
    """The live-bytes curve of the step under a plan that saves ``saved``."""
    saved_set = set(saved)
    by_name = problem.by_name
    counted = problem.counts_memory
    size = problem.storage_size
    saved_storages = {by_name[s].storage_id for s in saved_set}

    forward = [n.name for n in problem.nodes
               if n.role is Role.FORWARD or (n.role is Role.EITHER and n.name in saved_set)]
    backward = backward_schedule(problem, saved_set)
    steps: list[tuple[str, str, int]] = []

    def run(phase: str, order: list[str], live: dict[str, int], keep: set[str]) -> None:
        last_use: dict[str, int] = {}  # storage -> last step reading a member (or producing it)
        for i, name in enumerate(order):
            for value in (name, *by_name[name].inputs):
                g = by_name[value].storage_id
                last_use[g] = max(last_use.get(g, -1), i)
        frees: dict[int, list[str]] = {}
        for g, i in last_use.items():
            if g not in keep:
                frees.setdefault(i, []).append(g)
        total = sum(live.values())
        for i, name in enumerate(order):
            g = by_name[name].storage_id
            if g not in live and counted(g):
                live[g] = size[g]
                total += size[g]
            steps.append((phase, name, total))
            for dead in frees.get(i, ()):
                total -= live.pop(dead, 0)
        if phase == "forward":  # what the forward does not keep dies with it
            for g in [g for g in live if g not in keep]:
                live.pop(g)

    live: dict[str, int] = {}
    forward_outputs = {by_name[o].storage_id for o in problem.forward_outputs}
    run("forward", forward, live, saved_storages | forward_outputs)
    for g in forward_outputs - saved_storages:
        live.pop(g, None)  # the caller turns outputs into a loss and drops them
    read_in_backward = {by_name[v].storage_id for n in backward for v in (n, *by_name[n].inputs)}
    for g in [g for g in live if g not in read_in_backward]:
        live.pop(g)  # saved but never read: torch drops such values from the saved list
    grads = {by_name[o].storage_id for o in problem.backward_outputs}
    run("backward", backward, live, grads)
    if not steps:
        return MemoryCurve((), 0, "", "")
    peak_phase, peak_at, peak = max(steps, key=lambda s: s[2])
    return MemoryCurve(tuple(steps), peak, peak_phase, peak_at)
