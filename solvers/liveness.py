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

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from .problem import Problem, Role

T = TypeVar("T")
# (simulator, forward order, backward order, backward buffer of each value) -> the rank's bytes
# besides the graph at each forward and backward position, and gradient buffers freed after a
# backward position (``solvers.rank_memory``)
RankHook = Callable[["Simulator", list[int], list[int], dict[int, int]],
                    tuple[Sequence[int], Sequence[int], Mapping[int, list[int]]]]


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


def just_in_time(groups: Iterable[Iterable[T]], inputs_of: Callable[[T], Iterable[T]], done: set[T],
                 position: Callable[[T], int] | None) -> list[T]:
    """The backward's order, recomputation just in time: each group in turn (a backward value, or
    the values a graph returns), preceded by what it needs that is not ``done`` yet, in
    ``position`` order (None: the values' own). ``done`` grows with what is placed. The simulation
    and the lowering (``opt_remat.extract``, autograd's order of the backward graph) both order by
    this."""
    order: list[T] = []
    for roots in groups:
        found: set[T] = set()
        stack = list(roots)
        while stack:
            v = stack.pop()
            if v in found or v in done:
                continue
            found.add(v)
            stack.extend(inputs_of(v))
        done.update(found)
        if len(found) > 1:
            order.extend(sorted(found) if position is None else sorted(found, key=position))  # type: ignore[type-var]
        else:
            order.extend(found)
    return order


