"""Cutting planes for the bound: where the relaxation's plan overshoots the simulation, rows that
count what recompute chains keep live there (``solvers.peak.cuts``: valid for every plan, so each
re-solve's bound is a bound; where it overshoots in the forward, the forward's rows of
``solvers.peak.forward_rows``), until its plan fits, the steps repeat or the time is spent. The
rounds' plans are offered, grafted onto the best plan, and re-solved below the budget when they
nearly fit. Each turn goes on from the last round's plan. On big graphs (where no local search
runs once a plan fits) a round's plan that overshoots by a few percent and costs less than the
best is repaired move by move (``solvers.peak.repair.repair_by_rate``), then what the repair
left unused is spent (``solvers.peak.spend``): near the floor the rounds' plans are the only cheap
plans within reach of fitting. There the round's HiGHS solve runs in a thread of its own (it keeps
to one core) while this one repairs each plan HiGHS finds on the way, so the solve, which decides
the bound, gets the round's whole time."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from .. import interrupt
from ..liveness import MemoryCurve, peak_lower_bound
from ..problem import Plan
from . import strategy_graft
from ..errors import PeakInfeasibleError
from .cuts import violated_steps
from .relaxation import Relaxed
from .repair import repair_by_rate
from .rows import relaxed_live
from .search import Judge
from .spend import spend_budget
from .settings import (CUT_STALL_GAIN, CUT_STALL_ROUNDS, CUTS_PER_ROUND, NEAR_DONE_GAPS, NEAR_FIT,
                       PROBING_MAX_VALUES, ROUND_GAP_MAX, ROUND_GAP_SHARE, ROUND_GRAFT_SHARE, ROUND_REPAIR_FIT,
                       ROUND_END_KEEP, ROUND_REPAIR_SHARE, ROUND_SPEND_EVALUATIONS)
from .state import PeakState


@dataclass
class _Rounds:
    """What the rounds keep between turns."""

    last: tuple[Plan, MemoryCurve] | None = None  # the last round's plan: the next round's start
    round_s: float = 0.0  # how long the last round's solve took
    probing: bool = True  # HiGHS's presolve probing, until a round's program is solved
    stalled: bool = False  # the rounds stopped raising the bound while no plan fits
    repaired: set[frozenset[str]] = field(default_factory=set)  # the rounds' plans repaired already


def run(state: PeakState, seconds: float) -> None:
    """A turn of rounds that leaves the time a round would not finish in to the next phases."""
    _rounds(state, seconds, last=False)


def run_to_end(state: PeakState, seconds: float) -> None:
    """The last turn: rounds while any time is left."""
    _rounds(state, seconds, last=True)


def _rounds(state: PeakState, seconds: float, last: bool) -> None:
    memory = state.memory.get("cuts")
    if memory is None:
        memory = state.memory["cuts"] = _Rounds(probing=len(state.problem.candidates) <= PROBING_MAX_VALUES)
    if state.best is None and memory.stalled:
        return  # an earlier turn stopped for want of progress, from the same last plan
    current = memory.last or state.relaxed_curve
    until = time.perf_counter() + seconds
    stalled = 0  # rounds in a row that did not raise the bound
    while current is not None and not state.done() and time.perf_counter() < until - 0.5 and state.left() > 0:
        if not last and until - time.perf_counter() < 2 * memory.round_s:
            break  # each round has more rows than the last: one cut short would return nothing
        plan, curve = current
        if curve.peak <= state.peak_budget:
            break
        raised = _round(state, memory, plan, curve, until)
        if raised is None:
            break
        stalled = 0 if raised else stalled + 1
        current = memory.last
        if current is not None:
            _after_round(state, memory, current, until)
        if state.best is None and stalled >= CUT_STALL_ROUNDS:
            # no plan fits, so the rounds can only prove that none can, and they have stopped
            # raising the bound: each further round would take longer
            memory.stalled = True
            break


def _round(state: PeakState, memory: _Rounds, plan: Plan, curve: MemoryCurve, until: float) -> bool | None:
    """Cut where the plan overshoots and re-solve: whether the bound rose by ``CUT_STALL_GAIN``
    (None: nothing left to cut, or no plan from the re-solve)."""
    problem, peak_budget = state.problem, state.peak_budget
    # the first round also where the relaxation counts most; a plan can still overshoot at a step
    # cut already (inside a batch of recomputations, which the row does not see): the next steps
    counted = None if state.cut_steps else relaxed_live(problem, state.rows, set(plan.saved), set(plan.recomputed))
    new = violated_steps(problem, curve, peak_budget, count=CUTS_PER_ROUND, skip=set(state.cut_steps),
                         relaxed=counted)
    # a plan over the budget in the forward: the forward's rows (solvers.peak.forward_rows), from
    # then on (they slow every solve, and most relaxations' plans peak in the backward)
    forward = curve.forward_peak > peak_budget and not state.forward_rows
    if not new and not forward:
        return None
    state.forward_rows = state.forward_rows or forward
    for k in new:
        state.cuts.note(k, set(plan.saved), set(plan.recomputed))
    state.cut_steps.extend(new)
    began = time.perf_counter()
    limit = min(until - began, state.left())
    gap = _round_gap(state)
    if state.small():
        again = state.relax(peak_budget, limit, probing=memory.probing, rel_gap=gap)
    else:  # HiGHS often runs to its limit here: a little time kept for what follows the round
        keep = state.share(ROUND_END_KEEP)
        again = _relax_repairing(state, memory, limit - keep if limit > 2 * keep else limit, until, gap)
    memory.round_s = time.perf_counter() - began
    memory.probing = memory.probing and again.status != "optimal"
    if again.status == "infeasible":  # the cuts hold for every plan that fits
        if state.best is not None:
            raise RuntimeError("opt-remat internal error: the peak relaxation's cuts refuse a plan that fits")
        raise PeakInfeasibleError(peak_budget, state.smallest_peak(), False, peak_lower_bound(problem),
                                  infeasible_proven=True)
    before = state.bound
    raised = again.bound is not None and again.bound > before * (1 + CUT_STALL_GAIN)
    if state.raise_bound(again.bound) and again.status == "optimal":
        state.relaxed = again
    if again.saved is None:
        return None
    state.last_curve = None
    state.offer(again.saved, "relaxation with cuts")
    memory.last = state.last_curve
    return raised


def _relax_repairing(state: PeakState, memory: _Rounds, seconds: float, until: float, rel_gap: float) -> Relaxed:
    """The round's relaxation (at HiGHS's gap ``rel_gap``) solved in a thread of its own while this
    one offers and repairs (``_repair_round_plan``) the latest plan HiGHS found, until the solve
    ends. Ctrl-C stops both. The solve's thread reads nothing this one changes meanwhile."""
    found: queue.Queue[list[str]] = queue.Queue()
    stop = threading.Event()
    answer: list[Relaxed | BaseException] = []
    probing = memory.probing

    def solve() -> None:
        try:
            answer.append(state.relax(state.peak_budget, seconds, probing=probing, rel_gap=rel_gap,
                                      on_plan=found.put, stop=stop))
        except BaseException as error:  # raised again in this thread
            answer.append(error)

    worker = threading.Thread(target=solve, name="opt-remat-cut-round", daemon=True)
    with interrupt.stop_on_sigint(stop.set):
        worker.start()
        try:
            while worker.is_alive():
                saved = _latest(found)
                if saved is not None and not interrupt.requested():
                    state.last_curve = None
                    state.offer(saved, "relaxation with cuts")
                    if state.last_curve is not None:
                        plan, curve = state.last_curve
                        _repair_round_plan(state, memory, plan, curve.peak - state.peak_budget, until)
        finally:
            stop.set()  # the solve has ended, or this thread is leaving on an error
            worker.join()
    got = answer[0] if answer else Relaxed("unknown", None, None)
    if isinstance(got, BaseException):
        raise got
    return got


