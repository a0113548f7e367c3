"""Live progress of a search: its incumbent cost and proven bound as they improve.

A caller that shows progress (the CLI's displays, the API's ``verbose``) listens with
``reporting(fn)``; solvers call ``report`` with the true recompute cost (seconds) of their best plan
so far, their bound, and optionally the phase they are in. Reports
come from a solver's own polling thread, never from inside a native callback (CP-SAT's callbacks
run on its worker threads and only record numbers). Nothing is reported when no one listens, nor in
a process forked from the listener's (a pool's workers): only the process that listens reports.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Callable, Iterator


@dataclass(frozen=True)
class Progress:
    incumbent: float | None  # recompute cost of the best plan found (None: none yet)
    bound: float | None  # proven lower bound on it (None: none yet)
    phase: str = ""  # what the search is doing now (a multi-phase solve names its phases)

    @property
    def gap(self) -> float | None:
        if self.incumbent is None or self.bound is None or not math.isfinite(self.incumbent):
            return None
        if self.incumbent <= 0:
            return 0.0
        return max(0.0, (self.incumbent - self.bound) / self.incumbent)


_listener: tuple[int, Callable[[Progress], None]] | None = None


def listening() -> bool:
    """Whether someone in this process listens (solvers skip the work of reporting otherwise)."""
    return _listener is not None and _listener[0] == os.getpid()


@contextlib.contextmanager
def reporting(fn: Callable[[Progress], None]) -> Iterator[None]:
    """While the body runs, ``fn`` hears of the searches' progress."""
    global _listener
    previous = _listener
    _listener = (os.getpid(), fn)
    try:
        yield
    finally:
        _listener = previous


def report(incumbent: float | None, bound: float | None, phase: str = "") -> None:
    """Tell the listener (if any) of a search's incumbent, bound and phase; a failing listener is
    ignored."""
    listener = _listener
    if listener is None or listener[0] != os.getpid():
        return
    try:
        listener[1](Progress(None if incumbent is None or not math.isfinite(incumbent) else incumbent,
                             None if bound is None or not math.isfinite(bound) else bound, phase))
    except Exception:  # a display's failure must not stop a solve
        pass
