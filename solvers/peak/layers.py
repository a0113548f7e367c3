"""Plans mixed layer by layer: each repeated layer takes its decisions from a different plan.

Along the backward of a chain of layers, the memory at layer l's backward is roughly what no plan
changes (gradients of the layers done so far, the backward's own buffers), plus what the layers
before l saved (still waiting for their backward), plus l's own working set (its saved values and
what it recomputes). That is a sum over a prefix of the chain: Rockmate's and rotor's dynamic
program over the chain of blocks. Here:

* ``find_layers``: the repeated layers of the graph (the model's blocks, else
  ``solvers.symmetry``'s groups), each a list of values by position, positions that agree in op,
  bytes, role and saveability across the layers;
* the options: every distinct layer of the plans the solve has seen (the relaxation's at several
  budgets, min-cut's, checkpointing's, the search's), each with what the checkpoint-every-layer
  plan keeps in the layer, and each with the layer's output alone, so that a layer recomputes
  from its own input and the layers stay separate;
* each option's effect, measured by the exact simulation once, on one probe layer of the
  checkpoint-every-layer plan: the change of the recompute cost, of the layer's own backward peak,
  and of every later layer's (the bytes it holds); and again on the last layer, for the last;
* a dynamic program over the layers in forward order, its state the bytes held by the layers so far
  (rounded up), for the least cost whose modelled peak fits; its plan is simulated exactly and the
  program's budget bisected between where its plan fit and where it overshot; with all options,
  then with each group of plans' options on their own (``apart``).

The model is a guide: only plans the simulation says fit are returned.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..errors import PlanError
from ..liveness import MemoryCurve, simulate_plan
from ..problem import Plan, Problem, Role, Status, plan_from_saved
from .search import Judge

# at most this many options (distinct layers) are measured, the most frequent first
MAX_OPTIONS = 60
# at most this many options of the layer's own trade-off (``_nested_options``)
MAX_NESTED = 16
# the dynamic program's state: bytes held, in units of the budget / STATE_UNITS (rounded up)
STATE_UNITS = 4000
# solves of the dynamic program at budgets moved by what its plans miss the simulation by
RESOLVES = 10
MIN_LAYERS = 4
# shares of the time to the deadline by which the options' measurements at the probe layer, then
# at the last layer, stop: the rest is the dynamic program's (its plans each simulated)
PROBE_SHARE = 0.5
MEASURE_SHARE = 0.75


@dataclass(frozen=True)
class Layers:
    slots: tuple[tuple[str, ...], ...]  # per layer (forward order), its values by position
    layer_of: dict[str, int]  # every forward-side value from the first layer on -> its layer


def find_layers(problem: Problem) -> Layers | None:
    """The graph's repeated layers (at least ``MIN_LAYERS``), or None."""
    from ..symmetry import layer_segments

    found = layer_segments(problem, MIN_LAYERS)
    if found is None:
        return None
    segments, layer_of = found
    width = min(len(s) for s in segments)
    by_name = problem.by_name

    def label(v: str) -> tuple[object, ...]:
        node = by_name[v]
        return node.op, node.bytes, node.role, node.storage_id == v, problem.can_save(v)

    kept = [i for i in range(width) if len({label(s[i]) for s in segments}) == 1]
    if not kept:
        return None
    return Layers(tuple(tuple(s[i] for i in kept) for s in segments), layer_of)


def _layer_peaks(reads: dict[str, int], n_layers: int, curve: MemoryCurve) -> tuple[list[int], int]:
    """The most live bytes during each layer's backward (its recomputation included), and the
    forward's peak: one pass over the curve. ``reads``: ``_backward_layers``."""
    out = [0] * n_layers
    current, pending, forward = -1, 0, 0
    for phase, name, live in curve.steps:
        if phase != "backward":
            forward = max(forward, live)
            continue
        pending = max(pending, live)
        read = reads.get(name)
        if read is None:
            continue  # a recomputation: counted with the backward value it is made for
        if read >= 0:
            current = read
        if current >= 0:
            out[current] = max(out[current], pending)
        pending = 0
    return out, forward


def _backward_layers(problem: Problem, layers: Layers) -> dict[str, int]:
    """Per backward value, the last layer it reads from (-1: none)."""
    layer_of = layers.layer_of
    return {n.name: max((layer_of[u] for u in n.inputs if u in layer_of), default=-1)
            for n in problem.nodes if n.role is Role.BACKWARD}


@dataclass(frozen=True)
class _Option:
    positions: frozenset[int]
    cost: float  # change of the plan's recompute cost
    own: int  # change of the layer's own backward peak
    held: int  # change of the later layers' backward peaks and of the forward's peak


