"""Pure optimization for opt-remat: the problem model and its solvers. No torch import here."""

from .errors import InfeasibleError, OptRematError, PlanError, ProblemError
from .mincut import mincut_under_budget, solve_mincut
from .problem import (CheckResult, Node, Plan, Problem, Role, Status, check_plan, plan_from_saved,
                      recompute_closure)

__all__ = [
    "CheckResult", "InfeasibleError", "Node", "OptRematError", "Plan", "PlanError", "Problem", "ProblemError", "Role",
    "Status", "check_plan", "mincut_under_budget", "plan_from_saved", "recompute_closure",
    "solve_mincut",
]
