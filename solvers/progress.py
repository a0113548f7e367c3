"""Live progress of a search: its incumbent cost and proven bound as they improve.

A caller that shows progress (the CLI's displays, the API's ``verbose``) listens with
``reporting(fn)``; solvers call ``report`` with the true recompute cost (seconds) of their best plan
so far, their bound, and optionally the phase they are in: a report without one keeps the last
phase named (the listener never sees a search's numbers unlabelled after a phase), and a search
that starts inside another (CP-SAT under a peak solve) names its own. Reports
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
_last_phase = ""  # the phase a report without one is in (reset per listener)


def listening() -> bool:
    """Whether someone in this process listens (solvers skip the work of reporting otherwise)."""
    return _listener is not None and _listener[0] == os.getpid()


@contextlib.contextmanager
def reporting(fn: Callable[[Progress], None]) -> Iterator[None]:
    """While the body runs, ``fn`` hears of the searches' progress."""
    global _listener, _last_phase
    previous = _listener, _last_phase
    _listener, _last_phase = (os.getpid(), fn), ""
    try:
        yield
    finally:
        _listener, _last_phase = previous


def report(incumbent: float | None, bound: float | None, phase: str = "") -> None:
    """Tell the listener (if any) of a search's incumbent, bound and phase (none: the last one
    named); a failing listener is ignored."""
    global _last_phase
    listener = _listener
    if listener is None or listener[0] != os.getpid():
        return
    if phase:
        _last_phase = phase
    phase = _last_phase
    try:
        listener[1](Progress(None if incumbent is None or not math.isfinite(incumbent) else incumbent,
                             None if bound is None or not math.isfinite(bound) else bound, phase))
    except Exception:  # a display's failure must not stop a solve
        pass
