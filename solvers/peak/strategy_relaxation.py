"""The relaxation at the peak budget (``solvers.peak.relaxation``, HiGHS): the first proven bound,
a proof of infeasibility when it admits no plan, and its plan, which often fits (then it is
optimal up to HiGHS's gap) or nearly fits (then ``offer`` repairs it)."""

from __future__ import annotations

from ..errors import PeakInfeasibleError
from ..liveness import peak_lower_bound
from .state import PeakState


def run(state: PeakState, seconds: float) -> None:
    relaxed = state.relax(state.peak_budget, seconds)
    if relaxed.status == "infeasible":
        raise PeakInfeasibleError(state.peak_budget, min((pk for _, pk in state.frontier), default=None), False,
                                  peak_lower_bound(state.problem), infeasible_proven=True)
    state.first_relaxed = state.relaxed = relaxed
    state.raise_bound(relaxed.bound)
    if relaxed.saved is not None:
        peak = state.offer(relaxed.saved, "relaxation")
        state.overshoot = 0 if peak is None else peak - state.peak_budget
        state.relaxed_curve = state.last_curve if peak is not None else None
