"""What torch's own partitioner would save on a prepared joint graph, as a set of node names.

Used as the top anchor of fractional budgets (torch's ``activation_memory_budget`` = 1.0 is its
runtime-optimized min-cut) and by the ``torch`` baseline.
"""

from __future__ import annotations

import time

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp

from solvers import Plan, Problem, Status, recompute_closure
from solvers.budget import format_bytes


def _annotate_dist_from_bw(joint_module: fx.GraphModule, info: tp.NodeInfo) -> None:
    # torch's solve_min_cut reads node.dist_from_bw, set in min_cut_rematerialization_partition
    for node in reversed(joint_module.graph.nodes):
        if node.op == "output" or info.is_required_fw(node):
            node.dist_from_bw = int(1e9)
            if node.op != "output":
                for user in node.users:
                    node.dist_from_bw = min(node.dist_from_bw, user.dist_from_bw + 1)
        else:
            node.dist_from_bw = 0


def torch_saved_values(joint_module: fx.GraphModule, info: tp.NodeInfo,
                       memory_budget: float = 1.0) -> set[str]:
    """Names torch's ``choose_saved_values_set`` picks at ``activation_memory_budget``."""
    _annotate_dist_from_bw(joint_module, info)
    with functorch_config.patch(activation_memory_budget=memory_budget):
        saved = tp.choose_saved_values_set(joint_module.graph, info, memory_budget=memory_budget)
    return {n.name for n in saved}


def torch_runtime_optimized_saved(joint_module: fx.GraphModule, info: tp.NodeInfo) -> set[str]:
    """torch's default min-cut (its budget 1.0 plan)."""
    return torch_saved_values(joint_module, info, 1.0)


def plan_of_saved_set(problem: Problem, saved: set[str], *, solver: str, budget: int | None,
                      solve_time_s: float, extra: dict | None = None) -> Plan:
    """Read a foreign saved set back as a plan, even one that breaks this project's bans.

    torch may recompute values opt-remat bans (random ops under a memory budget): those are listed
    in ``extra["recomputes_banned"]`` and the message, instead of being rejected.
    """
    saved = {s for s in saved if s in problem.by_name}
    recomputed, _ = recompute_closure(problem, saved, ignore_bans=True)
    banned = sorted(r for r in recomputed if not problem.can_recompute(r))
    used = set(problem.backward_reads).union(*(problem.by_name[r].inputs for r in recomputed))
    kept = frozenset(s for s in saved if s in used)
    saved_bytes = problem.saved_bytes(kept)
    over = budget is not None and saved_bytes > budget
    notes = []
    if banned:
        # a banned RNG state in the closure: torch recomputes its random op without replaying it
        shown = [(f"{problem.users[b][0]} without its RNG state" if problem.by_name[b].op == "rng_state"
                  and problem.users[b] else b) for b in banned[:3]]
        notes.append(f"recomputes {len(banned)} value(s) opt-remat never recomputes "
                     f"(e.g. {', '.join(shown)}): random ops give different gradients")
    if over:
        notes.append(f"exceeds the budget: {format_bytes(saved_bytes)} > {format_bytes(budget)}")
    return Plan(saved=kept, recomputed=frozenset(recomputed), saved_bytes=saved_bytes,
                recompute_cost=problem.recompute_cost(recomputed), solver=solver,
                status=Status.INFEASIBLE if over else Status.HEURISTIC, solve_time_s=solve_time_s,
                message="; ".join(notes), budget=budget,
                extra={**(extra or {}), "recomputes_banned": banned})


def torch_plan(joint_module: fx.GraphModule, info: tp.NodeInfo, problem: Problem,
               budget: int | None = None, *, fraction: float | None = None,
               iterations: int = 10) -> Plan:
    """torch's partitioner as a baseline: its plan at ``activation_memory_budget=fraction``, or,
    for a budget in bytes, at the largest fraction whose plan fits (a bisection on the fraction)."""
    start = time.perf_counter()
    if budget is None or fraction is not None:
        f = 1.0 if fraction is None else float(fraction)
        saved = torch_saved_values(joint_module, info, f)
    else:
        f, saved = 1.0, torch_saved_values(joint_module, info, 1.0)
        if problem.saved_bytes(s for s in saved if s in problem.by_name) > budget:
            lo, hi = 0.0, 1.0
            f, saved = 0.0, torch_saved_values(joint_module, info, 0.0)
            for _ in range(iterations):
                mid = (lo + hi) / 2
                candidate = torch_saved_values(joint_module, info, mid)
                if problem.saved_bytes(s for s in candidate if s in problem.by_name) <= budget:
                    lo, f, saved = mid, mid, candidate
                else:
                    hi = mid
    return plan_of_saved_set(problem, saved, solver="torch", budget=budget,
                             solve_time_s=time.perf_counter() - start, extra={"torch_fraction": f})
