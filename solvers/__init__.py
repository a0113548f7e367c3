"""Pure optimization for opt-remat: the problem model and its solvers. No torch import here."""

from .problem import (CheckResult, Node, Plan, PlanError, Problem, ProblemError, Role, Status,
                      check_plan, plan_from_saved, recompute_closure)
from .mincut import InfeasibleError, mincut_under_budget, solve_mincut

__all__ = [
    "CheckResult", "InfeasibleError", "Node", "Plan", "PlanError", "Problem", "ProblemError", "Role",
    "Status", "check_plan", "mincut_under_budget", "plan_from_saved", "recompute_closure",
    "solve_mincut",
]
