"""opt-remat's exact solvers against torch's partitioner at the same saved bytes.

    python benchmarks/bench_budgets.py [--models gpt llama] [--layers 4] [--fractions 1.0 0.8 0.5 0.3 0.1]
                                       [--time-limit 60]

For each model and each torch ``activation_memory_budget`` fraction: run torch's partitioner,
measure what it saves (in opt-remat's metric: saved tensors that are not graph inputs, a storage
once), give opt-remat's exact solvers (CP-SAT, HiGHS) that same number of bytes, and print saved
bytes, recompute flops, roofline recompute cost, solve time and gap for both, plus whether torch's
plan recomputes random ops (which makes its gradients wrong). opt-remat recomputes random ops by
replaying their RNG state (``rng_replay``, on by default): per model the smallest feasible saved
bytes and the smallest peak found (min-cut and checkpointing plans) are printed with and without
replay, and the CP-SAT columns "no replay" give the cost of today's plans without it.
"""

from __future__ import annotations

import argparse
import time

import torch

from opt_remat.build import build_problem, classify, prepare_joint
from opt_remat.capture import capture
from opt_remat.costs import node_flops
from opt_remat.models import GPT, Llama, example_inputs
from opt_remat.report import table
from opt_remat.torch_reference import torch_plan
from solvers.budget import format_bytes
from solvers.mincut import solve_mincut
from solvers.peak.candidates import frontier_plans
from solvers.catalog import SAVED, solve, typed_options


def smallest_peak(problem) -> int:
    """The smallest simulated peak of the cheap plans (min-cut across its trade-off, checkpointing)."""
    return min(peak for _, peak in frontier_plans(problem))


def flops_of(module, names) -> int:
    by_name = {n.name: n for n in module.graph.nodes}
    return sum(node_flops(by_name[n]) for n in names if n in by_name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt", "llama"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.8, 0.5, 0.3, 0.1])
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        def factory(name: str = name) -> torch.nn.Module:
            if name == "gpt":
                return GPT(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, dropout=0.1)
            return Llama(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq)
        model = factory()
        joint = capture(factory, example_inputs("gpt2" if name == "gpt" else "llama", model), meta=True)
        # torch's partitioner runs on the graph without opt-remat's RNG-state nodes
        module = prepare_joint(joint.copy().module, rng_replay=False)
        info = classify(module, joint.num_fwd_outputs)
        plain = build_problem(module, num_fwd_outputs=joint.num_fwd_outputs, node_info=info)
        replay_module = prepare_joint(joint.copy().module)
        problem = build_problem(replay_module, num_fwd_outputs=joint.num_fwd_outputs,
                                node_info=classify(replay_module, joint.num_fwd_outputs))
        print(f"{name}-{args.layers}L smallest saved bytes: {format_bytes(solve_mincut(problem, 0.0).saved_bytes)} "
              f"with RNG replay, {format_bytes(solve_mincut(plain, 0.0).saved_bytes)} without; smallest peak "
              f"found: {format_bytes(smallest_peak(problem))} with, {format_bytes(smallest_peak(plain))} without",
              flush=True)
        for fraction in args.fractions:
            ref = torch_plan(module, info, plain, fraction=fraction)
            row = {"model": f"{name}-{args.layers}L", "nodes": len(problem.nodes), "torch budget": fraction,
                   "saved": format_bytes(ref.saved_bytes),
                   "torch GFLOP": f"{flops_of(module, ref.recomputed) / 1e9:.3f}",
                   "torch us": f"{ref.recompute_cost * 1e6:.2f}", "torch s": f"{ref.solve_time_s:.2f}",
                   "torch rand recompute": "YES" if ref.extra["recomputes_banned"] else "no"}
            for solver, opts in (("cpsat", {"time_limit_s": args.time_limit}),
                                 ("milp", {"backend": "highs", "time_limit_s": args.time_limit})):
                start = time.perf_counter()
                plan = solve(problem, solver, ref.saved_bytes, typed_options(solver, opts, SAVED))
                key = "cpsat" if solver == "cpsat" else "highs"
                row[f"{key} us"] = f"{plan.recompute_cost * 1e6:.2f}"
                row[f"{key} GFLOP"] = f"{flops_of(module, plan.recomputed) / 1e9:.3f}"
                row[f"{key} s"] = f"{time.perf_counter() - start:.2f}"
                row[f"{key} gap"] = "-" if plan.gap is None else f"{plan.gap:.2%}"
            try:  # today's plan: random ops never recomputed
                old = solve(plain, "cpsat", ref.saved_bytes, time_limit_s=args.time_limit)
                row["cpsat us no replay"] = f"{old.recompute_cost * 1e6:.2f}"
            except Exception:  # below the floor without replay
                row["cpsat us no replay"] = "infeasible"
            row["cpsat/torch cost"] = (f"{float(row['cpsat us']) / float(row['torch us']):.2f}"
                                       if float(row["torch us"]) > 0 else "-")
            rows.append(row)
            print(table(rows[-1:], list(rows[-1])), flush=True)
    print("\nsummary:")
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
