"""The peak relaxation's plans for the fast default on small graphs, with work bounded by
counts: HiGHS's branch-and-bound nodes (``NODE_LIMIT``) and a fixed number of re-solves at
budgets lowered by what the plan overshoots the simulation (``LOWERED_SOLVES``), so the plans do
not depend on the machine's load. On the small HF models the relaxation's plan at the budget is
often the optimum (the bound equals its cost) or overshoots by a few percent; its re-solves fit.
``TIME_SAFETY_S`` only stops a pathological solve: it is far above what these graphs take.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..liveness import simulate_plan
from ..mip_model import build_model, presolve
from ..errors import PlanError
from ..problem import Plan, Problem, Status, plan_from_saved
from .relaxation import solve_relaxation
from .rows import peak_rows

# graphs up to this many candidate values get the relaxation (HiGHS solves theirs in ~0.2-2 s)
MAX_VALUES = 600
NODE_LIMIT = 200
LOWERED_SOLVES = 3
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


def relaxed_plans(problem: Problem, peak_budget: int, budget: int | None = None) -> RelaxedPlans:
    """The relaxation's plan at ``peak_budget`` and, while it overshoots, at budgets lowered by
    the overshoot (at most ``LOWERED_SOLVES``); each simulated."""
    model = presolve(problem, build_model(problem), for_peak=True)
    rows = peak_rows(problem)
    out: list[tuple[Plan, int]] = []
    target, bound = peak_budget, None
    for attempt in range(1 + LOWERED_SOLVES):
        got = solve_relaxation(problem, model, rows, target, budget, time_limit_s=TIME_SAFETY_S,
                               rel_gap=REL_GAP, node_limit=NODE_LIMIT, threads=1)
        if attempt == 0:
            if got.status == "infeasible":
                return RelaxedPlans([], True, None)
            bound = got.bound if got.status == "optimal" else None
        if got.saved is None:
            break
        try:
            plan = plan_from_saved(problem, got.saved, solver="relaxation", status=Status.HEURISTIC)
        except PlanError:
            break
        peak = simulate_plan(problem, plan.saved).peak
        out.append((plan, peak))
        over = peak - peak_budget
        if over <= 0 or over > RESOLVE_MAX_OVER * peak_budget:
            break
        target -= max(over, peak_budget // 100)
        if target <= 0:
            break
    return RelaxedPlans(out, False, bound)
