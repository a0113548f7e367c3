"""Repeated blocks read from the model's module paths: decoder layers, ResNet blocks, ViT blocks.

Every value carries the path of the module that made it (``Node.module``, a backward value its
forward value's) and the problem maps each module path to its class (``Problem.module_classes``).
Blocks are modules of one class at one depth of the module tree, each indexed in its parent
(``layers.0``, ``layers.1``, ... or ``encoder_layer_0``, ...), the indices under each parent
consecutive, at least two in all: a ``ModuleList`` or ``Sequential`` of one block class, or such
lists in several parents (a ResNet's stages). The outermost such set whose blocks run one after the
other in the forward is the model's blocks (so a layer's experts or heads never are); sets of
torch's own containers (``Sequential``: an EfficientNet's stages) only where no other class repeats.

A block's boundary is what enters it: the forward values made outside the block that it reads and
no other block reads -- a decoder layer's input hidden states. Values every layer reads (rotary
tables, masks) are context, not boundaries. After the last block, its exit: the values it hands to
the rest of the forward (the final hidden states). Saving every boundary and recomputing the rest
is ``torch.utils.checkpoint`` around each block.

Graphs without module paths (published graph files), or whose modules repeat nothing, have no
blocks: their checkpoints are guessed from the graph (``graph_boundaries`` below), their repeated
layers too (``solvers.symmetry``).
"""

from __future__ import annotations

import bisect
import difflib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, cast

from .problem import Problem, Role

# an indexed child: "3" (ModuleList, Sequential) or "encoder_layer_3" (a named Sequential);
# "layer1" or "fc2" are names, not indices
_INDEXED = re.compile(r"(.*[_-])?(\d+)")
_TORCH_CONTAINERS = "torch.nn.modules.container."


@dataclass(frozen=True)
class Blocks:
    paths: tuple[str, ...]  # each block's module path, in forward order
    module_class: str  # the blocks' class
    block_of: Mapping[str, int]  # value name -> its block, for the values made inside a block
    entries: tuple[tuple[str, ...], ...]  # per block, its boundary: the values entering it
    exit: tuple[str, ...]  # the values the last block hands to the rest of the forward
    span: tuple[int, int]  # node indices of the first block's first forward value, the last's last

    @property
    def boundaries(self) -> list[tuple[str, ...]]:
        """Checkpoint groups in forward order: each block's entry, then the last block's exit."""
        return [g for g in (*self.entries, self.exit) if g]

    def summary(self) -> str:
        cls = self.module_class.rsplit(".", 1)[-1]
        return f"{len(self.paths)} x {cls} ({self.paths[0]} .. {self.paths[-1]})"


def _containers(classes: Mapping[str, str]) -> list[list[str]]:
    """Sets of indexed modules of one class at one depth (each parent's indices consecutive, two
    or more in all): sets of torch's containers last, then outermost first, then the largest;
    each set in index order."""
    found: dict[tuple[int, str, str], dict[str, list[tuple[int, str]]]] = {}
    for path, cls in classes.items():
        parts = path.split(".")
        m = _INDEXED.fullmatch(parts[-1])
        if m is None:
            continue
        key = (len(parts), m.group(1) or "", cls)
        found.setdefault(key, {}).setdefault(".".join(parts[:-1]), []).append((int(m.group(2)), path))
    out = []
    for key, parents in found.items():
        members = []
        for children in parents.values():
            children.sort()
            if all(b[0] == a[0] + 1 for a, b in zip(children, children[1:])):
                members += [path for _, path in children]
        if len(members) >= 2:
            out.append((key[2].startswith(_TORCH_CONTAINERS), key[0], -len(members), members))
    return [members for *_, members in sorted(out)]


def _membership(problem: Problem, paths: list[str]) -> dict[str, int]:
    depth = paths[0].count(".") + 1
    which = {p: i for i, p in enumerate(paths)}
    out = {}
    for n in problem.nodes:
        if n.module:
            b = which.get(".".join(n.module.split(".")[:depth]))
            if b is not None:
                out[n.name] = b
    return out


