"""A rank's whole memory over the step: the graph's buffers (``solvers.liveness``) plus what the
rank holds for training (``solvers.training``), by kind (``solvers.memory_kinds``).

FSDP (FSDP2's ``fully_shard`` per block, the rest one root unit; blocks from module paths as
``solvers.blocks`` finds them). At every position of the step's one timeline:

* sharded parameters (master dtype, each parameter's first dimension padded to a multiple of the
  ranks) and the optimizer state on them: always;
* gathered parameters (compute dtype): the root's for the whole step; a block's from its first to
  its last forward value; in the backward from its first backward value to its last value, and
  before that for each run of its recomputation (``_backward_runs``); with
  ``reshard_after_forward`` off, from its forward until the end of its backward;
* all-gather buffer: the output of the latest all-gather, held until the next one (a block's
  while it runs; with prefetch, the next block's); none in the backward without resharding;
* the graph's parameter gradients (compute dtype) until the end of their block's backward (its
  reduce-scatter); then the block's reduce-scatter input (reduce dtype, padded) until the next
  block's, and its gradient shard (master dtype) to the end.

One device or DDP: the parameters (master dtype), their compute-dtype copy when it differs, the
optimizer state and, for DDP, its gradient buckets (reduce dtype) for the whole step; the graph's
gradients to the end of the step, as without a set-up. docs/design.md ("The rank's memory") says
where this model and torch's ``FSDPMemTracker`` differ.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from .blocks import find_blocks
from .liveness import MemoryCurve, RankHook, Simulator, simulator
from .memory_kinds import MemoryKind as K
from .problem import Parameter, Problem, Role
from .training import OPTIMIZER_STATES, TrainingSetup


# what the rank holds besides the graph: (kind, first position, position after the last, bytes)
Events = list[tuple[K, int, int, int]]


@dataclass(frozen=True)
class Unit:
    path: str  # the block's module path; "" for the root unit (everything outside the blocks)
    parameters: tuple[Parameter, ...]

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.parameters)

    def padded(self, ranks: int) -> int:
        """Elements once each parameter's first dimension is padded to a multiple of ``ranks``
        (FSDP2's ``Shard(0)`` with uneven sizes)."""
        return sum(-(-p.dim0 // ranks) * ranks * (p.numel // max(p.dim0, 1)) for p in self.parameters)


def fsdp_units(problem: Problem) -> list[Unit]:
    """FSDP units: one per block in forward order, then the root (every other parameter)."""
    blocks = find_blocks(problem)
    paths = list(blocks.paths) if blocks is not None else []
    owned: list[list[Parameter]] = [[] for _ in range(len(paths) + 1)]
    for p in problem.parameters:
        b = next((i for i, path in enumerate(paths) if p.path.startswith(path + ".")), len(paths))
        owned[b].append(p)
    return [Unit(path, tuple(ps)) for path, ps in zip([*paths, ""], owned)]


@dataclass(frozen=True)
class RankPeak:
    total: int
    phase: str  # "forward" or "backward"
    at: str  # the value computed at the peak
    by_kind: Mapping[K, int]

    def lines(self) -> list[str]:
        return [f"{k.value}: {v / 2**20:.2f} MiB" for k, v in self.by_kind.items() if v]


@dataclass(frozen=True)
class RankCurve:
    steps: tuple[tuple[str, str], ...]  # (phase, value) per position
    by_kind: Mapping[K, tuple[int, ...]]  # bytes of each kind at each position
    peak: RankPeak


def _spans(order: Sequence[int], unit: Sequence[int],
           counts: Sequence[bool] | None = None) -> dict[int, tuple[int, int]]:
    """Per block, its first and last position in ``order`` among the values ``counts`` (all
    without it); blocks with no such value left out."""
    spans: dict[int, tuple[int, int]] = {}
    for i, v in enumerate(order):
        b = unit[v]
        if b >= 0 and (counts is None or counts[v]):
            first = spans[b][0] if b in spans else i
            spans[b] = (first, i)
    return spans


def _backward_runs(order: Sequence[int], unit: Sequence[int],
                   is_backward: Sequence[bool]) -> dict[int, list[tuple[int, int, bool]]]:
    """Per block, the runs of backward positions its parameters are gathered for: (first, last,
    whether it is the block's own backward). Its backward runs from its first backward value to its
    last value (FSDP2's pre- and post-backward hooks); before that, its recomputation runs in
    pieces, a new one wherever another block ran in between (FSDP reshards a recomputed block
    after its forward; a plan that recomputes the whole forward at once gathers one block at a
    time)."""
    first_backward: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, v in enumerate(order):
        b = unit[v]
        if b >= 0:
            last[b] = i
            if is_backward[v]:
                first_backward.setdefault(b, i)
    runs: dict[int, list[tuple[int, int, bool]]] = {b: [] for b in last}
    previous = -1  # the block of the latest block value
    for i, v in enumerate(order):
        b = unit[v]
        if b < 0:
            continue
        if i < first_backward.get(b, len(order)):
            pieces = runs[b]
            if pieces and previous == b:
                pieces[-1] = (pieces[-1][0], i, False)
            else:
                pieces.append((i, i, False))
        previous = b
    for b, start in first_backward.items():
        runs[b].append((start, last[b], True))
    return runs


class RankModel:
    """The rank's memory besides the graph under one set-up, prepared once per problem: ``hook``
    goes to ``Simulator.peak`` / ``_simulate``; ``resident`` says what it added, by kind."""

    def __init__(self, problem: Problem, setup: TrainingSetup, sim: Simulator | None = None) -> None:
        self.problem, self.setup = problem, setup
        self.sim: Simulator = sim or simulator(problem)
        units = fsdp_units(problem) if setup.sharded else [Unit("", problem.parameters)]
        self.units = units
        n = setup.shards
        pb, mb, rb, sb = (setup.bytes_of(f) for f in ("param_dtype", "master_dtype", "reduce_dtype", "state_dtype"))
        shard = [u.padded(n) // n if setup.sharded else u.numel for u in units]
        self.sharded_params = sum(shard) * mb
        self.optimizer = OPTIMIZER_STATES[setup.optimizer] * sum(shard) * sb
        self.gathered = [u.numel * pb for u in units]
        self.all_gather = [u.padded(n) * pb for u in units]
        self.reduce = [u.padded(n) * rb for u in units]
        self.grad_shard = [s * mb for s in shard]
        ids = self.sim.ids
        blocks = find_blocks(problem)
        block_of = blocks.block_of if blocks is not None and setup.sharded else {}
        self.unit = [block_of.get(name, -1) for name in self.sim.names]  # -1: the root unit
        self.is_forward = [r is Role.FORWARD for r in self.sim.role]
        self.is_backward = [r is Role.BACKWARD for r in self.sim.role]
        grad_unit: dict[int, int] = {}
        for u, unit in enumerate(units):
            for p in unit.parameters:
                if p.grad is not None:
                    grad_unit[ids[p.grad]] = u
        self.grad_unit = grad_unit
        self.last: tuple[Events, Events] | None = None  # the latest simulation's intervals

    # ---- what the rank holds at each position: intervals [lo, hi) of positions ---------------
    def constant(self) -> dict[K, int]:
        """The kinds held at every position whatever the plan (one device, DDP: all of them)."""
        kinds = {K.SHARDED_PARAMS: self.sharded_params, K.OPTIMIZER: self.optimizer}
        s = self.setup
        if not s.sharded:
            whole = self.units[0].numel
            if s.param_dtype != s.master_dtype:
                kinds[K.GATHERED_PARAMS] = whole * s.bytes_of("param_dtype")
            if s.sharding == "ddp":
                kinds[K.REDUCE_SCATTER] = whole * s.bytes_of("reduce_dtype")
        return kinds

    def floor(self) -> int:
        """Bytes held at every position of the step whatever the plan: the constant kinds, and
        under FSDP the root unit's gathered parameters."""
        root = self.gathered[-1] if self.setup.sharded else 0
        return sum(self.constant().values()) + root

    def _forward(self, order: Sequence[int]) -> Events:
        n = len(order)
        events: Events = [(k, 0, n, v) for k, v in self.constant().items()]
        if not self.setup.sharded:
            return events
        root = len(self.units) - 1  # also the number of blocks
        # a block runs from its first to its last forward value: an ``either`` value a plan saves
        # runs where the graph has it (often with the backward's), not inside its block's forward
        spans = sorted(_spans(order, self.unit, self.is_forward).items(), key=lambda s: s[1])
        events.append((K.GATHERED_PARAMS, 0, n, self.gathered[root]))
        # the latest all-gather's output: the running block's, or with prefetch the next one's
        events.append((K.ALL_GATHER, 0, spans[0][1][0] if spans else n, self.all_gather[root]))
        for k, (b, (first, last)) in enumerate(spans):
            end = last + 1 if self.setup.reshard_after_forward else n
            events.append((K.GATHERED_PARAMS, first, end, self.gathered[b]))
            nxt = b + 1 if self.setup.prefetch and b + 1 < root else b
            after = spans[k + 1][1][0] if k + 1 < len(spans) else n
            events += [(K.ALL_GATHER, first, last + 1, self.all_gather[nxt]),
                       (K.ALL_GATHER, last + 1, max(after, last + 1), self.all_gather[b])]
        return events

    def _backward(self, order: Sequence[int]) -> tuple[Events, dict[int, list[int]]]:
        """The resident kinds per backward position, and which gradient ids are freed after one."""
        n = len(order)
        events: Events = [(k, 0, n, v) for k, v in self.constant().items()]
        if not self.setup.sharded:
            return events, {}
        setup = self.setup
        root = len(self.units) - 1
        spans = _spans(order, self.unit)
        runs = _backward_runs(order, self.unit, self.is_backward)
        events.append((K.GATHERED_PARAMS, 0, n, self.gathered[root]))
        for b, (_, last) in spans.items():
            if setup.reshard_after_forward:
                events += [(K.GATHERED_PARAMS, lo, hi + 1, self.gathered[b]) for lo, hi, _ in runs[b]]
            else:
                events.append((K.GATHERED_PARAMS, 0, last + 1, self.gathered[b]))
        if setup.reshard_after_forward:
            # each run starts with an all-gather whose output is held until the next one (with
            # prefetch, a block's backward gathers the block before it); before the first, the
            # forward's last all-gather is still held
            starts = sorted((lo, hi, b, in_backward) for b, rs in runs.items() for lo, hi, in_backward in rs)
            if root:
                events.append((K.ALL_GATHER, 0, starts[0][0] if starts else n, self.all_gather[root - 1]))
            for k, (lo, hi, b, in_backward) in enumerate(starts):
                upto = starts[k + 1][0] if k + 1 < len(starts) else hi + 1
                nxt = b - 1 if setup.prefetch and in_backward and b > 0 else b
                events.append((K.ALL_GATHER, lo, upto, self.all_gather[nxt]))
        done = sorted((last, b) for b, (_, last) in spans.items())
        for k, (last, b) in enumerate(done):
            until = done[k + 1][0] + 1 if k + 1 < len(done) else n
            events += [(K.SHARDED_GRADS, last + 1, n, self.grad_shard[b]),
                       (K.REDUCE_SCATTER, last + 1, until, self.reduce[b])]
        release: dict[int, list[int]] = {}
        for g, u in self.grad_unit.items():
            if u in spans:
                release.setdefault(spans[u][1], []).append(g)
        return events, release

    def hook(self, sim: Simulator, forward: list[int], backward: list[int],
             bw: dict[int, int]) -> tuple[list[int], list[int], dict[int, list[int]]]:
        """``liveness.RankHook``: the bytes added per position, and FSDP's gradient frees."""
        fw = self._forward(forward)
        bwk, release = self._backward(backward)
        self.last = (fw, bwk)
        buffers = {i: [bw[g] for g in gs if g in bw] for i, gs in release.items()}
        return _total(fw, len(forward)), _total(bwk, len(backward)), buffers

    # ---- the graph's buffers by kind ----------------------------------------------------------
    def graph_kinds(self, live: Mapping[int, int], grads: set[int]) -> dict[K, int]:
        """The simulator's live buffers (its ids) split into activations, temporaries, gradients."""
        sim = self.sim
        fresh = len(sim.size)
        out = {K.ACTIVATIONS: 0, K.TEMPORARIES: 0, K.GRADIENTS: 0}
        for b, nbytes in live.items():
            v = b - fresh if b >= fresh else sim.ids[sim.storage_names[b]]
            if b in grads:
                kind = K.GRADIENTS
            else:
                kind = K.TEMPORARIES if sim.role[v] is Role.BACKWARD else K.ACTIVATIONS
            out[kind] += nbytes
        return out


def _total(events: Events, length: int) -> list[int]:
    """The bytes at each position: the intervals summed through one difference array."""
    delta = [0] * (length + 1)
    for _, lo, hi, nbytes in events:
        if lo < hi:
            delta[lo] += nbytes
            delta[hi] -= nbytes
    out, running = [], 0
    for d in delta[:length]:
        running += d
        out.append(running)
    return out


def _at(events: Events, i: int) -> dict[K, int]:
    out: dict[K, int] = {}
    for kind, lo, hi, nbytes in events:
        if lo <= i < hi:
            out[kind] = out.get(kind, 0) + nbytes
    return out


def _ordered(kinds: Mapping[K, int]) -> dict[K, int]:
    return {k: kinds.get(k, 0) for k in K}


def rank_peak(problem: Problem, saved: Iterable[str], setup: TrainingSetup | None,
              model: RankModel | None = None) -> RankPeak:
    """The peak of the rank's whole memory under the plan that saves ``saved``, by kind. With
    ``setup=None``: the graph's peak (``simulate_plan``'s), split into its own kinds."""
    sim = simulator(problem)
    model = model or RankModel(problem, setup or TrainingSetup())
    hook = model.hook if setup is not None else None
    top, grads = sim._simulate(saved, None, None, hook)
    return _peak_of(sim, model, setup, top, grads)


def _peak_of(sim: Simulator, model: RankModel, setup: TrainingSetup | None, top: list[Any],
             grads: set[int]) -> RankPeak:
    """The peak a simulation found (``Simulator._simulate``'s top), split by kind."""
    if top[0] < 0:
        return RankPeak(0, "", "", _ordered({}))
    kinds = model.graph_kinds(top[4], grads)
    if setup is not None and model.last is not None:
        kinds.update(_at(model.last[0 if top[1] == "forward" else 1], top[3]))
    return RankPeak(top[0], top[1], sim.names[top[2]], _ordered(kinds))


def rank_curve(problem: Problem, saved: Iterable[str], setup: TrainingSetup | None,
               on_step: Callable[[Mapping[str, int]], None] | None = None) -> RankCurve:
    """The rank's memory at every position of the step, by kind (for reports), and its peak, in
    one simulation; ``on_step`` sees the graph's live buffers after each step, as
    ``simulate_plan``'s does."""
    sim = simulator(problem)
    model = RankModel(problem, setup or TrainingSetup())
    graph: list[dict[K, int]] = []
    steps: list[tuple[str, int, int]] = []
    buffer_id = {name: b for b, name in enumerate(sim.buffer_names)}

    def split(live: Mapping[str, int]) -> None:
        if on_step is not None:
            on_step(live)
        graph.append(model.graph_kinds({buffer_id[name]: n for name, n in live.items()}, sim.grad_buffers))

    hook = model.hook if setup is not None else None
    top, grad_buffers = sim._simulate(saved, steps, split, hook)
    n_fw = sum(1 for ph, _, _ in steps if ph == "forward")
    resident: list[dict[K, int]] = []
    if setup is not None and model.last is not None:
        fw, bw = model.last
        resident = [_at(fw, i) for i in range(n_fw)] + [_at(bw, i) for i in range(len(steps) - n_fw)]
    by_kind = {k: tuple(g.get(k, 0) + (resident[i].get(k, 0) if resident else 0)
                        for i, g in enumerate(graph)) for k in K}
    peak = _peak_of(sim, model, setup, top, grad_buffers)
    return RankCurve(tuple((ph, sim.names[v]) for ph, v, _ in steps), by_kind, peak)


class RankSimulator(Simulator):
    """A simulator whose peaks and curves are the rank's whole memory: installed on a problem by
    ``with_rank_memory``, every search that simulates (the fast default, the peak search's
    checks) plans against it."""

    def __init__(self, problem: Problem, setup: TrainingSetup) -> None:
        super().__init__(problem)
        self.model = RankModel(problem, setup, sim=self)

    @property
    def frees_gradients(self) -> bool:  # type: ignore[override]
        return self.model.setup.sharded  # at each block's reduce-scatter

    def floor_besides_graph(self) -> int:
        return self.model.floor()

    def peak(self, saved: Iterable[str], rank: RankHook | None = None,
             limit: int | None = None) -> tuple[int, frozenset[str]]:
        return super().peak(saved, rank or self.model.hook, limit)

    def curve(self, saved: Iterable[str], on_step: Callable[[Mapping[str, int]], None] | None = None,
              rank: RankHook | None = None) -> MemoryCurve:
        return super().curve(saved, on_step, rank or self.model.hook)


def with_rank_memory(problem: Problem, setup: TrainingSetup) -> Problem:
    """A copy of ``problem`` whose simulation (``solvers.liveness.simulator``) counts the rank's
    whole memory under ``setup``: a peak budget on it is a budget of device memory."""
    copy = replace(problem)
    copy.derived("liveness.simulator", lambda p: RankSimulator(p, setup))  # the one liveness.simulator returns
    return copy
