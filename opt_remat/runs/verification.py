"""Checking a plan on the captured model (in this process): the saved bytes the lowered forward
really hands to the backward, and a training step's loss and gradients against save-all's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

from solvers import Plan

from ..formats.plan_file import graph_hash
from .. import road
from ..request import SolveRequest
from ..verify import compare_steps, measured_saved_bytes, save_all_backend, training_step
from .config import Config
from .util import RunError, quiet_torch
from .workload import Workload


def measure_plan(work: Workload, plan: Plan) -> int:
    """Bytes the forward really hands to the backward when the plan is lowered."""
    with quiet_torch():
        prepared = work.prepared.copy()  # lowering edits the graph: the workload keeps its own
        fw, _ = road.lower(prepared, plan)
        return measured_saved_bytes(fw, prepared.num_fwd_outputs)


class _PlanPartition:
    """A partition_fn that lowers one given plan (as it is, even one that breaks opt-remat's bans,
    like torch's baseline recomputing random ops) on the graph it was solved for, prepared as the
    run prepared it (``work.request``)."""

    def __init__(self, plan: Plan, expected_hash: str, request: SolveRequest) -> None:
        # costs do not change the graph (nor its hash): not timed again
        self.plan, self.expected_hash, self.request = plan, expected_hash, replace(request, costs="roofline")
        self.calls = 0

    def __call__(self, joint_module: Any, joint_inputs: Any, *args: Any, num_fwd_outputs: int,
                 static_lifetime_input_indices: list[int] | None = None, **kwargs: Any) -> Any:
        self.calls += 1
        prepared = road.prepare(joint_module, num_fwd_outputs, static_lifetime_input_indices, self.request)
        if graph_hash(prepared.problem) != self.expected_hash:
            raise RunError(f"the training step's graph (hash {graph_hash(prepared.problem)}) is not the captured one "
                           f"({self.expected_hash})")
        return road.lower(prepared, self.plan)


@dataclass
class StepCheck:
    """A training step with the plan against save-all's: loss and gradients."""
    verified: bool
    bitwise: bool
    max_rel_error: float
    loss: float | None
    loss_reference: float | None
    note: str = ""


def verify_gradients(cfg: Config, work: Workload, plan: Plan) -> StepCheck:
    """A training step of the model compiled with the plan (lowered on torch.compile's own joint
    graph, with the configured compiler), against torch's save-all partition: loss and gradients."""
    import torch

    import opt_remat

    with quiet_torch():
        if work.reference is None:
            torch._dynamo.reset()
            # inductor's random ops and fusions differ from eager's: compare like with like
            ref_be = (save_all_backend(cfg.decompositions) if cfg.compiler == "eager"
                      else opt_remat.backend("save-all", compiler="inductor"))
            work.reference = training_step(work.model, work.inputs, ref_be, seed=cfg.seed, loss_fn=work.loss_fn)
        torch._dynamo.reset()
        pfn = _PlanPartition(plan, work.graph_hash, work.request)
        be = opt_remat.backend(compiler=cfg.compiler, decompositions=cfg.decompositions, partition_fn=pfn)
        try:
            step = training_step(work.model, work.inputs, be, seed=cfg.seed, loss_fn=work.loss_fn)
        finally:
            torch._dynamo.reset()
    check = compare_steps(step, work.reference)
    notes = []
    if pfn.calls != 1:
        notes.append(f"the step compiled to {pfn.calls} graphs")
    banned = list(cast("list[str]", (plan.extra or {}).get("recomputes_banned") or []))
    if banned:
        notes.append(f"recomputes {len(banned)} value(s) opt-remat never recomputes (e.g. {', '.join(banned[:2])})")
    ok = check.ok and check.max_rel_error <= cfg.spec.verify.tolerance and pfn.calls == 1
    return StepCheck(ok, check.bitwise, check.max_rel_error, check.loss_a, check.loss_b, "; ".join(notes))
