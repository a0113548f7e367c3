"""Min-cut speed on LLaMA-style joint graphs, next to torch's own partitioner on the same graph.

    python benchmarks/bench_mincut.py [--layers 8 32] [--repeats 3]

Prints, per graph: nodes, torch's min_cut_rematerialization_partition time (its whole partition,
including lowering), opt-remat's stages (build problem, min-cut, lowering, total) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from opt_remat.build import build_problem, classify, prepare_joint
from opt_remat.capture import capture
from opt_remat.lower import lower_plan
from opt_remat.models import Llama, example_inputs
from opt_remat.report import table
from solvers.budget import format_bytes
from solvers.mincut import solve_mincut
from torch._functorch.partitioners import min_cut_rematerialization_partition


def best_of(repeats: int, fn):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for layers in args.layers:
        model = Llama(layers=layers, d_model=64, heads=4, seq=32)
        t0 = time.perf_counter()
        joint = capture(model, example_inputs("llama", model))
        capture_s = time.perf_counter() - t0

        def run_torch():
            j = joint.copy()
            return min_cut_rematerialization_partition(j.module, None, num_fwd_outputs=j.num_fwd_outputs)
        torch_s, _ = best_of(args.repeats, run_torch)

        stages: dict[str, list[float]] = {"prepare+build": [], "mincut": [], "lower": []}
        for _ in range(args.repeats):
            j = joint.copy()
            t = time.perf_counter()
            module = prepare_joint(j.module)
            info = classify(module, j.num_fwd_outputs)
            problem = build_problem(module, num_fwd_outputs=j.num_fwd_outputs, node_info=info)
            stages["prepare+build"].append(time.perf_counter() - t)
            t = time.perf_counter()
            plan = solve_mincut(problem, 0.1 * 3.35e12)
            stages["mincut"].append(time.perf_counter() - t)
            t = time.perf_counter()
            lower_plan(module, plan, num_fwd_outputs=j.num_fwd_outputs)
            stages["lower"].append(time.perf_counter() - t)
        ours = {k: min(v) for k, v in stages.items()}
        total = sum(ours.values())
        rows.append({
            "layers": layers, "nodes": len(problem.nodes), "capture s": f"{capture_s:.1f}",
            "torch partition s": f"{torch_s:.3f}",
            "ours build s": f"{ours['prepare+build']:.3f}", "ours mincut s": f"{ours['mincut']:.3f}",
            "ours lower s": f"{ours['lower']:.3f}", "ours total s": f"{total:.3f}",
            "mincut / torch": f"{ours['mincut'] / torch_s:.3f}", "total / torch": f"{total / torch_s:.2f}",
            "saved": format_bytes(plan.saved_bytes),
        })
        print(table(rows[-1:], list(rows[-1])), flush=True)
    print("\nsummary (best of %d):" % args.repeats)
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
