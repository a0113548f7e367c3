"""Published training graphs (Checkmate / Moccasin) as problems of this project's model.

The graphs are networkx node-link JSON: ``nodes[i] = {id, name, backward, cost_cpu, cost_ram}`` and
``links = [{source, target}]`` (data dependencies). They are loaded as data only:

* forward nodes (``backward: false``) are ``Role.FORWARD`` candidates: each can be saved
  (``cost_ram`` bytes) or recomputed in the backward (``cost_cpu``);
* backward nodes are ``Role.BACKWARD``: they always run; a forward value a backward node reads
  must be saved or recomputed;
* ``cost_ram`` -> ``Node.bytes``, ``cost_cpu`` -> ``Node.cost`` (the profiler's units, not seconds:
  only ratios such as the compute overhead are meaningful), links -> ``Node.inputs``.

Source nodes. These graphs have no node for the data batch: the first layer (``block1_conv1``,
``conv1_pad``, ...) has no inputs and reads the batch implicitly. Such a forward node with no
inputs stays ``Role.FORWARD`` with ``inputs=()``: recomputing it needs nothing the plan has to keep
(the batch is the caller's, always resident, as in Checkmate's model, which also lets the first
layer be recomputed) and costs its ``cost_cpu``. No name-based guessing of "the data input" is
done: where a graph does carry an explicit input node it typically has zero ``cost_cpu``, and a zero-cost
forward node with no inputs behaves like a graph input for the exact solvers (recomputing it is
free, so no optimal plan pays to save it), while the save-all reference still counts its bytes
like Checkmate's no-recomputation schedule does.

Order. ``Problem`` needs a topological order; nodes are ordered by Kahn's algorithm with ties
broken by position in the file, so a file already in topological order (all published ones are:
ids ascend along every link) keeps its order exactly, and any other acyclic file still loads.
"""

from __future__ import annotations

import heapq
import json
import math
from pathlib import Path
from typing import Any

from solvers.baselines import save_all
from solvers.errors import ProblemError
from solvers.problem import Node, Problem, Role

from ..errors import GraphLoadError

_FIELDS = ("id", "name", "backward", "cost_cpu", "cost_ram")
_SUFFIX = "_train_nx"


def graph_name(path: str | Path) -> str:
    """Short name of a graph file: ``VGG16_256_train_nx.json`` -> ``VGG16_256``."""
    stem = Path(path).stem
    return stem[: -len(_SUFFIX)] if stem.endswith(_SUFFIX) else stem


def graph_files(directory: str | Path) -> list[Path]:
    """The ``*.json`` graphs in ``directory``, smallest file first (then by name).

    File size orders the published graphs exactly as their node counts do, without parsing them
    (a broken file should fail when loaded, not when listed).
    """
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"graph directory {d} does not exist")
    return sorted(d.glob("*.json"), key=lambda p: (p.stat().st_size, p.name))


def _describe(node: Any) -> str:
    if isinstance(node, dict):
        return f"node id={node.get('id')!r} name={node.get('name')!r}"
    return f"node {node!r}"