class _Chain:
    """Plans made of one option per layer over a base plan, and their simulation."""

    def __init__(self, problem: Problem, layers: Layers, base: frozenset[str]) -> None:
        self.problem, self.layers = problem, layers
        mapped = {v for s in layers.slots for v in s}
        self.fixed = frozenset(v for v in base if v not in mapped)
        self.base = [self.option_of(base, layer) for layer in range(len(layers.slots))]
        self.judge = Judge(problem, 0, None, math.inf, 0)  # for its closure on integer ids alone

    def option_of(self, saved: frozenset[str], layer: int) -> frozenset[int]:
        return frozenset(i for i, v in enumerate(self.layers.slots[layer]) if v in saved)

    def saved(self, choice: list[frozenset[int]]) -> set[str]:
        out = set(self.fixed)
        for layer, positions in enumerate(choice):
            out.update(self.layers.slots[layer][i] for i in positions)
        return out

    def run(self, choice: list[frozenset[int]]) -> tuple[Plan, MemoryCurve] | None:
        try:
            plan = plan_from_saved(self.problem, self.saved(choice), solver="layers",
                                   status=Status.HEURISTIC)
        except PlanError:
            return None
        return plan, simulate_plan(self.problem, plan.saved)

    def measured(self, choice: list[frozenset[int]]) -> tuple[float, MemoryCurve] | None:
        """A chain's recompute cost and simulation, without a plan (``plan_from_saved``'s closure
        took a fifth of a measurement at 70B; the cost is the same exact sum)."""
        closed = self.judge.close(self.saved(choice))
        if closed is None:
            return None
        return closed[2], simulate_plan(self.problem, closed[0])


def layer_plans(problem: Problem, layers: Layers, base: Iterable[str], plans: Iterable[Iterable[str]],
                peak_budget: int, budget: int | None = None, *, deadline: float,
                apart: Iterable[Iterable[Iterable[str]]] = ()) -> list[tuple[Plan, int]]:
    """Plans with one option per layer (see the module doc), each simulated, those that fit
    (the peak budget and the saved-bytes ``budget``) with their peaks. ``base``: the
    checkpoint-every-layer plan's saved set (each layer recomputes from its own input).
    ``apart``: groups of plans whose layers are also mixed among themselves only (the program
    is a model: one option that misleads it can spoil every plan it makes)."""
    frozen = [frozenset(saved) for saved in plans]
    groups = [[frozenset(saved) for saved in group] for group in apart]
    chain = _Chain(problem, layers, frozenset(base))
    n_layers = len(layers.slots)
    probe = n_layers // 2
    keep = chain.base[probe]  # what checkpointing keeps in a layer
    # of it, what the next layer reads (the layer's output): enough to keep the layers apart
    following = set(layers.slots[probe + 1]) if probe + 1 < n_layers else set()
    boundary = frozenset(i for i in keep
                         if any(u in following for u in problem.users[layers.slots[probe][i]]))

    def options_of(saved: frozenset[str]) -> list[frozenset[int]]:
        # with all that checkpointing keeps, and with the layer's output alone
        return [decided | kept for layer in range(n_layers)
                for decided in [chain.option_of(saved, layer)] for kept in (keep, boundary)]

    counts: Counter[frozenset[int]] = Counter()
    # the layer's own trade-off, measured before the plans' options: from what checkpointing
    # keeps, values saved back one at a time, the most recompute per byte first
    in_groups_first = _nested_options(problem, layers.slots[probe], keep)
    for saved in frozen:
        counts.update(options_of(saved))
    group_options = [[o for saved in group for o in options_of(saved)] for group in groups]
    for mine in group_options:
        counts.update(mine)
    ref = chain.run(chain.base)
    if ref is None:
        return []
    measure = _Measure(problem, layers, chain, probe, ref)
    # the groups' options first: each group's program needs all of its own
    in_groups = dict.fromkeys([*in_groups_first, *(o for mine in group_options for o in mine)])
    common = list(dict.fromkeys([*in_groups, *(p for p, _ in counts.most_common(MAX_OPTIONS))]))
    common = [p for p in common if p != keep][:max(MAX_OPTIONS + len(in_groups_first), len(in_groups))]
    # the measurements stop in time for the dynamic program's plans
    began = time.perf_counter()
    span = max(0.0, deadline - began)
    options = [_Option(keep, 0.0, 0, 0)] + measure.all(common, began + PROBE_SHARE * span)
    # the last layer's options measured there: their effect differs from the middle layer's
    at_last = _Measure(problem, layers, chain, n_layers - 1, ref)
    last_base = chain.base[n_layers - 1]
    last = [_Option(last_base, 0.0, 0, 0)] + at_last.all(
        [p for p in [keep] + common if p != last_base], began + MEASURE_SHARE * span)
    out: list[tuple[Plan, int]] = []
    _bisect(chain, measure, _pareto(options), _pareto(last), peak_budget, budget, deadline, out)
    for group_set in map(set, group_options):
        group_set |= {keep, last_base}
        _bisect(chain, measure, _pareto([o for o in options if o.positions in group_set]),
                _pareto([o for o in last if o.positions in group_set]), peak_budget, budget, deadline, out)
    return out


