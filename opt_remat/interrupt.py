"""Ctrl-C on the command line: one clean "interrupted" line, nothing before it.

Two things got in the way of that. AOTAutograd traces the joint graph with autograd's anomaly mode
on, so a Ctrl-C landing in that trace made torch warn "Error detected in ...Backward0. Traceback of
forward call ..." on its way out. And a Ctrl-C landing in a weakref callback or ``__del__`` is
printed as "Exception ignored in ..." and dropped: the command went on as if never interrupted.
``quiet_interrupts`` drops warnings once Ctrl-C was pressed, and turns a dropped interrupt into a
new one raised in the code that runs next.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import warnings
from typing import Any, Iterator


@contextlib.contextmanager
def quiet_interrupts() -> Iterator[None]:
    """While the body runs (in the main thread, with Python's own Ctrl-C handler): Ctrl-C raises
    KeyboardInterrupt as usual, and from then on warnings are not shown and a KeyboardInterrupt
    that Python could not raise (it landed in a finalizer) is raised again where the code goes on."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    interrupted = False
    pending: list[threading.Timer] = []

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    def show_warning(*args: Any, **kwargs: Any) -> None:
        if not interrupted:
            shown(*args, **kwargs)

    def unraisable(info: Any) -> None:
        if interrupted and isinstance(info.exc_value, KeyboardInterrupt):
            # on_sigint again once this hook has returned (raised here, it would land in the hook)
            again = threading.Timer(0.05, _thread.interrupt_main)
            again.daemon = True
            pending.append(again)
            again.start()
            return
        hook(info)

    shown, hook = warnings.showwarning, sys.unraisablehook
    signal.signal(signal.SIGINT, on_sigint)
    warnings.showwarning, sys.unraisablehook = show_warning, unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        warnings.showwarning, sys.unraisablehook = shown, hook
        # a lost interrupt not raised again yet: raise it here, not after the command has returned
        # (Python then exits by SIGINT, with no message and no exit code of the command's own)
        late = [t for t in pending if t.is_alive()]
        for timer in late:
            timer.cancel()
        if late and sys.exc_info()[0] is None:
            raise KeyboardInterrupt