def _number(value: Any, what: str, where: str, *, integer: bool) -> float | int:
    """A finite, non-negative number (bools and strings are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GraphLoadError(f"{where}: {what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise GraphLoadError(f"{where}: {what} must be finite, got {value!r}")
    if value < 0:
        raise GraphLoadError(f"{where}: {what} must be >= 0, got {value!r}")
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise GraphLoadError(f"{where}: {what} must be a whole number of bytes, got {value!r}")
        return int(value)
    return float(value)


def _find_cycle(remaining: set[Any], succ: dict[Any, list[Any]]) -> list[Any]:
    """One cycle among ``remaining`` (every node left after Kahn's algorithm lies on or after one)."""
    color: dict[Any, int] = {}
    for root in sorted(remaining, key=str):
        if root in color:
            continue
        path: list[Any] = []
        stack: list[tuple[Any, int]] = [(root, 0)]
        while stack:
            v, i = stack.pop()
            if i == 0:
                color[v] = 1
                path.append(v)
            nxt = [w for w in succ[v] if w in remaining]
            if i < len(nxt):
                stack.append((v, i + 1))
                w = nxt[i]
                if color.get(w) == 1:
                    return path[path.index(w):] + [w]
                if w not in color:
                    stack.append((w, 0))
            else:
                color[v] = 2
                path.pop()
    return []


def load_graph(path: str | Path) -> Problem:
    """Load a node-link training graph as a ``Problem`` (see the module docstring for the mapping).

    Raises GraphLoadError for malformed files: bad JSON, missing fields, non-numeric or negative
    costs and sizes, duplicate ids, links to unknown ids, cycles, and backward nodes feeding
    forward ones. OSError (e.g. a missing file) passes through.
    """
    path = Path(path)
    where_file = str(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GraphLoadError(f"{where_file}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise GraphLoadError(f"{where_file}: expected a node-link object with a 'nodes' list")
    links = data.get("links", data.get("edges"))  # networkx >= 3.4 may write "edges"
    if not isinstance(links, list):
        raise GraphLoadError(f"{where_file}: expected a 'links' list of {{source, target}} objects")

    raw = _read_nodes(data["nodes"], where_file)
    preds, succ = _read_links(links, raw, where_file)
    order = _topological_order(raw, preds, succ, where_file)
    names = _unique_names(raw)
    nodes = []
    for nid in order:
        r = raw[nid]
        backward = r["node"]["backward"]
        nodes.append(Node(
            name=names[nid],
            role=Role.BACKWARD if backward else Role.FORWARD,
            inputs=tuple(names[p] for p in preds[nid]),
            bytes=r["bytes"],
            cost=r["cost"],
            op="backward" if backward else "forward",
            module=str(nid),  # the file's id, for reports and for mapping plans back
        ))
    try:
        return Problem(nodes=tuple(nodes), name=graph_name(path))
    except ProblemError as exc:  # the checks above should make this unreachable
        raise GraphLoadError(f"{where_file}: {exc}") from exc


def _read_nodes(nodes: list[Any], where_file: str) -> dict[Any, dict[str, Any]]:
    """id -> the node's checked fields (``node``, ``pos``, ``where``, ``cost``, ``bytes``), in file order."""
    raw: dict[Any, dict[str, Any]] = {}
    for pos, node in enumerate(nodes):
        where = f"{where_file}: {_describe(node)} (nodes[{pos}])"
        if not isinstance(node, dict):
            raise GraphLoadError(f"{where}: expected an object with fields {', '.join(_FIELDS)}")
        missing = [f for f in _FIELDS if f not in node]
        if missing:
            raise GraphLoadError(f"{where}: missing field(s) {', '.join(missing)}")
        nid = node["id"]
        if isinstance(nid, bool) or not isinstance(nid, (int, str)):
            raise GraphLoadError(f"{where}: id must be an integer or a string")
        if nid in raw:
            raise GraphLoadError(f"{where}: duplicate id (also {_describe(raw[nid]['node'])})")
        if not isinstance(node["name"], str) or not node["name"]:
            raise GraphLoadError(f"{where}: name must be a non-empty string")
        if not isinstance(node["backward"], bool):
            raise GraphLoadError(f"{where}: backward must be true or false, got {node['backward']!r}")
        raw[nid] = {
            "node": node, "pos": pos, "where": where,
            "cost": _number(node["cost_cpu"], "cost_cpu", where, integer=False),
            "bytes": _number(node["cost_ram"], "cost_ram", where, integer=True),
        }
    return raw


def _read_links(links: list[Any], raw: dict[Any, dict[str, Any]], where_file: str
                ) -> tuple[dict[Any, list[Any]], dict[Any, list[Any]]]:
    """Each node's predecessors and successors, checked: known ids, no self-links, no backward
    node feeding a forward one; duplicate links are one dependency."""
    preds: dict[Any, list[Any]] = {nid: [] for nid in raw}
    succ: dict[Any, list[Any]] = {nid: [] for nid in raw}
    for k, link in enumerate(links):
        if not isinstance(link, dict) or "source" not in link or "target" not in link:
            raise GraphLoadError(f"{where_file}: links[{k}] must be an object with source and target")
        s, t = link["source"], link["target"]
        for end, other, role in ((s, t, "source"), (t, s, "target")):
            if end not in raw:
                near = f" (the other end is {_describe(raw[other]['node'])})" if other in raw else ""
                raise GraphLoadError(
                    f"{where_file}: links[{k}] {role} {end!r} is not the id of any node{near}")
        if s == t:
            raise GraphLoadError(f"{raw[s]['where']}: links to itself (a cycle)")
        if raw[s]["node"]["backward"] and not raw[t]["node"]["backward"]:
            raise GraphLoadError(
                f"{raw[t]['where']}: forward node reads backward "
                f"{_describe(raw[s]['node'])} (links[{k}]); forward nodes must not depend on the backward")
        if s not in preds[t]:
            preds[t].append(s)
            succ[s].append(t)
    return preds, succ


def _topological_order(raw: dict[Any, dict[str, Any]], preds: dict[Any, list[Any]],
                       succ: dict[Any, list[Any]], where_file: str) -> list[Any]:
    """Kahn's algorithm, ties by file position: a file already in topological order keeps it. A
    cycle is a GraphLoadError naming its nodes."""
    indeg = {nid: len(p) for nid, p in preds.items()}
    heap = [(raw[nid]["pos"], nid) for nid, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order: list[Any] = []
    while heap:
        _, v = heapq.heappop(heap)
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (raw[w]["pos"], w))
    if len(order) < len(raw):
        left = set(raw) - set(order)
        cycle = _find_cycle(left, succ)
        shown = " -> ".join(_describe(raw[v]["node"]) for v in cycle) or \
            ", ".join(_describe(raw[v]["node"]) for v in sorted(left, key=lambda v: raw[v]["pos"])[:5])
        raise GraphLoadError(f"{where_file}: the graph has a cycle: {shown}")
    return order


def _unique_names(raw: dict[Any, dict[str, Any]]) -> dict[Any, str]:
    """Node names must be unique in a Problem: the file's names, repeats disambiguated by id."""
    counts: dict[str, int] = {}
    for r in raw.values():
        counts[r["node"]["name"]] = counts.get(r["node"]["name"], 0) + 1
    return {nid: (r["node"]["name"] if counts[r["node"]["name"]] == 1 else f"{r['node']['name']}#{nid}")
            for nid, r in raw.items()}


def no_recompute_saved_bytes(problem: Problem) -> int:
    """Saved bytes of the save-all plan: every forward value the backward reads, each once.

    The reference for budget fractions (``m`` x this), as Checkmate's no-recomputation schedule.
    """
    return save_all(problem).saved_bytes


def total_cost(problem: Problem) -> float:
    """Forward plus backward ``cost_cpu`` of one training step without recomputation."""
    return sum(n.cost for n in problem.nodes)


def compute_overhead_percent(problem: Problem, recompute_cost: float) -> float:
    """Recompute cost as a percentage of the step's forward + backward cost."""
    total = total_cost(problem)
    return 100.0 * recompute_cost / total if total > 0 else 0.0
