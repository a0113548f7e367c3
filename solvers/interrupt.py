"""Ctrl-C during a native solve: stop the search, keep its best plan, and let the caller decide.

Python runs its SIGINT handler only when the main thread runs Python code, which it does not while
it waits in CP-SAT's C++ ``solve``; CP-SAT's own handler (``catch_sigint_signal``) stops the
search but leaves no trace of it, so a run went on as if nothing had happened. Here, while a solve
runs in the main thread, SIGINT sets a process-wide flag and a watcher thread, woken through
Python's signal wakeup fd, calls the solver's ``stop``. The solve returns its best plan; callers ask
``requested()`` (later solves of the same call stop at once) and ``clear()`` it when they have
turned it into a ``KeyboardInterrupt`` of their own.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from typing import Callable, Iterator

_flag = threading.Event()


def requested() -> bool:
    """Whether Ctrl-C was pressed during a guarded solve since the last ``clear()``."""
    return _flag.is_set()


def clear() -> None:
    _flag.clear()


@contextlib.contextmanager
def stop_on_sigint(stop: Callable[[], None]) -> Iterator[None]:
    """While the body runs, Ctrl-C calls ``stop()`` (from another thread) and sets ``requested()``
    instead of raising KeyboardInterrupt. Outside the main thread (signals go to the main thread
    only), or when SIGINT is not Python's to handle, the body runs as it is."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            ready, _, _ = select.select([r], [], [], 1.0)
            if ready:
                try:
                    data = os.read(r, 64)
                except BlockingIOError:
                    continue
                if signal.SIGINT in data:
                    _flag.set()
                    stop()

    previous_handler = signal.signal(signal.SIGINT, lambda signum, frame: _flag.set())
    previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="opt-remat-sigint", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous_handler)
        done.set()
        os.write(w, b"\0")  # wake the watcher now (not at its next poll): solves can be many and short
        watcher.join()
        os.close(r)
        os.close(w)
