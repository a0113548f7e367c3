"""Small pieces every job of a run shares: atomic writes, JSON-safe values, quiet torch, errors."""

from __future__ import annotations

import math
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import OptRematError


class RunError(OptRematError, RuntimeError):
    """A run that cannot go on (not a configuration error)."""


class SolveRefused(RunError):
    """A pair with no plan for a reason the user can change: an infeasible budget, a solver
    without the asked mode."""


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write via a temporary file in the same folder and a rename: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def jsonable(x: Any) -> Any:
    """``x`` as JSON can hold it: NaN and infinities become null, enums their value, the rest text."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "value") and isinstance(x.value, (str, int)):
        return x.value
    return str(x)


@contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch's deprecation chatter that deep copies of FX graphs print."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


def first_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else text}"[:300]


def safe_name(text: str) -> str:
    """``text`` as a file name part."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
