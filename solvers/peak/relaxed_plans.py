"""The peak relaxation's plans for the fast default on small graphs, with work bounded by
counts: HiGHS's branch-and-bound nodes (``NODE_LIMIT``), a fixed number of cut rounds where the
plan overshoots the simulation (``CUT_ROUNDS``: the rows of ``solvers.peak.cuts`` at the steps it
overshoots, as the peak search's cut rounds) and of re-solves at budgets lowered by the overshoot
(``LOWERED_SOLVES``), so the plans do not depend on the machine's load. On the small HF models
the relaxation's plan at the budget is often the optimum (the bound equals its cost) or
overshoots by a few percent; its cut rounds or re-solves fit.
``TIME_SAFETY_S`` only stops a pathological solve: it is far above what these graphs take.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import interrupt
from ..liveness import simulate_plan
from ..mip_model import build_model, presolve
from ..errors import PlanError
from ..problem import Plan, Problem, Status, plan_from_saved
from .cuts import CutContext, violated_steps
from .relaxation import solve_relaxation
from .rows import peak_rows, relaxed_live

# graphs up to this many candidate values get the relaxation (HiGHS solves theirs in ~0.2-2 s)
MAX_VALUES = 600
NODE_LIMIT = 200
LOWERED_SOLVES = 3
# cut rounds (each: rows at CUTS_PER_ROUND steps the plan overshoots, then a re-solve) before
# the lowered budgets, while the plan overshoots by at most CUT_MAX_OVER; FCN8 at 0.9/0.7 x its
# no-recompute peak needs 1-3 (overshoot < 1%); a far plan (Mixtral: 10-40%) gains nothing from
# them and each costs seconds
CUT_ROUNDS = 4
CUTS_PER_ROUND = 2
CUT_MAX_OVER = 0.05
# ... on graphs of more candidate values than this (below, a solve takes milliseconds)
CUT_ANY_MAX_VALUES = 200
# a plan overshooting by more than this share is not re-solved lower: the relaxation is loose
# there (T5), and the re-solves rarely fit
RESOLVE_MAX_OVER = 0.3
REL_GAP = 0.0025
TIME_SAFETY_S = 60.0


@dataclass
class RelaxedPlans:
    plans: list[tuple[Plan, int]]  # the relaxation's plans with their simulated peaks
    infeasible: bool  # the relaxation admits no plan at the budget: none can fit
    bound: float | None  # its proven bound at the budget (None: not proven)


def relaxed_plans(problem: Problem, peak_budget: int, budget: int | None = None, *,
                  cut_rounds: int = CUT_ROUNDS, lowered: int = LOWERED_SOLVES) -> RelaxedPlans:
    """The relaxation's plan at ``peak_budget``; while it overshoots (by at most
    ``CUT_MAX_OVER`` on graphs over ``CUT_ANY_MAX_VALUES`` values), re-solved with cut rows where
    it overshoots (at most ``cut_rounds``), then at budgets lowered by the overshoot (at most
    ``lowered``); each simulated."""
    model = presolve(problem, build_model(problem), for_peak=True)
    rows = peak_rows(problem)
    ctx = CutContext(problem, model, rows)
    steps: list[int] = []
    out: list[tuple[Plan, int]] = []
    bound: float | None = None

    def solve(target: int) -> tuple[str, float | None, tuple[Plan, object] | None]:
        got = solve_relaxation(problem, model, rows, target, budget, time_limit_s=TIME_SAFETY_S,
                               rel_gap=REL_GAP, node_limit=NODE_LIMIT, threads=1, cuts=(ctx, steps))
        if got.saved is None:
            return got.status, got.bound, None
        try:
            plan = plan_from_saved(problem, got.saved, solver="relaxation", status=Status.HEURISTIC)
        except PlanError:
            return got.status, got.bound, None
        curve = simulate_plan(problem, plan.saved)
        out.append((plan, curve.peak))
        return got.status, got.bound, (plan, curve)

    status, got_bound, last = solve(peak_budget)
    if status == "infeasible":
        return RelaxedPlans([], True, None)
    bound = got_bound if status == "optimal" else None
    max_over = None if len(problem.candidates) <= CUT_ANY_MAX_VALUES else CUT_MAX_OVER * peak_budget
    for _ in range(cut_rounds):
        if interrupt.requested():  # Ctrl-C: the plans so far (the peak search starts from them)
            break
        if last is None or out[-1][1] <= peak_budget or max_over is not None and out[-1][1] - peak_budget > max_over:
            break
        plan, curve = last
        new = violated_steps(problem, curve, peak_budget, count=CUTS_PER_ROUND, skip=set(steps),
                             relaxed=None if steps else relaxed_live(problem, rows, set(plan.saved),
                                                                     set(plan.recomputed)))
        if not new:
            break
        for k in new:
            ctx.note(k, set(plan.saved), set(plan.recomputed))
        steps.extend(new)
        status, got_bound, again = solve(peak_budget)
        if status == "infeasible":  # the cut rows hold for every plan that fits
            return RelaxedPlans(out, True, None)
        if status == "optimal" and got_bound is not None:
            bound = max(bound or 0.0, got_bound)
        last = again or last
    target = peak_budget
    for _ in range(lowered):
        if interrupt.requested():
            break
        over = min(peak for _, peak in out) - peak_budget if out else 0
        if over <= 0 or over > RESOLVE_MAX_OVER * peak_budget:
            break
        target -= max(over, peak_budget // 100)
        if target <= 0:
            break
        _, _, again = solve(target)
        if again is None:
            break
    return RelaxedPlans(out, False, bound)
