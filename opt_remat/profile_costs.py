"""Recompute costs measured on the device (``costs="profile"``), instead of the roofline estimate.

Each recomputable op is run on the device its values live on, with fresh tensors of its inputs'
shapes, strides and dtypes (so it works on a fake capture too: nothing of the model is needed),
a warm-up call and then the median of a few timed calls. Results are cached on disk by
(op, argument shapes/strides/dtypes/constants, device), so planning the same model again, or
another model with the same layers, times nothing. An op that cannot be run from its shapes alone
(it needs real indices, a generator, ...) keeps its roofline estimate.

The cache lives in ``$OPT_REMAT_CACHE_DIR`` (default ``~/.cache/opt-remat``), file
``op_costs.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, cast

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_map

from .costs import _hint
from .disk_cache import cache_dir, replace_file

WARMUP = 1
RUNS = 5
CACHE_FILE = "op_costs.json"


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def _describe(x: Any) -> Any:
    if isinstance(x, fx.Node):
        x = x.meta.get("val")
    if isinstance(x, torch.Tensor):
        return ["T", [int(_hint(d)) for d in x.shape], [int(_hint(s)) for s in x.stride()],
                str(x.dtype), x.device.type]
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return repr(_hint(x))
    if isinstance(x, (list, tuple)):
        return [_describe(i) for i in x]
    if isinstance(x, dict):
        return {str(k): _describe(v) for k, v in x.items()}
    return repr(x)


def op_key(node: fx.Node) -> str:
    """What decides an op's time: its target and its arguments' shapes, strides, dtypes, values."""
    return json.dumps([str(node.target), _describe(node.args), _describe(node.kwargs)], sort_keys=True)


def _materialize(x: Any) -> Any:
    """A real tensor shaped like a node's value (small random values; integers 0, so that
    index arguments stay in range)."""
    if isinstance(x, fx.Node):
        x = x.meta.get("val")
    if isinstance(x, torch.Tensor):
        shape = [int(_hint(d)) for d in x.shape]
        stride = [int(_hint(s)) for s in x.stride()]
        device = "cpu" if x.device.type == "meta" else x.device
        t = torch.empty_strided(shape, stride, dtype=x.dtype, device=device)
        if t.is_floating_point() or t.is_complex():
            t.uniform_(0.5, 1.0)  # positive: log, sqrt, rsqrt and division stay finite
        else:
            t.zero_()
        return t
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _hint(x)
    return x


def time_op(node: fx.Node) -> float | None:
    """Median seconds of one call of the node's op on fresh tensors, or None if it cannot run."""
    try:
        with torch.no_grad():
            args = tree_map(_materialize, node.args, is_leaf=lambda a: isinstance(a, fx.Node))
            kwargs = tree_map(_materialize, node.kwargs, is_leaf=lambda a: isinstance(a, fx.Node))
            device = next((a.device for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)), None)
            sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
            op = cast(Callable[..., Any], node.target)  # a call_function node's
            for _ in range(WARMUP):
                op(*args, **kwargs)
            sync()
            times = []
            for _ in range(RUNS):
                start = time.perf_counter()
                op(*args, **kwargs)
                sync()
                times.append(time.perf_counter() - start)
    except Exception:  # needs real data or state: the roofline estimate stays
        return None
    return statistics.median(times)


def profile_costs(nodes: list[fx.Node]) -> dict[str, float]:
    """Measured seconds per node name (nodes that cannot be timed are left out), through the
    on-disk cache. Says on stderr what it times when that is more than a handful of ops."""
    path = cache_path()
    try:
        cache: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}  # a damaged cache is rebuilt
    keys = {n.name: op_key(n) for n in nodes}
    todo = {k for k in keys.values() if k not in cache}
    by_key = {k: n for n in nodes for k in [keys[n.name]] if k in todo}
    if len(by_key) > 20 and sys.stderr.isatty():
        print(f"opt-remat: timing {len(by_key)} ops on the device (cached in {path})", file=sys.stderr)
    for i, (key, node) in enumerate(by_key.items()):
        seconds = time_op(node)
        if seconds is not None:
            cache[key] = seconds
        if sys.stderr.isatty() and len(by_key) > 20 and (i + 1) % 50 == 0:
            print(f"  {i + 1}/{len(by_key)}", file=sys.stderr)
    if by_key:
        try:
            replace_file(path, json.dumps(cache))
        except OSError:
            pass  # measuring still helps this run
    return {name: cache[key] for name, key in keys.items() if key in cache}
