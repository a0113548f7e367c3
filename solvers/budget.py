"""Budgets as users write them: bytes (int or "512MiB"/"2GB") or a fraction in [0, 1]."""

from __future__ import annotations

import math
import re
from typing import Iterable

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


class Fraction(float):
    """A budget as a fraction of the way from the least-memory plan to the min-cut plan."""


def parse_budget(budget: int | float | str | None) -> int | Fraction | None:
    """Bytes as an int, a fraction in [0, 1] as ``Fraction``, or None for no budget.

    Ints and strings with a unit are bytes ("512MiB", "2GB", "1e9"); floats are fractions.
    """
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise ValueError(f"budget must be bytes or a fraction in [0, 1], got {budget!r}")
    if isinstance(budget, int):
        if budget < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget}")
        return budget
    if isinstance(budget, float):
        if math.isnan(budget) or budget < 0 or budget > 1:
            raise ValueError(
                f"a float budget is a fraction in [0, 1] (like torch's activation_memory_budget), got "
                f"{budget}; give bytes as an int or a string such as '512MiB'"
            )
        return Fraction(budget)
    if isinstance(budget, str):
        m = _PATTERN.match(budget)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(
                f"cannot parse budget {budget!r}: expected bytes such as '1500000', '512MiB', '2GB' or "
                "'1.5GiB' (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), or a fraction such as 0.5"
            )
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if value < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget!r}")
        return int(value)
    raise ValueError(f"budget must be an int (bytes), a str like '512MiB' or a float fraction, "
                     f"got {type(budget).__name__}")


# Units: every byte count and time opt-remat prints or plots gets its unit here, one rule for each.
BYTE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def byte_unit(n: float) -> str:
    """The largest binary unit ``n`` bytes is at least one of (``"B"`` below 1 KiB)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if abs(n) >= BYTE_UNITS[unit]:
            return unit
    return "B"


def format_bytes(n: float | None, unit: str | None = None) -> str:
    """``n`` bytes as text, in ``unit`` ("B", "KiB", ..., "TiB") or the one that suits ``n``: every
    byte count opt-remat prints goes through here. None is "-", zero "0 B" in any unit, and a count
    that would show as 0.00 in ``unit`` is shown in its own."""
    if n is None:
        return "-"
    if unit is None or 0 < abs(n) < 0.005 * BYTE_UNITS[unit]:  # too small to show in ``unit``: its own
        unit = byte_unit(n)
    if unit == "B" or n == 0:
        return f"{round(n)} B"
    return f"{n / BYTE_UNITS[unit]:.2f} {unit}"


def column_unit(values: Iterable[float | None]) -> str:
    """One unit for a column (or an axis) of byte counts: the one that suits its largest value, so
    a column never mixes ``1014.00 KiB`` with ``1.01 MiB``."""
    sizes = [abs(v) for v in values if v is not None]
    return byte_unit(max(sizes)) if sizes else "B"


def byte_axis(values: Iterable[float | None]) -> tuple[str, float]:
    """A figure's byte axis: its unit (``column_unit``) and the bytes one tick unit stands for."""
    unit = column_unit(values)
    return unit, float(BYTE_UNITS[unit])


def time_unit(s: float) -> str:
    """The largest of s, ms, us, ns that ``s`` seconds is at least one of ("ns" below)."""
    for unit in ("s", "ms", "us"):
        if abs(s) >= TIME_UNITS[unit]:
            return unit
    return "ns"


def format_seconds(s: float | None, unit: str | None = None) -> str:
    """Seconds as text, in ``unit`` or the one that suits them: every time opt-remat prints goes
    through here. None or NaN is "-", zero "0 s" in any unit."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s == 0:
        return "0 s"
    unit = unit or time_unit(s)
    return f"{s / TIME_UNITS[unit]:.3g} {unit}"


def column_time_unit(values: Iterable[float | None]) -> str:
    """One unit for a column (or an axis) of times: the one that suits its largest value."""
    times = [abs(v) for v in values if v is not None and not math.isnan(v)]
    return time_unit(max(times)) if times else "s"


def time_axis(values: Iterable[float | None]) -> tuple[str, float]:
    """A figure's time axis: its unit (``column_time_unit``) and the seconds one tick unit stands for."""
    unit = column_time_unit(values)
    return unit, TIME_UNITS[unit]
