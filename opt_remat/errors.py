"""opt-remat's errors, reachable by the user around a compiled model's call.

torch.compile wraps every error a backend raises in ``torch._dynamo.exc.BackendCompilerFailed``,
except the ones derived from dynamo's ``ShortenTraceback``, which it re-raises as they are. So
``opt_remat.backend`` re-raises its budget and graph errors as subclasses of both the opt-remat
class and ``ShortenTraceback``: ``except opt_remat.BudgetError`` then works around the call. For
errors wrapped elsewhere (a user's own ``aot_autograd(partition_fn=...)`` backend), ``unwrap``
finds the opt-remat error inside.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .build import GraphError
from .solve import BudgetError, PeakBudgetError

USER_ERRORS = (BudgetError, PeakBudgetError, GraphError)  # the user's to fix; never fallen back from


def unwrap(exc: BaseException) -> BaseException:
    """The opt-remat error (``BudgetError``, ``PeakBudgetError``, ``GraphError``) behind ``exc``
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