class Simulator:
    """The step's live bytes under plans of one problem, on integer ids with the problem's
    structure prepared once: the searches simulate thousands of saved sets of one problem
    (``simulator(problem)`` keeps one per problem)."""

    def __init__(self, problem: Problem) -> None:
        nodes = problem.nodes
        self.names = [n.name for n in nodes]
        ids = {name: i for i, name in enumerate(self.names)}
        storages: dict[str, int] = {}
        self.sid = [storages.setdefault(n.storage_id, len(storages)) for n in nodes]
        self.storage_names = list(storages)
        self.counted = [problem.counts_memory(g) for g in storages]
        self.size = [problem.storage_size[g] for g in storages]
        self.inputs = [tuple(ids[i] for i in n.inputs) for n in nodes]
        self.is_view = [n.storage_id != n.name for n in nodes]
        self.role = [n.role for n in nodes]
        self.alloc_by = [ids.get(n.allocated_by, -1) if n.allocated_by is not None else -1 for n in nodes]
        self.forward_nodes = [i for i, n in enumerate(nodes) if n.role is Role.FORWARD]
        self.input_nodes = [i for i, n in enumerate(nodes) if n.role is Role.INPUT]
        self.backward_nodes = [i for i, n in enumerate(nodes) if n.role is Role.BACKWARD]
        self.outputs = {self.sid[ids[o]] for o in problem.forward_outputs}
        self.grads = [ids[o] for o in problem.backward_outputs]
        self.ids = ids
        # buffers by name, as simulate_plan's on_step sees them: a storage, or bw:VALUE for a
        # buffer made in the backward (ids from len(storages) on)
        self.buffer_names = self.storage_names + [f"bw:{name}" for name in self.names]
        self.grad_buffers: set[int] = set()  # the latest simulation's gradient buffers

    def backward_order(self, saved_ids: set[int]) -> list[int]:
        inputs = self.inputs
        return just_in_time(([b] for b in self.backward_nodes), inputs.__getitem__,
                            saved_ids | set(self.input_nodes), None)

    def _forward_order(self, saved_ids: set[int]) -> list[int]:
        inputs, role = self.inputs, self.role
        needed = set(self.forward_nodes)
        stack = [v for v in saved_ids if role[v] is Role.EITHER]
        while stack:
            v = stack.pop()
            if v in needed:
                continue
            needed.add(v)
            stack.extend(u for u in inputs[v] if role[u] is Role.EITHER)
        return sorted(needed)

    def _run(self, order: list[int], buffer: dict[int, int] | None, live: dict[int, int],
             keep: set[int], top: list[Any], steps: list[Any] | None, phase: str,
             on_step: Callable[[Mapping[str, int]], None] | None = None,
             extra: Sequence[int] | None = None, release: Mapping[int, list[int]] | None = None,
             kept_if_read: set[int] | None = None, limit: int | None = None) -> bool:
        """Run ``order``: record the highest live bytes in ``top`` ([bytes, phase, value, position,
        what is live]) and each step in ``steps``. ``extra``: bytes the rank holds besides the graph
        at each position (counted in ``top`` and ``steps``); ``release``: kept buffers freed after a
        position (FSDP's gradients); ``kept_if_read``: the buffers of ``live`` kept if read here."""
        sid, inputs, counted, size, alloc_by = self.sid, self.inputs, self.counted, self.size, self.alloc_by
        bl = sid if buffer is None else [-1] * len(sid)  # each value's buffer here (-1: none)
        for v, b in (buffer or {}).items():
            bl[v] = b
        last_use: dict[int, int] = {}
        for i, v in enumerate(order):
            b = bl[v]
            if b >= 0:
                last_use[b] = i
            for u in inputs[v]:
                b = bl[u]
                if b >= 0:
                    last_use[b] = i
        if kept_if_read is not None:
            for b in [b for b in live if b not in kept_if_read or b not in last_use]:
                del live[b]
        frees: dict[int, list[int]] = {}
        for b, i in last_use.items():
            if b not in keep:
                frees.setdefault(i, []).append(b)
        for i, bs in (release or {}).items():
            frees.setdefault(i, []).extend(bs)
        in_order = set(order)
        # the outputs of a multi-output op exist from its call on, not from their extraction
        moved: dict[int, list[int]] = {}  # an op run here -> the outputs extracted from it
        for v in order:
            p = alloc_by[v]
            if p >= 0 and p in in_order and bl[p] >= 0:
                moved.setdefault(p, []).append(v)
        extracted = {w for ws in moved.values() for w in ws}
        total = sum(live.values())
        # the live set at the peak: rebuilt once from the changes logged (not copied at each new peak)
        start, changes, peak_at = live.copy(), [], -1
        for i, v in enumerate(order):
            ws: Sequence[int] = moved.get(v, ())
            if v not in extracted:
                ws = (v, *ws) if ws else (v,)
            for w in ws:
                b = bl[w]
                g = sid[w]
                if b not in live and counted[g]:
                    live[b] = size[g]
                    total += size[g]
                    changes.append((i, b, size[g]))
            here = total if extra is None else total + extra[i]
            if steps is not None:
                steps.append((phase, v, here))
            if on_step is not None:
                names = self.buffer_names
                on_step(dict(zip(map(names.__getitem__, live), live.values())))
            if here > top[0]:
                top[:4], peak_at = [here, phase, v, i], i
                if limit is not None and here > limit:
                    top[4] = {}  # past the limit: no live set
                    return True
            for dead in frees.get(i, ()):
                if dead in live:
                    total -= live.pop(dead)
                    changes.append((i, dead, -1))
        if peak_at >= 0:
            top[4] = _replayed(start, changes, peak_at)
        return False

    def _simulate(self, saved: Iterable[str], steps: list[Any] | None,
                  on_step: Callable[[Mapping[str, int]], None] | None = None,
                  rank: RankHook | None = None, limit: int | None = None) -> tuple[list[Any], set[int]]:
        """(the top: [live bytes, phase, value, position, what is live], the gradients' buffers).
        ``rank`` adds what the rank holds besides the graph (``solvers.rank_memory``); ``limit``:
        the run stops once the live bytes pass it (no live set then, nor gradients before it)."""
        sid, inputs = self.sid, self.inputs
        saved_ids = {self.ids[v] for v in saved}
        forward = self._forward_order(saved_ids)
        top: list[Any] = [-1, "", -1, -1, {}]
        live: dict[int, int] = {}
        saved_storages = {sid[v] for v in saved_ids}
        keep = saved_storages | self.outputs
        if rank is None and self._run(forward, None, live, keep, top, steps, "forward", on_step, limit=limit):
            return top, set()  # past the limit in the forward: no backward to order
        backward = self.backward_order(saved_ids)
        # backward buffers: a storage's id (saved values, inputs) or n_storages + value id (fresh)
        fresh = len(self.size)
        bw: dict[int, int] = {v: sid[v] for v in saved_ids}
        for v in self.input_nodes:
            bw[v] = sid[v]
        for v in backward:
            g = sid[v]
            if not self.counted[g]:
                bw[v] = g
                continue
            base = next((i for i in inputs[v] if sid[i] == g and i in bw), None) if self.is_view[v] else None
            bw[v] = fresh + v if base is None else bw[base]
        grads = {bw[o] for o in self.grads if o in bw}
        self.grad_buffers = grads  # for ``on_step`` callers that split the live buffers by kind
        bw_extra: Sequence[int] | None = None
        release: Mapping[int, list[int]] | None = None
        if rank is not None:  # the rank's bytes per position, and when FSDP frees gradients
            fw_extra, bw_extra, release = rank(self, forward, backward, bw)
            if self._run(forward, None, live, keep, top, steps, "forward", on_step, fw_extra, limit=limit):
                return top, grads
        # the caller turns outputs into a loss and drops them; saved values nobody reads are dropped
        self._run(backward, bw, live, grads, top, steps, "backward", on_step, bw_extra, release,
                  kept_if_read=saved_storages, limit=limit)
        return top, grads

    def _name(self, b: int) -> str:
        fresh = len(self.size)
        return self.storage_names[b] if b < fresh else self.names[b - fresh]

    # for bounds that count the graph alone (``graph_share``): whether the peaks free the graph's
    # gradients early, and the bytes they count besides the graph at every position, whatever the plan
    frees_gradients = False

    def floor_besides_graph(self) -> int:
        return 0

    def peak(self, saved: Iterable[str], rank: RankHook | None = None,
             limit: int | None = None) -> tuple[int, frozenset[str]]:
        """The step's peak and the buffers live at it (a storage by its id, a buffer made in the
        backward by its value), without the curve: what the searches need. ``rank``: the peak
        of the rank's whole memory (``solvers.rank_memory.RankModel.hook``). ``limit``: where the
        step passes it, the first live bytes above it and no buffers, found sooner."""
        top, _ = self._simulate(saved, None, None, rank, limit)
        if top[0] < 0:
            return 0, frozenset()
        return top[0], frozenset(self._name(b) for b in top[4])

    def curve(self, saved: Iterable[str], on_step: Callable[[Mapping[str, int]], None] | None = None,
              rank: RankHook | None = None) -> MemoryCurve:
        steps: list[tuple[str, int, int]] = []
        top, grads = self._simulate(saved, steps, on_step, rank)
        live = top[4]
        if not steps:
            return MemoryCurve((), 0, "", "")
        names = self.names
        at_peak = sum(n for b, n in live.items() if b in grads)
        return MemoryCurve(tuple((ph, names[v], n) for ph, v, n in steps), top[0], top[1],
                           names[top[2]], frozenset(self._name(b) for b in live), at_peak)


