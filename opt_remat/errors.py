"""The torch side's errors, and how they reach the user around a compiled model's call.

Every error opt-remat raises derives from ``OptRematError`` (``solvers.errors``, re-exported here and
as ``opt_remat.OptRematError``); the solver side's are in ``solvers.errors``, the entry layer's
(``ConfigError``, ``RunError``, ``UsageError``, ``ReportError``) stay beside their readers. This
module imports no torch until an error is passed through torch.compile.

torch.compile wraps every error a backend raises in ``torch._dynamo.exc.BackendCompilerFailed``,
except the ones derived from dynamo's ``ShortenTraceback``, which it re-raises as they are. So
``opt_remat.backend`` re-raises its budget, graph and plan-file errors as subclasses of both the opt-remat
class and ``ShortenTraceback``: ``except opt_remat.BudgetError`` then works around the call. For
errors wrapped elsewhere (a user's own ``aot_autograd(partition_fn=...)`` backend), ``unwrap``
finds the opt-remat error inside.

The errors a user can cause, all ``ValueError``s naming the cause and the fix:
- on building a partitioner or backend: a budget, peak budget, solver, option, device or costs
  setting that is not valid (``ValueError``); a plan file that cannot be read (``PlanMismatchError``);
- on the compiled model's first call, passed through torch.compile as they are (``USER_ERRORS``):
  ``BudgetError`` (no plan saves within the budget), ``PeakBudgetError`` (none peaks within the peak
  budget or the device's memory), ``DeviceBudgetError`` (the rank's states alone leave no room),
  ``GraphError`` (a graph opt-remat cannot partition), ``PlanMismatchError`` (a plan file
  made for another graph: shapes, model, compiler or torch version differ).
Ctrl-C during a solve raises ``SolveInterrupted`` (a ``KeyboardInterrupt``, so not an
``OptRematError``: ``except Exception`` must not swallow a Ctrl-C) with the best plan found.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from solvers.budget import format_bytes
from solvers.errors import DeviceBudgetError, OptRematError
from solvers.problem import Plan

__all__ = ["BudgetError", "CaptureError", "DeviceBudgetError", "GraphError", "GraphLoadError", "OptRematError",
           "PeakBudgetError",
           "PlanMismatchError", "SolveInterrupted", "USER_ERRORS", "Unsupported", "catchable", "unwrap"]


class GraphError(OptRematError, ValueError):
    """A joint graph that opt-remat cannot partition safely, naming the node at fault."""


class CaptureError(OptRematError, ValueError):
    """A step that cannot be captured as asked (e.g. several graphs where one is needed)."""


class Unsupported(OptRematError):
    """A case torch's extraction handles specially: the caller falls back to it (never reaches
    the user)."""


class PlanMismatchError(OptRematError, ValueError):
    """A plan file that cannot be read, or a plan applied to a graph it was not made for."""


class GraphLoadError(OptRematError, ValueError):
    """A graph file that is not a valid training graph; the message names the file and node."""


class BudgetError(OptRematError, ValueError):
    """A budget no plan can meet; says the smallest feasible one."""

    def __init__(self, budget: int, min_feasible_bytes: int, detail: str = "") -> None:
        self.budget = budget
        self.min_feasible_bytes = min_feasible_bytes
        super().__init__(
            f"budget {format_bytes(budget)} ({budget} bytes) is infeasible: the smallest plan of any "
            f"solver saves {format_bytes(min_feasible_bytes)} ({min_feasible_bytes} bytes)"
            + (f"; {detail}" if detail else f". Raise the budget to at least {min_feasible_bytes} bytes")
        )


class PeakBudgetError(OptRematError, ValueError):
    """A peak budget no plan can meet; says the smallest peak found and the floor below it."""

    def __init__(self, peak_budget: int, min_peak: int | None, floor: int | None = None, *,
                 further: str | None = None, name: str = "peak_budget") -> None:
        """``further``: a solver that searches further than the one that failed, suggested unless
        the smallest peak found is already the floor; ``name``: the setting the budget came from."""
        self.peak_budget = peak_budget
        self.min_peak = min_peak
        self.floor = floor
        if min_peak is None:
            found = "no valid plan was found at all (check bans and must-recompute tags)"
        elif floor == min_peak:
            found = (f"no plan can peak below {format_bytes(floor)} ({floor} bytes), the peak of the plan "
                     f"found; raise {name} to at least {min_peak} bytes")
        else:
            found = (f"the smallest step peak found is {format_bytes(min_peak)} ({min_peak} bytes)"
                     + (f" and no plan can peak below {format_bytes(floor)} ({floor} bytes)" if floor else "")
                     + f"; raise {name} to at least {min_peak} bytes"
                     + (f" or try solver '{further}', which searches further" if further else ""))
        super().__init__(f"{name} {format_bytes(peak_budget)} ({peak_budget} bytes) is infeasible: {found}")


class RequestError(OptRematError, ValueError):
    """A setting of a solve request that cannot be used; ``field`` names it (``opt_remat.request``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class OffloadError(OptRematError, ValueError):
    """torch's offloading pass did not offload what the plan offloads (``opt_remat.offload``)."""


class SolveInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a solve; ``plan`` is the best plan it had found (checked valid), or None."""

    def __init__(self, plan: Plan | None) -> None:
        super().__init__("interrupted (Ctrl-C) during the solve")
        self.plan = plan


# the user's to fix, raised while torch.compile compiles; never fallen back from
USER_ERRORS = (BudgetError, PeakBudgetError, DeviceBudgetError, GraphError, PlanMismatchError)


def unwrap(exc: BaseException) -> BaseException:
    """The opt-remat error (``BudgetError``, ``PeakBudgetError``, ``GraphError``,
    ``PlanMismatchError``) behind ``exc``
    (e.g. torch's ``BackendCompilerFailed``), following ``inner_exception`` and causes; ``exc``
    itself when there is none."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, USER_ERRORS):
            return cur
        cur = getattr(cur, "inner_exception", None) or cur.__cause__ or cur.__context__
    return exc


_PASSTHROUGH: dict[type[BaseException], type[BaseException]] = {}


def _passthrough(exc: BaseException) -> BaseException:
    """``exc`` as an instance of a subclass of its class and dynamo's ``ShortenTraceback``."""
    from torch._dynamo.exc import ShortenTraceback

    base = type(exc)
    cls = _PASSTHROUGH.get(base)
    if cls is None:
        # its own message: dynamo appends advice about TORCHDYNAMO_VERBOSE to ``args``
        cls = type(base.__name__, (base, ShortenTraceback), {"__module__": base.__module__,
                                                           "__str__": lambda self: self.message})
        _PASSTHROUGH[base] = cls
    new: Any = cls.__new__(cls)
    new.__dict__.update(exc.__dict__)
    new.args = exc.args
    new.message = str(exc)
    new.first_useful_frame = None  # keep the whole traceback (ShortenTraceback strips to this frame)
    return new


@contextlib.contextmanager
def catchable() -> Iterator[None]:
    """Inside a ``torch.compile`` backend: let opt-remat's user errors through dynamo unwrapped."""
    try:
        yield
    except Exception as exc:
        inner = unwrap(exc)
        if not isinstance(inner, USER_ERRORS):
            raise
        raise _passthrough(inner).with_traceback(inner.__traceback__) from None
