"""Solver names and options as ``partitioner(...)``, YAML runs and the CLI check them: the rules of
``solvers.catalog``, given the modes (no budget, saved bytes, peak) a solve may run in."""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from typing import Any

from solvers import catalog
from solvers.options import MincutOptions

TORCH_SOLVER = catalog.TORCH  # torch's own partitioner, run as a baseline through the same interface
describe = catalog.describe


def known_solvers() -> list[str]:
    """Solver names a configuration, the CLI or a partitioner may use (``torch`` included)."""
    return catalog.names()


def possible_modes(budget: Any, peak_budget: Any) -> tuple[str, ...]:
    """The modes a partitioner given ``budget``/``peak_budget`` may solve in: without a budget,
    torch's own settings may still set one when it compiles."""
    if peak_budget is not None:
        return (catalog.PEAK,)
    return (catalog.SAVED,) if budget is not None else (catalog.FREE, catalog.SAVED)


def mode_of(budget: float | str | None, peak_budget: int | None) -> str:
    """The mode of one solve."""
    if peak_budget is not None:
        return catalog.PEAK
    return catalog.FREE if budget is None else catalog.SAVED


def check_solver_options(solver: str | None, options: Mapping[str, Any],
                         modes: Collection[str] = catalog.MODES) -> None:
    """Raise ValueError naming the options ``solver`` takes (None: the default path) if one of
    ``options`` is unknown to it, applies in none of ``modes``, or has a value of the wrong kind."""
    catalog.check_options(solver, options, modes)


def options_in_mode(solver: str | None, options: Mapping[str, Any], mode: str, *,
                    warn: bool = True) -> dict[str, Any]:
    """The options that apply in ``mode``; the others (valid in another mode the caller allowed)
    are left out with a warning that names them, never silently."""
    left = catalog.not_applying(solver, options, mode)
    kept = {k: v for k, v in options.items() if k not in left}
    who = catalog.DEFAULT_WORDS if solver is None else f"solver {solver!r}"
    if left and warn:
        warnings.warn(f"opt-remat: option(s) {', '.join(left)} of {who} do not apply "
                      f"{catalog.MODE_WORDS[mode]}; this solve does without them", stacklevel=3)
    return kept


def default_solver_options(options: Mapping[str, Any], mode: str) -> dict[str, dict[str, Any]]:
    """The options of the default path (no solver named) that apply in ``mode``, split into
    min-cut's and the exact search's (``opt_remat.solve.choose_default_plan``)."""
    mincut = set(MincutOptions.__dataclass_fields__)
    kept = {k: v for k, v in options.items() if k not in catalog.not_applying(None, options, mode)}
    return {"mincut": {k: v for k, v in kept.items() if k in mincut},
            "milp": {k: v for k, v in kept.items() if k not in mincut}}
