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
from typing import Callable, Iterable, Mapping

from .problem import Problem, Role


@dataclass(frozen=True)
class MemoryCurve:
    steps: tuple[tuple[str, str, int], ...]  # (phase, value name, live bytes after computing it)
    peak: int
    peak_phase: str
    peak_at: str
    # the values whose buffers are live at the peak (a storage by its id, a buffer made in the
    # backward by its value): where moves that lower the peak are found
    peak_live: frozenset[str] = frozenset()
    # bytes of gradients (backward outputs) live at the peak: the rest is activations, recomputed
    # values and backward temporaries
    peak_gradients: int = 0

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


def simulate_plan(problem: Problem, saved: Iterable[str],
                  on_step: Callable[[Mapping[str, int]], None] | None = None) -> MemoryCurve:
    """The live-bytes curve of the step under a plan that saves ``saved``. ``on_step`` (for
    reports) sees the live buffers after each step: ``{buffer: bytes}``, a buffer named by its
    storage, or ``bw:VALUE`` for one made in the backward.

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
                on_step(live)
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


def without_gradients(problem: Problem) -> Problem:
    """The problem with gradients (backward outputs) costing no memory: for budgeting the step's
    activations alone, when ``.grad`` buffers live between steps anyway (gradient accumulation, an
    optimizer that keeps them) and so are not the plan's to save. Saved bytes are unchanged: only
    storages that no forward-side value shares are zeroed."""
    from dataclasses import replace
    forward_side = {n.storage_id for n in problem.nodes if n.role is not Role.BACKWARD}
    grads = {problem.by_name[o].storage_id for o in problem.backward_outputs} - forward_side
    return replace(problem, storage_bytes={**problem.storage_bytes, **{g: 0 for g in grads}})


def peak_lower_bound(problem: Problem) -> int:
    """Live bytes that every plan's step reaches at some point (in this execution model): a floor
    for the smallest peak, so that a peak found can be judged.

    * forward: the forward values with their forward lifetimes, plus the values no plan can avoid
      saving (read by the backward, not recomputable) kept to the end of the forward; a plan only
      adds to this (saved values live longer, ``either`` values run);
    * backward: the backward values' own buffers from creation to last use (gradients to the end),
      plus at each step the storages the step reads from the forward side (they must be live, saved
      or recomputed) and the unavoidable saved values not yet read for the last time.
    Multi-output allocation and buffers shared in ways the simulation counts twice only make the
    real peak higher, never lower.
    """
    by_name, size = problem.by_name, problem.storage_size
    forced = {by_name[v].storage_id for v in problem.backward_reads
              if by_name[v].role is not Role.INPUT and not problem.can_recompute(v)
              and problem.counts_memory(by_name[v].storage_id)}

    def floor(order: list[str], own: Callable[[str], bool], keep: set[str],
              extra: Callable[[int, str], set[str]]) -> int:
        produced: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, name in enumerate(order):
            g = by_name[name].storage_id
            if own(g) and problem.counts_memory(g) and g not in produced:
                produced[g] = i
            for v in (name, *by_name[name].inputs):
                gv = by_name[v].storage_id
                if gv in produced:
                    last[gv] = i
        delta = [0] * (len(order) + 1)
        for g, start in produced.items():
            delta[start] += size[g]
            if g not in keep:
                delta[last[g] + 1] -= size[g]
        best = running = 0
        for i, name in enumerate(order):
            running += delta[i]
            best = max(best, running + sum(size[g] for g in extra(i, name) if g not in produced))
        return best

    forward = [n.name for n in problem.nodes if n.role is Role.FORWARD]
    outputs = {by_name[o].storage_id for o in problem.forward_outputs}
    forward_floor = floor(forward, lambda g: True, outputs | forced, lambda i, name: set())

    backward = [n.name for n in problem.nodes if n.role is Role.BACKWARD]
    position = {name: i for i, name in enumerate(backward)}
    forward_side = {n.storage_id for n in problem.nodes if n.role is not Role.BACKWARD}
    last_read: dict[str, int] = {}
    for name in backward:
        for u in by_name[name].inputs:
            if by_name[u].role is not Role.BACKWARD:
                last_read[by_name[u].storage_id] = position[name]
    for r in problem.required:
        if by_name[r].role is not Role.BACKWARD:
            last_read[by_name[r].storage_id] = len(backward) - 1

    def read_here(i: int, name: str) -> set[str]:
        direct = {by_name[u].storage_id for u in by_name[name].inputs if by_name[u].role is not Role.BACKWARD}
        pending = {g for g in forced if last_read.get(g, -1) >= i}
        return {g for g in direct | pending if problem.counts_memory(g)}

    grads = {by_name[o].storage_id for o in problem.backward_outputs}
    backward_floor = floor(backward, lambda g: g not in forward_side, grads, read_here)
    return max(forward_floor, backward_floor)


def narrow_cut_values(problem: Problem, widest: float = 1.0, largest_only: bool = False,
                      within: tuple[int, int] | None = None) -> list[str]:
    """Forward values that cross the forward's narrowest cuts: where, in graph order, the fewest
    bytes computed so far are still needed later (up to ``widest`` times that width). In a network
    of blocks the narrowest are the values between blocks (a transformer's residual stream): the
    classic checkpoints; wider cuts add values inside the blocks. Views are left out (their base
    crosses). ``largest_only``: per narrow cut only its largest value (the residual stream, not
    the small statistics alive beside it). ``within``: only cuts after forward values whose node
    indices lie in this range (the blocks: not the loss head's scalars)."""
    forward = [n for n in problem.nodes if n.role is Role.FORWARD]
    position = {n.name: i for i, n in enumerate(forward)}
    last: dict[str, int] = {}
    for n in forward:
        for u in n.inputs:
            if u in position:
                last[u] = max(last.get(u, -1), position[n.name])
    size = problem.storage_size
    crossing = [n for n in forward if n.storage_id == n.name and last.get(n.name, -1) > position[n.name]]
    # width[t]: bytes of the values made at or before step t and read after it (the cut after t)
    delta = [0] * (len(forward) + 1)
    for n in crossing:
        delta[position[n.name]] += size[n.name]
        delta[last[n.name]] -= size[n.name]
    width, running = [], 0
    for i in range(len(forward)):
        running += delta[i]
        width.append(running)
    lo, hi = within if within is not None else (0, len(problem.nodes))
    index = problem.index
    width = [w if lo <= index[forward[t].name] <= hi else 0 for t, w in enumerate(width)]
    inner = [w for w in width[1:-1] if w > 0]
    if not inner:
        return []
    narrow = min(inner)
    narrow_before = [0]  # narrow_before[t]: narrowest positions before t
    for w in width:
        narrow_before.append(narrow_before[-1] + (0 < w <= narrow * widest))
    if largest_only:  # per narrow position, the largest value alive across it
        import heapq
        starts: dict[int, list] = {}
        for n in crossing:
            starts.setdefault(position[n.name], []).append(n)
        heap: list[tuple[int, int, str]] = []
        chosen: set[str] = set()
        for t in range(len(forward)):
            for n in starts.get(t, ()):
                heapq.heappush(heap, (-size[n.name], position[n.name], n.name))
            while heap and last[heap[0][2]] <= t:
                heapq.heappop(heap)
            if 0 < width[t] <= narrow * widest and heap:
                chosen.add(heap[0][2])
        return [n.name for n in crossing if n.name in chosen]
    # crosses a narrowest cut: alive across some position of that width
    return [n.name for n in crossing
            if narrow_before[last[n.name]] > narrow_before[position[n.name]]]