def _in_sequence(problem: Problem, paths: list[str],
                 block_of: dict[str, int]) -> tuple[list[int], tuple[int, int]] | None:
    """The blocks' order in the forward and the node indices they span, or None if some block has
    no forward value or two blocks' forward values interleave (parallel branches, not a chain)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, n in enumerate(problem.nodes):
        b = block_of.get(n.name)
        if b is not None and n.role is Role.FORWARD:
            first.setdefault(b, i)
            last[b] = i
    if len(first) < len(paths):
        return None
    order = sorted(range(len(paths)), key=first.__getitem__)
    if any(last[a] >= first[b] for a, b in zip(order, order[1:])):
        return None
    return order, (first[order[0]], last[order[-1]])


def _entries(problem: Problem, block_of: Mapping[str, int], n_blocks: int) -> list[tuple[str, ...]]:
    """Per block, the forward values from outside it that it reads and no other block reads."""
    readers: dict[str, set[int]] = {}
    for n in problem.nodes:
        b = block_of.get(n.name)
        if b is None or n.role is Role.BACKWARD:
            continue
        for u in n.inputs:
            if block_of.get(u) != b and problem.by_name[u].role in (Role.FORWARD, Role.EITHER):
                readers.setdefault(u, set()).add(b)
    out: list[list[str]] = [[] for _ in range(n_blocks)]
    for u, blocks in readers.items():
        if len(blocks) == 1:
            out[next(iter(blocks))].append(u)
    index = problem.index
    return [tuple(sorted(e, key=index.__getitem__)) for e in out]


def _exit(problem: Problem, block_of: Mapping[str, int], last: int) -> tuple[str, ...]:
    """Values of the last block that forward values outside every block read."""
    out: set[str] = set()
    for n in problem.nodes:
        if n.name in block_of or n.role not in (Role.FORWARD, Role.EITHER):
            continue
        out.update(u for u in n.inputs if block_of.get(u) == last)
    return tuple(sorted(out, key=problem.index.__getitem__))


def find_blocks(problem: Problem) -> Blocks | None:
    """The model's repeated blocks (see the module doc), or None: no module paths, or no
    indexed modules of one class that run one after the other. Found once per problem and kept
    with it (checkpointing, symmetry and the layer mix all ask)."""
    return problem.derived("blocks.find_blocks", _find_blocks)


def _find_blocks(problem: Problem) -> Blocks | None:
    for paths in _containers(problem.module_classes):
        block_of = _membership(problem, paths)
        found = _in_sequence(problem, paths, block_of)
        if found is None:
            continue
        order, span = found
        paths = [paths[i] for i in order]
        rank = {old: new for new, old in enumerate(order)}
        block_of = {v: rank[b] for v, b in block_of.items()}
        return Blocks(paths=tuple(paths), module_class=problem.module_classes[paths[0]],
                      block_of=block_of, entries=tuple(_entries(problem, block_of, len(paths))),
                      exit=_exit(problem, block_of, len(paths) - 1), span=span)
    return None


def block_positions(problem: Problem, blocks: Blocks,
                    label: Callable[[str], Hashable]) -> list[list[str | None]]:
    """Per position of the most common kind of block (its forward-side values in graph order, told
    apart by ``label``), the value at that position in each block, None where a block lacks it.
    Other blocks are aligned to it by their longest matching runs (``difflib``): the first layer
    may hold values the others share with it (common subexpressions merged by the tracer)."""
    members: list[list[str]] = [[] for _ in blocks.paths]
    for n in problem.nodes:
        b = blocks.block_of.get(n.name)
        if b is not None and n.role in (Role.FORWARD, Role.EITHER):
            members[b].append(n.name)
    palette: dict[Hashable, int] = {}
    seqs = [[palette.setdefault(label(v), len(palette)) for v in m] for m in members]
    reference = Counter(tuple(s) for s in seqs).most_common(1)[0][0]
    rows: list[list[str | None]] = [[None] * len(members) for _ in reference]
    for b, seq in enumerate(seqs):
        if tuple(seq) == reference:
            for i, v in enumerate(members[b]):
                rows[i][b] = v
            continue
        match = difflib.SequenceMatcher(None, reference, seq, autojunk=False)
        for i, j, size in match.get_matching_blocks():
            for k in range(size):
                rows[i + k][b] = members[b][j + k]
    return rows


def block_segments(problem: Problem, blocks: Blocks,
                   label: Callable[[str], Hashable]) -> tuple[list[list[str]], dict[str, int]]:
    """Per block, its values at the positions every block has (``block_positions``), in the same
    order; and every forward-side value from the first block on -> its block, values between
    blocks and after the last (the loss head) going to the block before them."""
    rows = [cast("list[str]", r) for r in block_positions(problem, blocks, label) if None not in r]
    segments = [[r[b] for r in rows] for b in range(len(blocks.paths))]
    first: dict[int, int] = {}  # block -> its first forward value (in block order: find_blocks)
    for i, n in enumerate(problem.nodes):
        b = blocks.block_of.get(n.name)
        if b is not None and n.role is Role.FORWARD:
            first.setdefault(b, i)
    starts = [first[b] for b in range(len(blocks.paths))]
    layer_of: dict[str, int] = {}
    for i, n in enumerate(problem.nodes):
        if n.role in (Role.FORWARD, Role.EITHER) and i >= starts[0]:
            b = blocks.block_of.get(n.name)
            layer_of[n.name] = b if b is not None else bisect.bisect_right(starts, i) - 1
    return segments, layer_of


# ---- checkpoint boundaries: from the blocks, else guessed from the graph ------------------------

# cut widths (times the narrowest) tried in turn for block boundaries; 2x takes in both residual
# values of a pre-norm transformer block (after attention and after the MLP)
NARROW_CUT_WIDTHS = (1.0, 1.5, 2.0, 3.0)


def boundary_groups(problem: Problem) -> tuple[list[tuple[str, ...]], str]:
    """Checkpoint groups in forward order (saving a group is checkpointing at it), and how they
    were found. ``"modules"``: the model's repeated blocks (``solvers.blocks``), a group per block
    (the values entering it: a decoder layer's input hidden states) and the last block's exit.
    Without module paths or blocks, one value per group from the graph (``graph_boundaries``)."""
    blocks = find_blocks(problem)
    if blocks is not None:
        groups = [tuple(v for v in g if problem.can_save(v)) for g in blocks.boundaries]
        groups = [g for g in groups if g]
        if groups:
            return groups, "modules"
    bounds, mode = graph_boundaries(problem)
    return [(b,) for b in bounds], mode


def block_boundaries(problem: Problem) -> tuple[list[str], str]:
    """Candidate checkpoints in topological order, and how they were found (``boundary_groups``,
    flattened)."""
    groups, mode = boundary_groups(problem)
    return [v for g in groups for v in g], mode


def graph_boundaries(problem: Problem) -> tuple[list[str], str]:
    """Candidate checkpoints guessed from the graph alone, in topological order, and how.

    ``"dominators"``: the forward values every forward path from the inputs to the loss passes
    through (the loss: the forward value with no forward users and the most ancestors) -- the
    outputs of the blocks ``torch.utils.checkpoint`` users wrap. With fewer than two of those,
    ``"narrow cuts"``: the values crossing the forward's narrowest cuts
    (``narrow_cut_values``). When there are none either, ``"topological"``: every
    saveable, recomputable forward value in topological order, so that "every k-th" spaces
    checkpoints evenly in execution order.
    """
    import networkx as nx

    fwd = list(problem.candidates)
    if not any(n.role is Role.FORWARD for n in fwd):
        return [], "none"
    g = nx.DiGraph()
    source = ("__source__",)
    g.add_node(source)
    for n in fwd:
        g.add_node(n.name)
        if not n.inputs:
            g.add_edge(source, n.name)
        for i in n.inputs:
            g.add_edge(i, n.name)
    # ancestor sets as int bitsets (one bit per value): n^2 bits, not n^2 set entries
    anc: dict[str, int] = {}
    for n in fwd:
        bits = 0
        for i in n.inputs:
            bits |= anc[i] | (1 << problem.index[i])
        anc[n.name] = bits
    ancestors = {k: v.bit_count() for k, v in anc.items()}
    sinks = [n for n in fwd if n.role is Role.FORWARD
             and not any(problem.by_name[u].role is not Role.BACKWARD
                         for u in problem.users[n.name])]
    # a region of a graph break that ends in no loss has no sink: no dominators then, the cuts decide
    loss = max(sinks, key=lambda n: (ancestors[n.name], problem.index[n.name])).name if sinks else None
    idom = nx.immediate_dominators(g, source)
    chain: list[str] = []
    v = idom.get(loss) if loss is not None else None
    while v is not None and v != source:
        chain.append(v)
        nxt = idom[v]
        v = None if nxt == v else nxt
    chain.reverse()
    bounds = [b for b in chain
              if problem.by_name[b].role in (Role.FORWARD, Role.EITHER) and problem.can_save(b)]
    if len(bounds) > 1:
        return bounds, "dominators"
    # Graph inputs enter every block (a transformer's weights, its rotary tables), so paths from
    # them bypass the blocks' outputs and nothing inside dominates: the values crossing the
    # forward's narrowest cuts (the residual stream) are the block boundaries then
    # the narrowest cuts may all sit at one end (a big model's loss head: a cut there is narrower
    # than the residual stream); widen until the boundaries spread over the forward
    forward_pos = {n.name: i for i, n in enumerate(fwd)}
    for widest in NARROW_CUT_WIDTHS:
        narrow = [v for v in narrow_cut_values(problem, widest, largest_only=widest > 1.0)
                  if problem.can_save(v) and v != loss]
        points = [0] + sorted(forward_pos[v] for v in narrow) + [len(fwd)]
        if len(narrow) > 1 and max(b - a for a, b in zip(points, points[1:])) <= len(fwd) // 2:
            return narrow, "narrow cuts"
    if bounds:
        return bounds, "dominators"
    topo = [n.name for n in fwd if n.role is Role.FORWARD and n.name != loss
            and problem.can_save(n.name) and problem.can_recompute(n.name)]
    return topo, "topological"


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
        starts: dict[int, list[Any]] = {}
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
