"""The step's memory across its graphs: graph breaks, and per-layer compile (one layer graph run
once per layer), under one peak or device budget.

A ``Step`` is its graphs in forward order, each with a repeat count (a layer graph serving L
layers in a row is one entry with ``repeat=L``) and a key (graphs with one key share one plan:
the same compiled graph). Its timeline: every copy's forward in order, then every backward in
reverse. While a copy runs, the rank holds:

* what every earlier copy keeps for its backward (``GraphStats.held``: the saved storages its
  backward reads, its data inputs that backward reads: autograd holds a layer's input hidden
  states);
* the copy's own buffers as its graph's simulation counts them (``solvers.liveness``), with its
  boundary (``with_boundaries``): its data inputs (the previous copy's output) made at its
  forward's start and its incoming gradients at its backward's start, each freed after its last
  use; inputs every copy of a repeated graph shares (``shared_inputs``: rotary tables) counted
  once, as the first copy's own (and the last's, where the backward does not read them);
* the parameter gradients of the copies already backwarded (one device, DDP: they live to the
  optimizer step; under FSDP their shards and the latest reduce-scatter buffer);
* the rank's states for every copy's parameters (``solvers.rank_memory.RankModel``); under FSDP
  each copy is one unit, gathered while it runs (with prefetch the next one's all-gather buffer
  too), all of them from forward to backward without resharding.

On one device this is the simulation of the step unrolled into one problem, to the byte
(``tests/solvers/test_step.py``: L copies of random layers chained); docs/design.md ("The step
across graphs") says what is approximate. ``solvers.step_solve`` plans the step under one budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from .errors import PlanError
from .liveness import simulator
from .memory_kinds import MemoryKind as K
from .problem import Problem, Role, Status, plan_from_saved
from .rank_memory import RankModel, rank_curve
from .training import TrainingSetup


@dataclass(frozen=True)
class StepGraph:
    key: str  # graphs with one key share one plan (one compiled graph: its canonical id)
    problem: Problem
    repeat: int = 1  # copies run one after another (a layer graph serving every layer)
    fixed: frozenset[str] | None = None  # a saved set the planner keeps (an eager part)


@dataclass(frozen=True)
class Step:
    graphs: tuple[StepGraph, ...]  # in forward order

    def keys(self) -> list[str]:
        return list(dict.fromkeys(g.key for g in self.graphs))

    def graph(self, key: str) -> StepGraph:
        return next(g for g in self.graphs if g.key == key)

    def shared(self, key: str) -> frozenset[str]:
        """The inputs the copies of graph ``key`` share (``shared_inputs``): where it runs more
        than once."""
        runs = sum(g.repeat for g in self.graphs if g.key == key)
        return shared_inputs(self.graph(key).problem) if runs > 1 else frozenset()

    def stats(self, key: str, saved: Iterable[str]) -> GraphStats:
        """Graph ``key`` under a plan; with shared inputs, the first copy's stats as ``first``."""
        problem, shared = self.graph(key).problem, self.shared(key)
        if not shared:
            return graph_stats(problem, saved)
        middle = graph_stats(problem, saved, shared)
        read = shared - _forward_only(problem, saved, shared)
        return replace(middle, first=graph_stats(problem, saved), last=graph_stats(problem, saved, read))

    def copies(self) -> list[StepGraph]:
        """Every copy in forward order (a graph of ``repeat`` L appears L times)."""
        return [g for g in self.graphs for _ in range(g.repeat)]


@dataclass(frozen=True)
class GraphStats:
    """One graph under one plan, as the step model uses it (bytes; ``cost`` in seconds)."""
    saved: frozenset[str]
    cost: float
    held: int  # kept from its forward to its backward: saved storages read, saved data inputs
    saved_inputs: int  # the data inputs among ``held``
    inputs: int  # data inputs (not parameters, not tangents), in ``forward`` while alive
    tangents: int  # incoming gradients, in ``backward`` while alive
    param_grads: int  # its parameters' gradients, held after its backward (one device, DDP)
    forward: Mapping[K, int]  # the graph's own buffers at its forward peak, by kind
    backward: Mapping[K, int]  # at its backward peak
    # inputs every copy shares, not read by its backward: alive through the later copies' forwards
    # (those the backward reads are kept by the first copy: ``first``)
    shared_forward: int = 0
    first: "GraphStats | None" = None  # the first copy's, the shared inputs its own
    last: "GraphStats | None" = None  # the last copy's, the shared inputs its backward does not read its own


