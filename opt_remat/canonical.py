"""Canonical identity of a joint graph's values, so that plans map value for value between captures.

A value's id is a hash of what it is: its op, its constant arguments, its type (dtype, shape, strides,
device) and its inputs' ids. Graph inputs are keyed by role, not position: a parameter or buffer by
its name in the model, a user input by its argument name, a tangent by its position among the
forward's outputs. Trace order and FX names do not enter, so the same step captured with fake tensors,
by ``torch.compile`` with another backend, or in another process gets the same ids.
"""

from __future__ import annotations

import hashlib
import json
import re
import types
from typing import Any, Sequence

import torch
import torch.fx as fx

ID_CHARS = 16


def clean_source(name: str) -> str:
    """dynamo's ``L['self']._modules['layers']._modules['0']._parameters['weight']`` -> ``layers.0.weight``."""
    s = re.sub(r"^L\['self'\]", "", name)
    s = re.sub(r"\._(?:modules|parameters|buffers)\['([^']*)'\]", r".\1", s)
    s = re.sub(r"\['([^']*)'\]", r".\1", s)
    s = re.sub(r"\[(\d+)\]", r".\1", s)
    return s.lstrip(".").removeprefix("L.")


def input_roles(gm: fx.GraphModule) -> list[str]:
    """The role of each input of a dynamo graph: ``param NAME``, ``buffer NAME`` or ``input NAME``."""
    roles = []
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        arg = node.meta.get("grapharg")
        name = getattr(getattr(arg, "source", None), "name", None)
        text = name if isinstance(name, str) else None
        if text is None:
            roles.append(f"input #{i}")
        elif "._parameters[" in text:
            roles.append("param " + clean_source(text))
        elif "._buffers[" in text:
            roles.append("buffer " + clean_source(text))
        else:
            roles.append("input " + clean_source(text))
    return roles


def type_text(val: Any) -> str:
    """What a value is, for people: ``bf16[4, 64, 128]``, ``sym``, ``tuple(3)``."""
    if isinstance(val, torch.Tensor):
        dtype = str(val.dtype).removeprefix("torch.")
        dev = "" if val.device.type == "cpu" else f"@{val.device.type}"
        return f"{dtype}{list(val.shape)}{dev}"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym {val}"
    if isinstance(val, (list, tuple)):
        return f"tuple({', '.join(type_text(v) for v in val)})"
    return type(val).__name__ if val is not None else "none"


def _type_key(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return [type_text(val), [str(s) for s in val.stride()]]
    if isinstance(val, (list, tuple)):
        return [_type_key(v) for v in val]
    return type_text(val)


def _arg_key(arg: Any, ids: dict[fx.Node, str]) -> Any:
    if isinstance(arg, fx.Node):
        return ["%", ids[arg]]
    if isinstance(arg, (list, tuple)):
        return [_arg_key(a, ids) for a in arg]
    if isinstance(arg, dict):
        return [[str(k), _arg_key(v, ids)] for k, v in sorted(arg.items(), key=lambda kv: str(kv[0]))]
    if isinstance(arg, float):
        return repr(arg)  # nan and inf
    if arg is None or isinstance(arg, (bool, int, str)):
        return arg
    return str(arg)  # dtypes, devices, layouts, ops


def _target_text(target: Any) -> str:
    """An op's name; a plain function's by module and name (its str() holds a memory address)."""
    if not isinstance(target, types.FunctionType):
        return str(target)
    return f"{getattr(target, '__module__', '')}.{target.__qualname__}"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()[:ID_CHARS]


def placeholder_role(node: fx.Node, index: int, roles: Sequence[str] | None, n_tangent: int) -> str:
    """A joint-graph input's role: the dynamo input it came from, or the tangent's position."""
    name = node.name
    if name.startswith("primals_"):
        if roles is not None and index < len(roles):
            return roles[index]
        return f"primal #{index}"
    if name.startswith("tangents_"):
        return f"tangent #{n_tangent}"
    return f"placeholder {name}"  # e.g. the backward's rng seeds: named by AOTAutograd, not by order


def canonical_values(gm: fx.GraphModule, roles: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per node (graph order, output excluded): ``name``, canonical ``id``, ``op``, ``type`` and the
    graph-order indices of its ``inputs``. Structurally equal values (rare after CSE) are told apart
    by their rank among equals in graph order."""
    ids: dict[fx.Node, str] = {}
    taken: dict[str, int] = {}
    index: dict[fx.Node, int] = {}
    values: list[dict[str, Any]] = []
    n_primal = n_tangent = 0
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        val = node.meta.get("val")
        if node.op == "placeholder":
            role = placeholder_role(node, n_primal, roles, n_tangent)
            n_primal += node.name.startswith("primals_")
            n_tangent += node.name.startswith("tangents_")
            key: Any = ["in", role, _type_key(val)]
            op = role
        elif node.op == "get_attr":
            key, op = ["attr", str(node.target), _type_key(val)], "get_attr"
        else:
            op = _target_text(node.target) if node.op == "call_function" else f"{node.op} {node.target}"
            key = [op, _arg_key(list(node.args), ids), _arg_key(dict(node.kwargs), ids), _type_key(val)]
        cid = _digest(key)
        rank = taken.get(cid, 0)
        taken[cid] = rank + 1
        if rank:
            cid = _digest([cid, rank])
        ids[node] = cid
        index[node] = len(values)
        values.append({"name": node.name, "id": cid, "op": op, "type": type_text(val),
                       "inputs": [index[i] for i in dict.fromkeys(node.all_input_nodes)]})
    return values


def graph_id(gm: fx.GraphModule, values: Sequence[dict[str, Any]]) -> str:
    """The graph's canonical id: its values as a set, and its outputs in order."""
    by_name = {v["name"]: v["id"] for v in values}
    out = gm.graph.find_nodes(op="output")[0]
    outputs = [by_name.get(a.name) if isinstance(a, fx.Node) else repr(a) for a in out.args[0]]
    return _digest([sorted(v["id"] for v in values), outputs])
