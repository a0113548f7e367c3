"""Checking a plan on the captured model (in this process): the saved bytes the lowered forward
really hands to the backward, and a training step's loss and gradients against save-all's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from solvers import Plan

from ..formats.plan_file import graph_hash
from .config import Config
from .util import RunError, quiet_torch
from .workload import Workload


def measure_plan(work: Workload, plan: Plan) -> int:
    """Bytes the forward really hands to the backward when the plan is lowered."""
    from ..build import classify
    from ..lower import lower_plan
    from ..verify import measured_saved_bytes

    with quiet_torch():
        joint = work.prepared.copy()
        info = classify(joint.module, joint.num_fwd_outputs, joint.static_lifetime_input_indices)
        fw, _ = lower_plan(joint.module, plan, num_fwd_outputs=joint.num_fwd_outputs,
                           static_lifetime_input_nodes=info.static_lifetime_input_nodes)
        return measured_saved_bytes(fw, joint.num_fwd_outputs)


class _PlanPartition:
    """A partition_fn that lowers one given plan (as it is, even one that breaks opt-remat's bans,
    like torch's baseline recomputing random ops) on the graph it was solved for."""

    def __init__(self, plan: Plan, expected_hash: str, profile: Any) -> None:
        self.plan, self.expected_hash, self.profile = plan, expected_hash, profile
        self.calls = 0

    def __call__(self, joint_module: Any, joint_inputs: Any, *args: Any, num_fwd_outputs: int,
                 static_lifetime_input_indices: list[int] | None = None, **kwargs: Any) -> Any:
        from ..build import build_problem, classify, prepare_joint
        from ..lower import lower_plan

        self.calls += 1
        joint_module = prepare_joint(joint_module)
        info = classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
        problem = build_problem(joint_module, num_fwd_outputs=num_fwd_outputs, device=self.profile, node_info=info)
        if graph_hash(problem) != self.expected_hash:
            raise RunError(f"the training step's graph (hash {graph_hash(problem)}) is not the captured one "
                           f"({self.expected_hash})")
        return lower_plan(joint_module, self.plan, num_fwd_outputs=num_fwd_outputs,
                          static_lifetime_input_nodes=info.static_lifetime_input_nodes)


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
    from ..verify import compare_steps, save_all_backend, training_step

    with quiet_torch():
        if work.reference is None:
            torch._dynamo.reset()
            # inductor's random ops and fusions differ from eager's: compare like with like
            ref_be = (save_all_backend(cfg.decompositions) if cfg.compiler == "eager"
                      else opt_remat.backend("save-all", compiler="inductor"))
            work.reference = training_step(work.model, work.inputs, ref_be, seed=cfg.seed, loss_fn=work.loss_fn)
        torch._dynamo.reset()
        pfn = _PlanPartition(plan, work.graph_hash, work.profile)
        be = opt_remat.backend(compiler=cfg.compiler, decompositions=cfg.decompositions, partition_fn=pfn)  # type: ignore[arg-type]
        try:
            step = training_step(work.model, work.inputs, be, seed=cfg.seed, loss_fn=work.loss_fn)
        finally:
            torch._dynamo.reset()
    check = compare_steps(step, work.reference)
    notes = []
    if pfn.calls != 1:
        notes.append(f"the step compiled to {pfn.calls} graphs")
    banned = list((plan.extra or {}).get("recomputes_banned") or [])
    if banned:
        notes.append(f"recomputes {len(banned)} value(s) opt-remat never recomputes (e.g. {', '.join(banned[:2])})")
    ok = check.ok and check.max_rel_error <= cfg.spec.verify.tolerance and pfn.calls == 1
    return StepCheck(ok, check.bitwise, check.max_rel_error, check.loss_a, check.loss_b, "; ".join(notes))