@dataclass(frozen=True)
class StepPeak:
    total: int
    at: str  # "KEY copy i/L forward|backward"
    by_kind: Mapping[K, int]

    def lines(self) -> list[str]:
        return [f"{k.value}: {v / 2**20:.2f} MiB" for k, v in self.by_kind.items() if v]


def input_kinds(problem: Problem) -> tuple[set[str], set[str]]:
    """(data inputs, tangents) by value name: tangents are inputs only the backward reads."""
    params = {p.node for p in problem.parameters}
    data, tangents = set(), set()
    users = problem.users
    by_name = problem.by_name
    for n in problem.nodes:
        if n.role is not Role.INPUT or n.name in params:
            continue
        roles = {by_name[u].role for u in users[n.name]}
        if roles and roles <= {Role.BACKWARD}:
            tangents.add(n.name)
        elif roles:
            data.add(n.name)
    return data, tangents


def shared_inputs(problem: Problem) -> frozenset[str]:
    """The data inputs every copy of a repeated graph shares (a decoder layer's rotary tables and
    masks): those whose bytes no forward output has. The others are the chain's (the previous
    copy's output: a layer's input hidden states, the size of its output)."""
    data, _ = input_kinds(problem)
    size = problem.storage_size
    out_bytes = {size[problem.by_name[o].storage_id] for o in problem.forward_outputs}
    return frozenset(v for v in data if size[problem.by_name[v].storage_id] not in out_bytes)


def _storage_bytes(problem: Problem, names: Iterable[str]) -> int:
    size = problem.storage_size
    return sum(size[s] for s in {problem.by_name[v].storage_id for v in names})


def _forward_only(problem: Problem, saved: Iterable[str], names: frozenset[str]) -> frozenset[str]:
    """Those of ``names`` the backward (with its recomputation) does not read under the plan."""
    sim = simulator(problem)
    ids = {sim.ids[v] for v in saved}
    read = {sim.names[u] for v in sim.backward_order(ids) for u in (v, *sim.inputs[v])}
    return names - read


def with_boundaries(problem: Problem, shared: frozenset[str] = frozenset()) -> Problem:
    """``problem`` with its boundary in its own simulation: each data input (but the ``shared``
    ones) a forward value made at the forward's start (banned: a plan keeps it, as autograd keeps
    a layer's input) and each tangent a backward value made at the backward's start, each freed
    after its last use as the unrolled step frees them (kept with the problem)."""
    def make(p: Problem) -> Problem:
        data, tangents = input_kinds(p)
        nodes = []
        for n in p.nodes:
            if n.name in data - shared:
                n = replace(n, role=Role.FORWARD, banned=True, cost=0.0)
            elif n.name in tangents:
                n = replace(n, role=Role.BACKWARD)
            nodes.append(n)
        return replace(p, nodes=tuple(nodes), name=f"{p.name} (with its boundary)")
    return problem.derived(f"step.with_boundaries {sorted(shared)}", make)


