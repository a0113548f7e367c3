"""The solver side's errors, and ``OptRematError``, the base of every error opt-remat raises.

``except opt_remat.OptRematError`` (the same class) catches them all, on either side. Those that
were ``ValueError``s (or ``TimeoutError``) stay so: each derives from both. The torch side's
errors are in ``opt_remat.errors``. Torch-free, like the rest of ``solvers``.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from .budget import format_bytes


class OptRematError(Exception):
    """Base of opt-remat's errors (not of ``SolveInterrupted``, a ``KeyboardInterrupt``)."""


class ProblemError(OptRematError, ValueError):
    """A problem description that is not a valid DAG of the model (``solvers.problem``)."""


class PlanError(OptRematError, ValueError):
    """A saved set from which the backward cannot be computed."""


class InfeasibleError(OptRematError, ValueError):
    """No plan exists (e.g. a value the backward reads can be neither saved nor recomputed)."""


class BudgetInfeasibleError(InfeasibleError):
    """The budget is below the smallest saved bytes of any valid plan."""

    def __init__(self, budget: int, min_feasible_bytes: int | None, *, proven: bool = True) -> None:
        self.budget = budget
        self.min_feasible_bytes = min_feasible_bytes
        self.proven = proven
        if min_feasible_bytes is None:
            detail = "the smallest feasible saved bytes could not be determined in the time limit"
        elif proven:
            detail = (f"the smallest feasible saved bytes is {format_bytes(min_feasible_bytes)} "
                      f"({min_feasible_bytes} bytes)")
        else:
            detail = (f"the smallest saved bytes found is {format_bytes(min_feasible_bytes)} "
                      "(not proven minimal within the time limit)")
        super().__init__(f"budget {format_bytes(budget)} is infeasible: {detail}")


class PeakInfeasibleError(InfeasibleError):
    """No plan keeps the step's peak under the budget; says the smallest peak found and the floor
    no plan can go below (``solvers.liveness.peak_lower_bound``)."""

    def __init__(self, peak_budget: int, min_peak: int | None, proven: bool,
                 floor: int | None = None, *, infeasible_proven: bool = False) -> None:
        self.peak_budget = peak_budget
        self.min_peak = min_peak
        self.floor = floor
        self.min_feasible_bytes = None
        self.infeasible_proven = infeasible_proven
        proven = proven or (min_peak is not None and min_peak == floor)
        what = "the smallest peak" if proven else "the smallest peak found"
        bound = (f"; no plan can peak below {format_bytes(floor)} ({floor} bytes)"
                 if floor is not None and not proven else "")
        why = " (proven: no plan fits the relaxation)" if infeasible_proven else ""
        super().__init__(
            f"peak budget {format_bytes(peak_budget)} is infeasible{why}: {what} of any plan is "
            f"{format_bytes(min_peak)}{'' if proven else ' (not proven minimal in the time limit)'}{bound}; "
            f"raise peak_budget to at least {min_peak} bytes")


class MIPTimeLimitError(OptRematError, TimeoutError):
    """The solver found no plan in its time limit and no warm-start plan fits the budget."""


class TrainingSetupError(OptRematError, ValueError):
    """A ``training:`` description that cannot be used, naming the field (``solvers.training``)."""


class DeviceBudgetError(OptRematError, ValueError):
    """The rank's states alone do not fit the device: says the breakdown and what would fit
    (``solvers.device_budget``)."""


class StepPeakLike(Protocol):  # solvers.step.StepPeak (named here only: the step model imports this module)
    @property
    def total(self) -> int: ...
    @property
    def at(self) -> str: ...
    @property
    def by_kind(self) -> Mapping[Any, int]: ...


class StepBudgetError(InfeasibleError):
    """No combination of the graphs' candidate plans fits the step's budget: names the lowest
    step peak found, where it falls and its split by kind."""

    def __init__(self, budget: int, lowest: StepPeakLike | None) -> None:
        self.budget, self.lowest = budget, lowest
        where = "" if lowest is None else (
            f"; the lowest step peak found is {format_bytes(lowest.total)} at {lowest.at} ("
            + ", ".join(f"{k.value} {format_bytes(v)}" for k, v in lowest.by_kind.items()) + ")")
        super().__init__(f"no plans for the step's graphs fit the budget of {format_bytes(budget)}{where}; "
                         "raise the budget, or train with less held per layer (FSDP, a bf16 optimizer state)")