def _nested_options(problem: Problem, slot: tuple[str, ...], keep: frozenset[int]) -> list[frozenset[int]]:
    """Options from ``keep`` up: each saves one more of the layer's values than the last, the one
    that removes the most recompute (within the layer: its inputs from outside are at hand) per
    byte it adds, until nothing is left to remove. Budget-free: from one layer's structure."""
    index = {v: i for i, v in enumerate(slot)}
    by_name, reads = problem.by_name, problem.backward_reads

    def cost(saved: set[str]) -> float:
        done: set[str] = set()
        stack = [v for v in slot if v in reads and v not in saved]
        while stack:
            v = stack.pop()
            if v in done or v not in index:
                continue
            done.add(v)
            stack.extend(u for u in by_name[v].inputs if u not in saved and u not in done)
        return math.fsum(problem.recompute_cost_of(v) for v in done)  # exact: not by the set's order

    def storage_bytes(saved: set[str], v: str) -> int:
        storage = by_name[v].storage_id
        if not problem.counts_memory(storage) or any(by_name[u].storage_id == storage for u in saved):
            return 0
        return problem.storage_size.get(storage, 0)

    # moves: one value, or every view of one storage at once (saving the views a split or
    # unbind makes keeps their base and spares the split: no single view's move shows that)
    views: dict[str, list[str]] = {}
    for v in slot:
        if by_name[v].storage_id != v and problem.can_save(v):
            views.setdefault(by_name[v].storage_id, []).append(v)
    moves: list[tuple[str, ...]] = [(v,) for v in slot if problem.can_save(v) and problem.recompute_cost_of(v) > 0]
    moves += [tuple(m) for m in views.values() if len(m) > 1]
    current = {slot[i] for i in keep}
    now = cost(current)
    out: list[frozenset[int]] = []
    while now > 0 and len(out) < MAX_NESTED:
        best: tuple[float, int, tuple[str, ...]] | None = None
        for move in moves:
            if all(v in current for v in move):
                continue
            gain = now - cost(current | set(move))
            if gain > 1e-12 * now:
                added = storage_bytes(current, move[0])
                key = (-gain / max(added, 1), index[move[0]], move)
                if best is None or key < best:
                    best = key
        if best is None:
            break
        current.update(best[2])
        now = cost(current)
        out.append(frozenset(index[v] for v in current))
    return out


def _pareto(options: list[_Option]) -> list[_Option]:
    """The options no other beats on cost, own peak and bytes held."""
    return [o for o in options if not any(
        p is not o and p.cost <= o.cost and p.own <= o.own and p.held <= o.held
        and (p.cost, p.own, p.held) != (o.cost, o.own, o.held) for p in options)]


class _Measure:
    """Options' effects, each by one simulation with the option at the probe layer of the base."""

    def __init__(self, problem: Problem, layers: Layers, chain: _Chain, probe: int,
                 ref: tuple[Plan, MemoryCurve]) -> None:
        self.problem, self.layers, self.chain, self.probe = problem, layers, chain, probe
        self.ref_plan, ref_curve = ref
        self.reads = _backward_layers(problem, layers)
        self.ref_peaks, self.ref_forward = _layer_peaks(self.reads, len(layers.slots), ref_curve)

    def one(self, positions: frozenset[int]) -> _Option | None:
        choice = list(self.chain.base)
        choice[self.probe] = positions
        got = self.chain.measured(choice)
        if got is None:
            return None
        cost, curve = got
        peaks, forward = _layer_peaks(self.reads, len(self.layers.slots), curve)
        ref, probe = self.ref_peaks, self.probe
        later = [peaks[k] - ref[k] for k in range(probe + 1, len(ref))]
        held = max([forward - self.ref_forward] + later)
        return _Option(positions, cost - self.ref_plan.recompute_cost,
                       peaks[probe] - ref[probe], held)

    def all(self, candidates: list[frozenset[int]], deadline: float) -> list[_Option]:
        out = []
        for positions in candidates:
            if time.perf_counter() >= deadline:
                break
            option = self.one(positions)
            if option is not None:
                out.append(option)
        return out