def graph_stats(problem: Problem, saved: Iterable[str], shared: frozenset[str] = frozenset()) -> GraphStats:
    """``problem`` under the plan saving ``saved``: one simulation of its own buffers by kind (its
    boundary included: ``with_boundaries``; ``shared`` inputs counted once per step instead), and
    what it holds for its backward."""
    saved = frozenset(saved)
    plan = plan_from_saved(problem, saved, solver="step", status=Status.HEURISTIC)
    sim = simulator(problem)
    ids = {sim.ids[v] for v in saved}
    read = {sim.names[u] for v in sim.backward_order(ids) for u in (v, *sim.inputs[v])}
    data, tangents = input_kinds(problem)
    wide = with_boundaries(problem, shared)
    kept = (saved - tangents - shared) | ((data - shared) & read)  # autograd keeps the inputs it reads
    curve = rank_curve(wide, kept, None)
    phases = [ph for ph, _ in curve.steps]
    kinds = list(curve.by_kind)

    def peak_of(phase: str) -> dict[K, int]:
        idx = [i for i, ph in enumerate(phases) if ph == phase]
        if not idx:
            return {}
        best = max(idx, key=lambda i: sum(curve.by_kind[k][i] for k in kinds))
        return {k: curve.by_kind[k][best] for k in kinds if curve.by_kind[k][best]}

    wsim = simulator(wide)
    wids = {wsim.ids[v] for v in kept}
    wread = {u for v in wsim.backward_order(wids) for u in (v, *wsim.inputs[v])}
    held = sum(wsim.size[g] for g in {wsim.sid[v] for v in wids & wread} if wsim.counted[g])
    grads = [p.grad for p in problem.parameters if p.grad is not None]
    return GraphStats(saved, plan.recompute_cost, held, _storage_bytes(problem, (data - shared) & read),
                      _storage_bytes(problem, data - shared), _storage_bytes(problem, tangents),
                      _storage_bytes(problem, grads), peak_of("forward"), peak_of("backward"),
                      _storage_bytes(problem, shared - read))


def _add(into: dict[K, int], kinds: Mapping[K, int], times: int = 1) -> None:
    for k, v in kinds.items():
        if v:
            into[k] = into.get(k, 0) + v * times


@dataclass(frozen=True)
class _Rank:
    """One copy's states under the set-up (the copy is one FSDP unit)."""
    constant: Mapping[K, int]  # held all step
    gathered: int = 0
    all_gather: int = 0
    reduce: int = 0
    grad_shard: int = 0


def copy_rank(problem: Problem, setup: TrainingSetup | None) -> _Rank:
    if setup is None:
        return _Rank({})
    model = RankModel(problem, setup)
    if not setup.sharded:
        return _Rank(model.constant())
    # ``RankModel`` on one graph without blocks: the graph's parameters are one (root) unit
    return _Rank({K.SHARDED_PARAMS: model.sharded_params, K.OPTIMIZER: model.optimizer},
                 sum(model.gathered), sum(model.all_gather), sum(model.reduce), sum(model.grad_shard))


def step_peak(step: Step, plans: Mapping[str, Iterable[str] | GraphStats],
              setup: TrainingSetup | None = None) -> StepPeak:
    """The peak of the step's timeline (module doc) under one saved set (or its ``GraphStats``)
    per key, with the rank's states under ``setup`` (None: the graphs' buffers alone), by kind."""
    stats = {k: v if isinstance(v, GraphStats) else step.stats(k, v)
             for k, v in plans.items()}
    missing = [k for k in step.keys() if k not in stats]
    if missing:
        raise PlanError(f"step_peak: no plan for graph(s) {', '.join(missing)}")
    ranks = {k: copy_rank(step.graph(k).problem, setup) for k in step.keys()}
    return stats_peak(step, stats, ranks, setup)


