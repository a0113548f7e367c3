"""opt-remat: choose which activations a PyTorch training step saves and which it recomputes.

Names are imported on first use, so that ``opt-remat --help`` and the solver-only modules do not
pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Partitioner": "api", "PartitionRecord": "api", "backend": "api", "partitioner": "api",
    "GraphError": "errors", "OptRematError": "errors", "build_problem": "build",
    "PROFILES": "costs", "DeviceProfile": "costs", "get_profile": "costs",
    "unwrap": "errors", "PlanMismatchError": "errors", "lower_plan": "lower",
    "PeakMeter": "memory", "simulate": "memory",
    "BudgetError": "errors", "PeakBudgetError": "errors", "SolveInterrupted": "errors",
    "DeviceBudgetError": "errors", "save_plans": "plans",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'opt_remat' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
