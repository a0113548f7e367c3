"""opt-remat's errors, reachable by the user around a compiled model's call.

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
  budget), ``GraphError`` (a graph opt-remat cannot partition), ``PlanMismatchError`` (a plan file
  made for another graph: shapes, model, compiler or torch version differ).
Ctrl-C during a solve raises ``SolveInterrupted`` (a ``KeyboardInterrupt``) with the best plan found.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from solvers.plans_io import PlanMismatchError

from .build import GraphError
from .solve import BudgetError, PeakBudgetError

# the user's to fix, raised while torch.compile compiles; never fallen back from
USER_ERRORS = (BudgetError, PeakBudgetError, GraphError, PlanMismatchError)


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


_PASSTHROUGH: dict[type, type] = {}


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
    new = cls.__new__(cls)
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
