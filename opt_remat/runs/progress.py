"""What a run shows while it runs.

Three modes: ``off`` (the API's default: nothing), ``lines`` (a line per message and per finished
pair: for logs and pipes), and ``live`` (on a terminal: the same lines scroll above a progress bar
of the pairs, which says what is being done, for how long, and, for a search running longer than a
couple of seconds, its incumbent cost, bound and gap as the solver improves them).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import IO, Any

from solvers.progress import Progress

from ..report import search_text

SHOW_SEARCH_AFTER_S = 2.0  # a search's incumbent and bound are shown once it has run this long
TICK_S = 0.5  # how often the live bar redraws its clock


def terminal_mode(stream: IO[str]) -> str:
    """``live`` on a terminal that can redraw a line, else ``lines``."""
    isatty = getattr(stream, "isatty", lambda: False)
    return "live" if isatty() and os.environ.get("TERM", "") != "dumb" else "lines"


class Display:
    """A run's progress in one of the modes above; ``live`` draws with tqdm."""

    def __init__(self, mode: str = "off", stream: IO[str] | None = None) -> None:
        if mode not in ("off", "lines", "live"):
            raise ValueError(f"display mode {mode!r}: expected off, lines or live")
        self.mode = mode
        self.stream = stream or sys.stdout
        self._bar: Any = None
        self._lock = threading.Lock()
        self._activity = ""
        self._since = 0.0
        self._search: Progress | None = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_line = ""  # lines mode: the search state printed last (a line per change)

    @classmethod
    def for_api(cls, verbose: bool) -> "Display":
        return cls(terminal_mode(sys.stdout) if verbose else "off")

    # ---- lines ----
    def message(self, text: str) -> None:
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def warning(self, text: str) -> None:
        """A line on stderr (whatever the mode), above the bar when there is one."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def start(self, total: int) -> None:
        """A bar of ``total`` pairs (live mode)."""
        if self.mode != "live" or total == 0:
            return
        from tqdm import tqdm
        tqdm.monitor_interval = 0  # no monitor thread of tqdm's own: ours redraws the clock
        self._bar = tqdm(total=total, file=self.stream, unit="pair", ncols=_columns(), leave=False,
                         nrows=shutil.get_terminal_size((100, 24)).lines,
                         bar_format="{n_fmt}/{total_fmt} pairs |{bar:16}| {elapsed} {desc}")

    def finished(self, line: str) -> None:
        """A pair is done: its line, and the bar one step on."""
        self.message(line)
        if self._bar is not None:
            with self._lock:
                self._activity, self._search = "", None
            self._bar.set_description_str("", refresh=False)
            self._bar.update(1)

    # ---- live: what is being done now ----
    def doing(self, activity: str) -> None:
        """What the run does now (``solving budget 0.5 cpsat``), timed from here."""
        with self._lock:
            self._activity, self._since, self._search = activity, time.monotonic(), None
            self._last_line = ""
        if self._bar is None:
            return
        if self._ticker is None:  # started on the first solve in this process, after any pool forked
            self._ticker = threading.Thread(target=self._tick, name="opt-remat-display", daemon=True)
            self._ticker.start()
        self._redraw()

    def search(self, progress: Progress) -> None:
        """A search's phase, incumbent and bound (``solvers.progress`` listener; called from the
        solver's thread). Lines mode prints a line when what it shows changes."""
        with self._lock:
            self._search = progress
            if self.mode != "lines":
                return
            state = search_text(progress)
            if state == self._last_line:
                return
            self._last_line = state
            line = f"{self._activity + ': ' if self._activity else ''}{state} " \
                   f"({time.monotonic() - self._since:.1f} s)"
        self.message(line)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            self._redraw()

    def _redraw(self) -> None:
        bar = self._bar
        if bar is None:
            return
        with self._lock:
            text = self._activity
            if text:
                elapsed = time.monotonic() - self._since
                text += f" ({elapsed:.0f} s)"
                p = self._search
                if p is not None and elapsed >= SHOW_SEARCH_AFTER_S:
                    text += ": " + search_text(p)
        bar.ncols = _columns()  # the terminal may have been resized
        bar.set_description_str(text, refresh=False)
        bar.refresh()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Display":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _columns() -> int:
    # shutil falls back when the terminal reports no size (a 0x0 pty: tqdm would draw nothing)
    return shutil.get_terminal_size((100, 24)).columns
