"""Repeated layers: values that play the same part in identical layer subgraphs.

Transformer and ResNet training graphs repeat one block many times, in the same order each time,
so their decisions repeat too. Where the model's blocks are known from its module paths
(``solvers.blocks``), they are the layers: their values are aligned position by position by what
a plan cares about (the labels below), and each position across the layers is a group. Without
module paths (graph files), the layers are guessed from the graph, in two steps:

* every value gets a colour from what a plan cares about (role, op, bytes, storage size,
  recompute cost, bans, whether it is a view, whether the backward reads or returns it), refined
  a few rounds with the colours of its inputs (in argument order) and of its users (1-dimensional
  Weisfeiler-Leman). A few rounds give local context only: refining to the fixpoint would tell
  every layer apart by its distance from the ends of the graph.
* the block's length P in graph order is the most common distance between consecutive values of
  one colour (forward and backward blocks may differ: the few most common distances are used).
  Values P apart in graph order with the same colour are the same position in consecutive
  layers; chained together they form the groups.

Used by ``solvers.mip`` for ``symmetry="tie"`` (one decision per group: a smaller, restricted
problem solved exactly) and ``symmetry="warm"`` (its plan warm-starts the full problem).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

from .blocks import block_positions, block_segments, find_blocks
from .disjoint_sets import DisjointSets
from .problem import Problem, Role

DEFAULT_ROUNDS = 2  # local context: tells positions inside a block apart, not blocks


@dataclass(frozen=True)
class Symmetry:
    groups: list[list[str]]  # candidate values with one colour (two or more members, graph order)
    num_candidates: int
    covered: int  # candidates in some group
    layers: int  # the most common group size: how many times the repeated block occurs

    def summary(self) -> str:
        return (f"{len(self.groups)} groups cover {self.covered} of {self.num_candidates} values "
                f"(block repeated {self.layers}x)")


def _label(problem: Problem, name: str) -> tuple[object, ...]:
    node = problem.by_name[name]
    g = node.storage_id
    view_of = next((i for i, u in enumerate(node.inputs)
                    if problem.by_name[u].storage_id == g), -1) if g != name else -2
    return (node.role.value, node.op, node.bytes, problem.storage_size[g], f"{node.cost:.9g}",
            node.banned, node.must_recompute, node.saveable, view_of, len(node.inputs),
            name in problem.required, name in problem.forward_outputs,
            name in problem.backward_outputs, problem.counts_memory(g))


def find_repeated(problem: Problem, rounds: int = DEFAULT_ROUNDS, max_periods: int = 4) -> Symmetry:
    """Groups of candidate values that repeated layers make interchangeable (see the module doc)."""
    blocks = find_blocks(problem)
    if blocks is not None:
        rows = block_positions(problem, blocks, lambda v: _label(problem, v))
        groups = [g for g in ([v for v in r if v is not None] for r in rows) if len(g) > 1]
        if groups:
            return _symmetry(problem, groups)
    names = [n.name for n in problem.nodes]
    palette: dict[tuple[object, ...], int] = {}
    colour = {v: palette.setdefault(_label(problem, v), len(palette)) for v in names}
    by_name, users = problem.by_name, problem.users
    for _ in range(rounds):
        palette = {}
        colour = {v: palette.setdefault((colour[v], tuple(colour[u] for u in by_name[v].inputs),
                                         tuple(sorted(colour[w] for w in users[v]))), len(palette))
                  for v in names}
    seq = [colour[v] for v in names]
    last: dict[int, int] = {}
    gaps: Counter[int] = Counter()
    for i, c in enumerate(seq):
        if c in last:
            gaps[i - last[c]] += 1
        last[c] = i
    top = gaps.most_common(max_periods)
    periods = [p for p, count in top if count >= max(2, top[0][1] // 4)] if top else []
    sets = DisjointSets(len(names))
    for period in periods:
        for i in range(len(seq) - period):
            if seq[i] == seq[i + period]:
                sets.union(i, i + period)
    members: dict[int, list[str]] = {}
    for i, node in enumerate(problem.nodes):
        if node.role in (Role.FORWARD, Role.EITHER):
            members.setdefault(sets.find(i), []).append(node.name)
    return _symmetry(problem, [g for g in members.values() if len(g) > 1])


def _symmetry(problem: Problem, groups: list[list[str]]) -> Symmetry:
    sizes = Counter(len(g) for g in groups)
    layers = max(sizes, key=lambda k: (sizes[k], k)) if sizes else 1
    return Symmetry(groups=groups, num_candidates=len(problem.candidates),
                    covered=sum(len(g) for g in groups), layers=layers)


def layer_segments(problem: Problem, min_layers: int) -> tuple[list[list[str]], dict[str, int]] | None:
    """Per repeated layer, its forward-side values in graph order, and each forward-side value from
    the first layer on -> its layer (values between layers and after the last: the layer before);
    None with fewer than ``min_layers`` layers. The layers: the model's blocks, else the layers
    ``find_repeated`` finds, each starting at the first value of the earliest group with one
    member per layer."""
    blocks = find_blocks(problem)
    if blocks is not None:
        if len(blocks.paths) < min_layers:
            return None
        return block_segments(problem, blocks, lambda v: _label(problem, v))
    sym = find_repeated(problem)
    n_layers = sym.layers
    if n_layers < min_layers:
        return None
    index = problem.index
    starts = min(([index[v] for v in g] for g in sym.groups if len(g) == n_layers), key=lambda m: m[0])
    segments: list[list[str]] = [[] for _ in range(n_layers)]
    layer_of: dict[str, int] = {}
    for i, n in enumerate(problem.nodes):
        if n.role in (Role.FORWARD, Role.EITHER) and i >= starts[0]:
            layer = bisect.bisect_right(starts, i) - 1
            segments[layer].append(n.name)
            layer_of[n.name] = layer
    return segments, layer_of
