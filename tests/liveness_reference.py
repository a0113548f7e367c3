"""The step simulation written directly from its definition (``solvers.liveness``'s module doc),
by value names and strings: the tests' reference for ``solvers.liveness.simulate_plan``, which runs
the same rule on integer ids with the problem's structure prepared once."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from solvers.liveness import MemoryCurve
from solvers.problem import Problem, Role


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


def forward_schedule(problem: Problem, saved: Iterable[str]) -> list[str]:
    """The forward's order: forward values, and the saved ``either`` values with what they need."""
    saved_set = set(saved)
    by_name = problem.by_name
    needed = {n.name for n in problem.nodes if n.role is Role.FORWARD}
    stack = [v for v in saved_set if by_name[v].role is Role.EITHER]
    while stack:
        v = stack.pop()
        if v in needed:
            continue
        needed.add(v)
        stack.extend(u for u in by_name[v].inputs if by_name[u].role is Role.EITHER)
    return [n.name for n in problem.nodes if n.name in needed]


def reference_simulation(problem: Problem, saved: Iterable[str],
                         on_step: Callable[[Mapping[str, int]], None] | None = None) -> MemoryCurve:
    """The live-bytes curve of the step under a plan that saves ``saved``.

    Memory is tracked per buffer: in the forward a storage is one buffer; in the backward a
    recomputed value gets a fresh buffer (even if a saved view still holds the forward's copy of its
    storage), and a view computed there aliases the buffer of the input it views.
    """
    saved_set = set(saved)
    by_name = problem.by_name
    size = problem.storage_size
    forward = forward_schedule(problem, saved_set)
    backward = backward_schedule(problem, saved_set)
    steps: list[tuple[str, str, int]] = []
    top: list = [-1, frozenset()]  # the highest live bytes so far and what was live then

    # buffer of every value as the backward sees it
    bw_buffer: dict[str, str] = {}
    for name in saved_set:
        bw_buffer[name] = by_name[name].storage_id
    for n in problem.nodes:
        if n.role is Role.INPUT:
            bw_buffer[n.name] = n.storage_id
    for name in backward:
        node = by_name[name]
        g = node.storage_id
        if not problem.counts_memory(g):
            bw_buffer[name] = g
            continue
        base = next((i for i in node.inputs if by_name[i].storage_id == g and i in bw_buffer), None)
        bw_buffer[name] = bw_buffer[base] if base is not None and g != name else f"bw:{name}"

    def run(phase: str, order: list[str], buffer: dict[str, str], live: dict[str, int],
            keep: set[str]) -> None:
        last_use: dict[str, int] = {}
        for i, name in enumerate(order):
            for value in (name, *by_name[name].inputs):
                if value in buffer:
                    last_use[buffer[value]] = i
        frees: dict[int, list[str]] = {}
        for b, i in last_use.items():
            if b not in keep:
                frees.setdefault(i, []).append(b)
        # the outputs of a multi-output op exist from its call on, not from their extraction
        allocates: dict[str, list[str]] = {}
        for name in order:
            producer = by_name[name].allocated_by
            allocates.setdefault(producer if producer in buffer and producer in order else name, []).append(name)
        total = sum(live.values())
        for i, name in enumerate(order):
            for value in allocates.get(name, ()):
                b = buffer[value]
                g = by_name[value].storage_id
                if b not in live and problem.counts_memory(g):
                    live[b] = size[g]
                    total += size[g]
            steps.append((phase, name, total))
            if on_step is not None:
                on_step(dict(live))
            if total > top[0]:
                top[0], top[1] = total, frozenset(b[3:] if b.startswith("bw:") else b for b in live)
            for dead in frees.get(i, ()):
                total -= live.pop(dead, 0)

    fw_buffer = {n.name: n.storage_id for n in problem.nodes if n.role is not Role.BACKWARD}
    live: dict[str, int] = {}
    saved_buffers = {by_name[v].storage_id for v in saved_set}
    outputs = {by_name[o].storage_id for o in problem.forward_outputs}
    run("forward", forward, fw_buffer, live, saved_buffers | outputs)
    # the caller turns outputs into a loss and drops them; saved values nobody reads are dropped
    read = {bw_buffer[v] for n in backward for v in (n, *by_name[n].inputs) if v in bw_buffer}
    for b in [b for b in live if b not in saved_buffers or b not in read]:
        live.pop(b)
    grads = {bw_buffer[o] for o in problem.backward_outputs if o in bw_buffer}
    run("backward", backward, bw_buffer, live, grads)
    if not steps:
        return MemoryCurve((), 0, "", "")
    peak_phase, peak_at, peak = max(steps, key=lambda s: s[2])
    grad_names = {b[3:] if b.startswith("bw:") else b for b in grads}
    at_peak = sum(size[by_name[b].storage_id] for b in top[1] if b in grad_names and b in by_name)
    return MemoryCurve(tuple(steps), peak, peak_phase, peak_at, top[1], at_peak)
