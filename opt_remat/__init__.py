"""opt-remat: choose which activations a PyTorch training step saves and which it recomputes."""

from .api import Partitioner, PartitionRecord, backend, partitioner
from .build import GraphError, build_problem
from .costs import PROFILES, DeviceProfile, get_profile
from .errors import unwrap
from .lower import lower_plan
from .memory import PeakMeter, simulate
from .solve import BudgetError, PeakBudgetError

__all__ = [
    "BudgetError", "DeviceProfile", "PeakBudgetError", "PeakMeter", "simulate", "GraphError", "PROFILES", "PartitionRecord", "Partitioner",
    "backend", "build_problem", "get_profile", "lower_plan", "partitioner", "unwrap",
]
