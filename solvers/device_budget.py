"""A budget of device memory ("80GiB per H100") for a step trained as ``solvers.training`` says.

Two ways to plan against it, both torch-free:

* exact: ``solvers.rank_memory.with_rank_memory(problem, setup)`` is the problem whose simulated
  peak is the rank's whole memory at every position (FSDP's gathered parameters depend on where
  the peak is); give its peak search or fast default the device bytes as the peak budget;
* conservative: ``device_budget(...).peak_budget`` is the device less the most the rank holds
  besides the graph at any position, a budget for the graph's own peak that any peak solver
  (``cpsat``'s rows included) can take as it is.

``device_budget`` refuses up front, with the breakdown and what would fit, where the states alone
(parameters, gradients and optimizer state the rank holds whatever the plan) leave no room for the
step's smallest possible graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from .budget import format_bytes
from .errors import DeviceBudgetError
from .liveness import peak_lower_bound, without_gradients
from .memory_kinds import MemoryKind as K
from .problem import Problem
from .rank_memory import RankModel
from .training import TrainingSetup


@dataclass(frozen=True)
class DeviceBudget:
    device_bytes: int
    states: Mapping[K, int]  # held at the end of the backward whatever the plan
    resident_bound: Mapping[K, int]  # the most held besides the graph at any position, any plan
    graph_floor: int  # no plan's graph peak is lower (``liveness.peak_lower_bound``)
    # whether ``peak_budget`` is for the graph's peak with its gradients (one device, DDP) or
    # without them (FSDP frees each block's at its reduce-scatter: ``resident_bound`` has them)
    count_gradients: bool = True

    @property
    def peak_budget(self) -> int:
        """A budget for the graph's own peak (``count_gradients`` says whether with its
        gradients) under which the rank's whole peak fits the device, wherever the peak falls
        (0 when the bound leaves nothing: plan with ``with_rank_memory``)."""
        return max(0, self.device_bytes - sum(self.resident_bound.values()))

    def describe(self) -> str:
        kinds = ", ".join(f"{k.value} {format_bytes(v)}" for k, v in self.states.items() if v)
        return f"{format_bytes(sum(self.states.values()))} of states ({kinds})"


def rank_states(problem: Problem, setup: TrainingSetup, model: RankModel | None = None) -> dict[K, int]:
    """What the rank holds at the end of the backward whatever the plan: its parameters (sharded
    under FSDP), their gradient shards (FSDP) and the optimizer state; DDP's buckets. ``model``:
    the problem's ``RankModel`` under ``setup``, if the caller has it."""
    model = model or RankModel(problem, setup)
    out = {K.SHARDED_PARAMS: model.sharded_params, K.OPTIMIZER: model.optimizer}
    if setup.sharded:
        out[K.SHARDED_GRADS] = sum(model.grad_shard)
    else:
        out.update({k: v for k, v in model.constant().items() if k not in out})
    return out


def resident_bound(problem: Problem, setup: TrainingSetup, model: RankModel | None = None) -> dict[K, int]:
    """The most the rank holds besides the graph at any position, under any plan: the states,
    and under FSDP the root and two blocks gathered (a recomputation may reach into the block
    before), every block without resharding, the largest all-gather and reduce-scatter buffers,
    and the graph's gradients of the root and of two blocks (the rest are reduce-scattered)."""
    model = model or RankModel(problem, setup)
    out = rank_states(problem, setup, model)
    if not setup.sharded:
        return out
    blocks = model.gathered[:-1]
    root = model.gathered[-1]
    if setup.reshard_after_forward:
        gathered = root + sum(sorted(blocks, reverse=True)[:2])
    else:
        gathered = root + sum(blocks)
    out[K.GATHERED_PARAMS] = gathered
    out[K.GRADIENTS] = root + sum(sorted(blocks, reverse=True)[:2])  # compute dtype, as gathered
    out[K.ALL_GATHER] = max(model.all_gather, default=0)
    out[K.REDUCE_SCATTER] = max(model.reduce, default=0)
    return out


def _what_fits(problem: Problem, setup: TrainingSetup, device_bytes: int, floor: int) -> list[str]:
    """Set-ups that would leave room for the step's smallest graph peak."""
    def fits(s: TrainingSetup) -> bool:
        states = sum(rank_states(problem, s).values())
        return states + floor <= device_bytes

    out = []
    for ranks in (2 ** k for k in range(1, 17)):
        if ranks > setup.shards:
            more = replace(setup, sharding="fsdp", ranks=ranks)
            if fits(more):
                out.append(f"FSDP over {ranks} ranks")
                break
    if setup.optimizer != "none" and setup.state_dtype not in ("bf16", "bfloat16"):
        cheaper = replace(setup, state_dtype="bf16")
        if fits(cheaper):
            out.append("the optimizer state in bf16")
    return out


def device_budget(problem: Problem, setup: TrainingSetup, device_bytes: int) -> DeviceBudget:
    """The rank's budget on a device of ``device_bytes``; raises DeviceBudgetError when the states
    and the smallest graph peak any plan reaches cannot fit together."""
    if device_bytes <= 0:
        raise DeviceBudgetError(f"device memory must be > 0 bytes, got {device_bytes}")
    # under FSDP the graph's gradients do not live to the end: the floor leaves them out
    floor = peak_lower_bound(without_gradients(problem) if setup.sharded else problem)
    model = RankModel(problem, setup)
    states = rank_states(problem, setup, model)
    found = DeviceBudget(device_bytes, states, resident_bound(problem, setup, model), floor,
                         count_gradients=not setup.sharded)
    if sum(states.values()) + floor > device_bytes:
        fix = _what_fits(problem, setup, device_bytes, floor)
        hint = f"; would fit with {' or '.join(fix)}" if fix else "; no sharding or optimizer dtype tried fits"
        raise DeviceBudgetError(
            f"device memory {format_bytes(device_bytes)} cannot hold the step ({setup.describe()}): "
            f"{found.describe()}, and no plan's graph peaks below "
            f"{format_bytes(floor)}{hint}")
    return found