def _replayed(start: dict[int, int], changes: Sequence[tuple[int, int, int]], at: int) -> dict[int, int]:
    """The live buffers after the allocations of position ``at`` and before its frees: ``start``
    with ``changes`` ((position, buffer, bytes); -1 bytes: freed) applied up to there."""
    live = dict(start)
    for i, b, nbytes in changes:
        if i > at or (i == at and nbytes < 0):
            break
        if nbytes < 0:
            del live[b]
        else:
            live[b] = nbytes
    return live


def simulator(problem: Problem) -> Simulator:
    """The problem's simulator, prepared on first use and kept with the problem."""
    return problem.derived("liveness.simulator", Simulator)


def backward_schedule(problem: Problem, saved: Iterable[str]) -> list[str]:
    """The backward's execution order: each backward value preceded by what it needs, just in time."""
    sim = simulator(problem)
    return [sim.names[v] for v in sim.backward_order({sim.ids[v] for v in saved})]


def simulate_plan(problem: Problem, saved: Iterable[str],
                  on_step: Callable[[Mapping[str, int]], None] | None = None) -> MemoryCurve:
    """The live-bytes curve of the step under a plan that saves ``saved``. ``on_step`` (for
    reports) sees the live buffers after each step: ``{buffer: bytes}``, a buffer named by its
    storage, or ``bw:VALUE`` for one made in the backward.

    Memory is tracked per buffer: in the forward a storage is one buffer; in the backward a
    recomputed value gets a fresh buffer (even if a saved view still holds the forward's copy of its
    storage), and a view computed there aliases the buffer of the input it views.
    """
    return simulator(problem).curve(saved, on_step)


def without_gradients(problem: Problem) -> Problem:
    """The problem with gradients (backward outputs) costing no memory: for budgeting the step's
    activations alone, when ``.grad`` buffers live between steps anyway (gradient accumulation, an
    optimizer that keeps them) and so are not the plan's to save. Saved bytes are unchanged: only
    storages that no forward-side value shares are zeroed."""
    forward_side = {n.storage_id for n in problem.nodes if n.role is not Role.BACKWARD}
    grads = {problem.by_name[o].storage_id for o in problem.backward_outputs} - forward_side
    return replace(problem, storage_bytes={**problem.storage_bytes, **{g: 0 for g in grads}})


def graph_share(problem: Problem) -> Problem:
    """The problem as bounds that count the graph alone see it: itself, or where its simulator
    counts more than the graph (``solvers.rank_memory.with_rank_memory``), a copy with the plain
    simulator whose gradients cost nothing where that simulator frees them before the end."""
    sim = simulator(problem)
    if type(sim) is Simulator:
        return problem
    return without_gradients(problem) if sim.frees_gradients else replace(problem)


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
    real peak higher, never lower. A problem whose simulation counts the rank's memory: the
    graph's floor (``graph_share``) and what the rank holds at every position.
    """
    graph = graph_share(problem)
    if graph is not problem:  # the rank's memory: what it holds at every position, and the graph's floor
        return simulator(problem).floor_besides_graph() + peak_lower_bound(graph)
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