def stats_peak(step: Step, stats: Mapping[str, GraphStats], ranks: Mapping[str, _Rank],
          setup: TrainingSetup | None) -> StepPeak:
    copies = step.copies()
    n = len(copies)
    sharded = setup is not None and setup.sharded
    reshard = setup is None or setup.reshard_after_forward
    prefetch = setup is not None and setup.prefetch
    constant: dict[K, int] = {}
    for g in step.graphs:
        _add(constant, ranks[g.key].constant, g.repeat)
    runs = {k: sum(g.repeat for g in step.graphs if g.key == k) for k in step.keys()}
    if sharded:  # FSDP2's root unit: every graph run once, gathered all step, reduce-scattered at its end
        _add(constant, {K.GATHERED_PARAMS: sum(ranks[k].gathered for k in runs if runs[k] == 1)})

    def latest_all_gather(c: int, forward: bool) -> int:
        """The all-gather output held while copy ``c`` runs: a layer unit's own (with prefetch in
        the forward the next layer's, in the backward the previous one's); a root copy's, the
        nearest layer's (the root is gathered before the layers, its output held until the next)."""
        k = copies[c].key
        if runs[k] > 1:
            j = c + 1 if forward else c - 1
            near = prefetch and 0 <= j < n and runs[copies[j].key] > 1
            return ranks[copies[j].key].all_gather if near else ranks[k].all_gather
        order = range(c - 1, -1, -1) if forward else range(c + 1, n)
        layer = next((j for j in order if runs[copies[j].key] > 1), None)
        if layer is None:
            order = range(c + 1, n) if forward else range(c - 1, -1, -1)
            layer = next((j for j in order if runs[copies[j].key] > 1), None)
            if forward and layer is not None:  # before the first layer: the root's own gather
                return sum(ranks[x].all_gather for x in runs if runs[x] == 1)
        return ranks[copies[layer].key].all_gather if layer is not None else ranks[k].all_gather

    def unit_gathered(c: int) -> int:  # the running layer unit's (all forwarded ones without resharding)
        if reshard:
            return ranks[copies[c].key].gathered if runs[copies[c].key] > 1 else 0
        return sum(ranks[x.key].gathered for x in copies[:c + 1] if runs[x.key] > 1)
    label = []
    for g in step.graphs:
        label += [f"{g.key} copy {i + 1}/{g.repeat}" if g.repeat > 1 else g.key for i in range(g.repeat)]
    best = StepPeak(-1, "", {})
    first: dict[str, int] = {}
    for c, g in enumerate(copies):
        first.setdefault(g.key, c)
    last = {g.key: c for c, g in enumerate(copies)}

    def of(c: int) -> GraphStats:  # a repeated graph's first copy owns the shared inputs, its last the unread ones
        k = copies[c].key
        s = stats[k]
        if s.first is not None and first[k] == c:
            return s.first
        return s.last if s.last is not None and last[k] == c else s

    def shared(c: int) -> int:  # shared inputs the backward does not read: through the middle copies' forwards
        return sum(stats[k].shared_forward for k, at in first.items() if at < c < last[k])

    held_before = 0
    for c, g in enumerate(copies):  # forwards
        s, r = of(c), ranks[g.key]
        kinds = dict(constant)
        _add(kinds, {K.ACTIVATIONS: held_before + shared(c)})
        _add(kinds, s.forward)
        if sharded:
            _add(kinds, {K.GATHERED_PARAMS: unit_gathered(c), K.ALL_GATHER: latest_all_gather(c, True)})
        best = _higher(best, kinds, f"{label[c]} forward")
        held_before += s.held
    grads_after = 0
    shards_after = 0
    for c in range(n - 1, -1, -1):  # backwards
        g = copies[c]
        s, r = of(c), ranks[g.key]
        held_before -= s.held
        kinds = dict(constant)
        _add(kinds, {K.ACTIVATIONS: held_before})
        _add(kinds, s.backward)
        if sharded:
            before = latest_all_gather(c, False)
            done = ranks[copies[c + 1].key].reduce if c + 1 < n and runs[copies[c + 1].key] > 1 else 0
            _add(kinds, {K.GATHERED_PARAMS: unit_gathered(c), K.ALL_GATHER: before if reshard else 0,
                         K.SHARDED_GRADS: shards_after, K.REDUCE_SCATTER: done, K.GRADIENTS: grads_after})
            if runs[g.key] > 1:
                shards_after += r.grad_shard
            else:  # the root's gradients wait for its reduce-scatter at the backward's end
                grads_after += s.param_grads
        else:
            _add(kinds, {K.GRADIENTS: grads_after})
            grads_after += s.param_grads
        best = _higher(best, kinds, f"{label[c]} backward")
    return best


def _higher(best: StepPeak, kinds: Mapping[K, int], at: str) -> StepPeak:
    total = sum(kinds.values())
    if total <= best.total:
        return best
    return StepPeak(total, at, {k: kinds.get(k, 0) for k in K if kinds.get(k, 0)})