def _latest(found: queue.Queue[list[str]]) -> list[str] | None:
    """The last plan put in ``found`` (waiting a little for one), or None."""
    try:
        saved = found.get(timeout=0.2)
    except queue.Empty:
        return None
    while not found.empty():
        saved = found.get_nowait()
    return saved


def _round_gap(state: PeakState) -> float:
    """HiGHS's gap for a round on a big graph: a share of the solve's gap still open (at most
    ``ROUND_GAP_MAX``), at least the relaxation's own. A wide gap needs the round's plan and a
    rough bound soon (the last tenths of a percent of a round's proof took minutes at 7B), a
    narrow one the proof."""
    best = state.best
    if best is None or best.recompute_cost <= 0 or state.small():
        return state.rel_gap  # a smaller graph's rounds are quick at the relaxation's own gap
    open_gap = (best.recompute_cost - state.bound) / best.recompute_cost
    return max(state.rel_gap, min(ROUND_GAP_MAX, ROUND_GAP_SHARE * open_gap))


def _after_round(state: PeakState, memory: _Rounds, current: tuple[Plan, MemoryCurve], until: float) -> None:
    """The round's plan grafted onto the best, and, where it nearly fits, re-solved with its cuts
    at the budget lowered by its overshoot (unless the bound is what is missing)."""
    over = current[1].peak - state.peak_budget
    if over > 0:
        strategy_graft.run(state, min(state.share(ROUND_GRAFT_SHARE), max(0.0, until - time.perf_counter())),
                           first=current[0])
    _repair_round_plan(state, memory, current[0], over, until)
    if 0 < over <= NEAR_FIT * state.peak_budget and time.perf_counter() < until - 0.5 \
            and not state.done(NEAR_DONE_GAPS):
        lowered = state.relax(state.peak_budget - over, min(until - time.perf_counter(), state.left()),
                              probing=memory.probing)
        if lowered.saved is not None:
            state.offer(lowered.saved, "relaxation with cuts, lowered budget")


def _repair_round_plan(state: PeakState, memory: _Rounds, plan: Plan, over: int, until: float) -> None:
    """On a big graph, the round's plan repaired where it overshoots by at most ``ROUND_REPAIR_FIT``
    of the budget and costs less than the best by more than the solve's gap (once)."""
    if state.small() or not 0 < over <= ROUND_REPAIR_FIT * state.peak_budget:
        return  # a smaller graph's local search starts from the rounds' plans
    if state.best is not None and plan.recompute_cost >= (1 - state.gap) * state.best.recompute_cost:
        return
    if plan.saved in memory.repaired:
        return
    memory.repaired.add(plan.saved)
    seconds = min(state.share(ROUND_REPAIR_SHARE), until - time.perf_counter(), state.left())
    if seconds <= 0:
        return
    deadline = time.perf_counter() + seconds
    fixed = repair_by_rate(state.problem, plan.saved, state.peak_budget, state.budget, deadline=deadline)
    if fixed is None:
        return
    state.offer(fixed.saved, "repair of a cut round's plan")
    # the repair's last move often frees more than the overshoot: saving values back spends it
    judge = Judge(state.problem, state.peak_budget, state.budget, deadline, ROUND_SPEND_EVALUATIONS, quick=True)
    spent = spend_budget(state.problem, fixed.saved, state.peak_budget, state.budget,
                         max_evaluations=ROUND_SPEND_EVALUATIONS, judge=judge)
    if spent is not None and spent.saved != fixed.saved:
        state.offer(spent.saved, "repair of a cut round's plan, budget spent")