def _bisect(chain: _Chain, measure: _Measure, options: list[_Option], last: list[_Option],
            peak_budget: int, budget: int | None, deadline: float,
            out: list[tuple[Plan, int]]) -> None:
    """The dynamic program's plans, its budget bisected between the highest whose plan fit and
    the lowest whose plan overshot (the model is not exact; it starts at the peak budget, moved
    by each plan's miss). Appends the plans that fit to ``out``."""
    unit = max(1, peak_budget // STATE_UNITS)
    target, fit_at, over_at = peak_budget, None, None
    # each chain simulated once: a chain the program returns again keeps its verdict
    seen: dict[tuple[frozenset[int], ...], tuple[Plan, MemoryCurve] | None] = {}
    for _ in range(RESOLVES):
        if time.perf_counter() >= deadline:
            break
        choice = _best_chain(options, last, measure.ref_peaks, measure.ref_forward, target, unit)
        again = choice is not None and tuple(choice) in seen
        if choice is not None and not again:
            seen[tuple(choice)] = chain.run(choice)
        got = None if choice is None else seen[tuple(choice)]
        fits = got is not None and got[1].peak <= peak_budget and (
            budget is None or got[0].saved_bytes <= budget)
        if fits and got is not None:
            if not again:
                out.append((got[0], got[1].peak))
            fit_at = target
        else:
            over_at = target
        if fit_at is not None and over_at is not None:
            if over_at - fit_at <= 2 * unit:
                break
            target = (fit_at + over_at) // 2
        elif got is not None:
            target += max(abs(peak_budget - got[1].peak), unit) * (1 if fits else -1)
        else:
            target += (1 if fits else -1) * max(unit, peak_budget // 50)


def _best_chain(options: list[_Option], last: list[_Option], ref_peaks: list[int], ref_forward: int,
                target: int, unit: int) -> list[frozenset[int]] | None:
    """The least-cost option per layer whose modelled peaks fit ``target``: layer l's backward at
    ``ref_peaks[l]`` + the bytes held by the layers before it + its own change; the forward's peak
    at ``ref_forward`` + the bytes held by all. The last layer takes its options from ``last``
    (measured there: its backward comes first, its values are still live from the forward).
    Each layer's step is one array operation over (states x options): at 80 layers a loop over
    them in Python took seconds per call."""
    # the states kept (bytes held so far in units, rounded up; ascending) and their costs; per
    # layer, for each state kept, the previous state's index and the option taken
    states, costs = np.zeros(1, dtype=np.int64), np.zeros(1)
    history: list[tuple[np.ndarray, np.ndarray]] = []
    tables = [options] * (len(ref_peaks) - 1) + [last]
    arrays = {id(t): (np.array([o.own for o in t], dtype=np.int64),
                      np.array([-(-o.held // unit) for o in t], dtype=np.int64),
                      np.array([o.cost for o in t], dtype=np.float64)) for t in (options, last)}
    for layer_peak, table in zip(ref_peaks, tables):
        own, held, cost = arrays[id(table)]
        room = target - layer_peak - states * unit
        # the moves in the order a loop over states, then options, meets them
        prev, option = np.nonzero(own[None, :] <= room[:, None])
        if not len(prev):
            return None
        nxt_s = states[prev] + held[option]
        nxt_c = costs[prev] + cost[option]
        first = _first_least(nxt_s, nxt_c)
        at = _cheaper_than_smaller(first, nxt_c[first])
        history.append((prev[at], option[at]))
        states, costs = nxt_s[at], nxt_c[at]
    fits = np.flatnonzero(ref_forward + states * unit <= target)
    if not len(fits):
        return None
    # the least cost, then the fewest bytes held
    index = int(fits[np.lexsort((states[fits], costs[fits]))[0]])
    choice: list[frozenset[int]] = []
    for (prev_of, option_of), table in zip(reversed(history), reversed(tables)):
        choice.append(table[int(option_of[index])].positions)
        index = int(prev_of[index])
    choice.reverse()
    return choice


def _first_least(state: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Per distinct state, ascending, the index of its least cost (the first among equal ones):
    by buckets over the states' range (a sort took most of the dynamic program's time)."""
    at = state - state.min()
    least = np.full(int(at.max()) + 1, np.inf)
    np.minimum.at(least, at, cost)
    ties = np.flatnonzero(cost == least[at])
    first = np.full(len(least), len(cost))
    np.minimum.at(first, at[ties], ties)
    return first[first < len(cost)]


def _cheaper_than_smaller(index: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Of states in ascending order, those that cost less (by more than 1e-15) than every state
    kept before them. Against the least cost of all before (a prefix minimum) unless a cost lies
    within the tolerance below it: then one by one, as the states kept decide there."""
    before = np.minimum.accumulate(np.r_[np.inf, cost[:-1]])
    if not np.any((cost < before) & (cost >= before - 1e-15)):
        return index[cost < before - 1e-15]
    kept, best = [], float("inf")
    for k, c in zip(index.tolist(), cost.tolist()):
        if c < best - 1e-15:
            kept.append(k)
            best = c
    return np.array(kept, dtype=np.int64)
