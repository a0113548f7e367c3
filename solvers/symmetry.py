"""Repeated layers: values that play the same part in identical layer subgraphs.

Transformer and ResNet training graphs repeat one block many times, in the same order each time,
so their decisions repeat too. Detection, in two steps:

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

from collections import Counter
from dataclasses import dataclass

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


def _label(problem: Problem, name: str) -> tuple:
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
    names = [n.name for n in problem.nodes]
    palette: dict[tuple, int] = {}
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
    groups = [g for g in members.values() if len(g) > 1]
    sizes = Counter(len(g) for g in groups)
    layers = max(sizes, key=lambda k: (sizes[k], k)) if sizes else 1
    return Symmetry(groups=groups, num_candidates=len(problem.candidates),
                    covered=sum(len(g) for g in groups), layers=layers)
