"""A step's root read off its whole graph: under per-layer compile (each layer compiled on its own,
the rest run eagerly), the step is the root's part before the layers, the layers, and the root's
part after them. ``root_parts`` cuts those two parts out of the step captured as one graph, each
a problem of its own whose boundary (what it reads from the layers, what they read from it) is
its inputs and outputs, as ``solvers.step`` expects of a graph.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Collection

from .baselines import _walk
from .errors import ProblemError
from .problem import Node, Problem, Role


def eager_saved(problem: Problem) -> frozenset[str]:
    """What eager autograd saves: every forward value the backward reads; values only the
    backward needs (``either``) run there, from saved inputs. The plan of a part run eagerly."""
    return frozenset(_walk(problem, lambda v: problem.by_name[v].role is not Role.EITHER))


def sub_problem(problem: Problem, names: Collection[str], name: str) -> Problem:
    """The values ``names`` as a problem of their own: what they read from the other values
    becomes inputs (a view's base too), what the others read from them outputs (a forward value
    a forward output, a backward value a gradient)."""
    keep = set(names)
    by = problem.by_name
    boundary: set[str] = set()
    for v in keep:
        n = by[v]
        boundary.update(u for u in n.inputs if u not in keep)
        if n.storage_id not in keep:
            boundary.add(n.storage_id)
    boundary -= keep
    read_outside: set[str] = set()
    for n in problem.nodes:
        if n.name not in keep:
            read_outside.update(u for u in n.inputs if u in keep)
    nodes: list[Node] = []
    for n in problem.nodes:  # inputs first (graph order among them), then the part in graph order
        if n.name in boundary:
            nodes.append(Node(n.name, Role.INPUT, bytes=problem.storage_size[n.storage_id], op=n.op,
                              module=n.module))
    for n in problem.nodes:
        if n.name in keep:
            alloc = n.allocated_by if n.allocated_by in keep else None
            nodes.append(replace(n, allocated_by=alloc))
    present = keep | boundary
    fwd_out = {v for v in read_outside if by[v].role is not Role.BACKWARD} | (problem.forward_outputs & keep)
    bwd_out = {v for v in read_outside if by[v].role is Role.BACKWARD} | (problem.backward_outputs & keep)
    storages = {by[v].storage_id for v in keep}
    params = tuple(replace(p, grad=p.grad if p.grad in keep else None) for p in problem.parameters
                   if p.node in present)
    return Problem(tuple(nodes), required=frozenset(problem.required & keep),
                   storage_bytes={k: v for k, v in problem.storage_bytes.items() if k in storages},
                   count_input_bytes=problem.count_input_bytes, name=name,
                   forward_outputs=frozenset(fwd_out), backward_outputs=frozenset(bwd_out),
                   module_classes=problem.module_classes, parameters=params,
                   ban_reasons={k: v for k, v in problem.ban_reasons.items() if k in keep})


def layer_values(problem: Problem, path: str) -> set[str]:
    """The values made under module ``path`` (``model.layers``: every layer's)."""
    prefix = path.rstrip(".") + "."
    return {n.name for n in problem.nodes if n.module.startswith(prefix) and n.role is not Role.INPUT}


def root_parts(problem: Problem, path: str) -> tuple[Problem, Problem]:
    """The root's part before the layers under ``path`` and after them: forward values by their
    place around the layers' forward values (root values between two layers go to the part
    before), backward values around the layers' backward values (the part after the layers runs
    its backward first), an ``either`` value with its first reader. Backward values between
    the layers' first and last backward values belong to the layers (the gradient sums AOTAutograd
    writes for the residual stream carry no module): left out."""
    inside = layer_values(problem, path)
    if not inside:
        paths = sorted({n.module.rsplit(".", 1)[0] for n in problem.nodes if n.module})[:8]
        raise ProblemError(f"no value of the step is made under module path {path!r} (module paths there: "
                           f"{', '.join(paths)}); give the path of the module list holding the layers")
    index, by = problem.index, problem.by_name
    fwd = [index[v] for v in inside if by[v].role is Role.FORWARD]
    bwd = [index[v] for v in inside if by[v].role is Role.BACKWARD]
    if not bwd:
        raise ProblemError(f"the layers under {path!r} have no backward values: nothing to plan")
    last_fwd, first_bwd, last_bwd = max(fwd, default=-1), min(bwd), max(bwd)
    part: dict[str, str] = {}
    for n in problem.nodes:
        i = index[n.name]
        if n.name in inside or n.role in (Role.INPUT, Role.EITHER):
            continue
        if n.role is Role.FORWARD:
            part[n.name] = "after" if i > last_fwd else "before"
        elif i < first_bwd:
            part[n.name] = "after"
        elif i > last_bwd:
            part[n.name] = "before"
    for n in reversed(problem.nodes):  # an either value goes with its first reader in the root
        if n.role is Role.EITHER and n.name not in inside:
            readers = [part[u] for u in problem.users[n.name] if u in part]
            part[n.name] = readers[0] if readers else "before"
    before = [n.name for n in problem.nodes if part.get(n.name) == "before"]
    after = [n.name for n in problem.nodes if part.get(n.name) == "after"]
    return (sub_problem(problem, before, f"{problem.name}: before {path}"),
            sub_problem(problem, after, f"{problem.name}: after {path}"))
