"""Checkpoint tags on a problem's nodes: making them agree with each other and with bans.

``build_problem`` reads the tags of selective activation checkpointing (``node.meta["recompute"]``)
as torch's partitioner does; this module settles what the tags alone would make impossible:

* a value tagged to be recomputed that cannot be recomputed (a random op, or one that reads such a
  value through tagged values: dropout's ``getitem`` outputs inside a checkpointed region) is
  saved instead, with one warning naming the op at the root of the conflict. (Random ops of the
  forward are recomputable by RNG replay, ``opt_remat.rng_replay``; with ``rng_replay=False`` they
  are not, and saving is the safe choice);
* a MUST_SAVE value (user policies, and torch's own: a backward hook on a region's output,
  collectives, effectful ops) that the backward depends on is required when solving, as torch's
  policy documents ("will always be saved"): its bytes are then spent, and solvers recompute from
  it rather than keep more bytes computed from it (torch saves the hooked ``mul`` of a region that
  feeds a layer norm; without this opt-remat kept the norm's ``rsqrt`` and ``mul_1``, 80 B > 64 B).
  If the plan ends up not reading it, it is dropped, as torch's graph extraction drops it.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Iterable, Mapping

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from solvers import Node, Plan, Problem, Role, plan_from_saved


def resolve_tag_conflicts(nodes: list[Node], ban_reasons: Mapping[str, str]) -> list[Node]:
    """``nodes`` (topological order) with ``must_recompute`` dropped where it cannot be honoured.

    A value is obtainable in the backward when it can be saved, or recomputed from obtainable
    inputs. A must-recompute value that is not recomputable can only ever be saved: it is made
    saveable (one warning per root cause). ``ban_reasons`` says why each banned node is banned.
    """
    obtainable: dict[str, bool] = {}
    culprit: dict[str, str] = {}  # unobtainable value -> the op at the root of it
    saved_instead: dict[str, list[str]] = {}
    out: list[Node] = []
    for node in nodes:
        if node.role is Role.BACKWARD:
            out.append(node)
            continue
        missing = next((i for i in node.inputs if not obtainable.get(i, True)), None)
        recomputable = node.role is not Role.INPUT and not node.banned and missing is None
        if node.must_recompute and not recomputable:
            root = node.name if node.banned else culprit.get(missing or "", node.name)
            node = replace(node, must_recompute=False)
            if node.saveable:
                saved_instead.setdefault(root, []).append(node.name)
        ok = recomputable or (node.saveable and not node.must_recompute)
        obtainable[node.name] = ok
        if not ok:
            culprit[node.name] = node.name if node.banned else culprit.get(missing or "", node.name)
        out.append(node)
    by_name = {n.name: n for n in out}
    for root, names in saved_instead.items():
        op = by_name[root].op
        reason = ban_reasons.get(root, "value that cannot be recomputed")
        warnings.warn(
            f"opt-remat: {root} ({op}) is tagged to be recomputed but is a {reason}, which opt-remat "
            f"does not recompute here; saving {', '.join(names)} instead (tag conflicts resolve to saving)",
            stacklevel=3)
    return out


def must_save_values(joint_module: fx.GraphModule) -> list[str]:
    """Names of the joint graph's MUST_SAVE-tagged values (after ``prepare_joint``)."""
    return [n.name for n in joint_module.graph.nodes
            if n.meta.get("recompute") == CheckpointPolicy.MUST_SAVE]


def backward_ancestors(problem: Problem) -> set[str]:
    """Non-backward values that something the backward reads is computed from (itself included)."""
    seen: set[str] = set()
    stack = list(problem.backward_reads)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(i for i in problem.by_name[name].inputs if i not in seen)
    return seen


def require_must_saves(problem: Problem, must_save: Iterable[str]) -> Problem:
    """The problem to solve: MUST_SAVE values the backward depends on are required (so saved, as
    they are banned from recomputation), and solvers treat their bytes as spent when they weigh
    recomputing what is computed from them; torch saves them, and recomputes from them."""
    relevant = backward_ancestors(problem)
    forced = {name for name in must_save if name in relevant and problem.can_save(name)}
    if not forced - problem.required:
        return problem
    return replace(problem, required=problem.required | forced)


def realized_plan(problem: Problem, plan: Plan) -> Plan:
    """``plan`` (made for ``require_must_saves(problem, ...)``) on ``problem`` itself: a required
    MUST_SAVE value that nothing in the backward reads after all is dropped, as torch's graph
    extraction drops it, so that the plan's bytes are what the forward really saves."""
    if plan.saved <= _read_by_backward(problem, plan):
        return plan
    return plan_from_saved(problem, plan.saved, solver=plan.solver, status=plan.status,
                           solve_time_s=plan.solve_time_s, objective=plan.objective,
                           bound=plan.bound, message=plan.message, budget=plan.budget,
                           extra=plan.extra)


def _read_by_backward(problem: Problem, plan: Plan) -> set[str]:
    used = set(problem.backward_reads)
    for r in plan.recomputed:
        used.update(problem.by_name[r].inputs)
    return used
