"""Scale: LLaMA-style joint graphs captured without allocating, partitioned by torch and opt-remat.

    python benchmarks/bench_mincut.py [--layers 8 32 64] [--repeats 2] [--exact] [--time-limit 60]

Prints, per graph: nodes, capture time and peak RSS (fake-tensor capture), torch's
min_cut_rematerialization_partition time (its whole partition, including lowering), opt-remat's
stages (build problem, min-cut, lowering, total) and the ratios. With ``--exact``: CP-SAT and
HiGHS at the saved bytes of torch's ``activation_memory_budget=0.5`` plan (time, gap, cost ratio,
the program's variables before and after presolve), and CP-SAT on the tied problem
(``symmetry="tie"``: one decision per repeated-layer group; its variables, time and cost against
the best untied plan).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from opt_remat.build import build_problem, classify, prepare_joint
from opt_remat.capture import capture
from opt_remat.lower import lower_plan
from opt_remat.models import Llama
from opt_remat.torch_reference import torch_plan
from opt_remat.report import table
from solvers.budget import format_bytes
from solvers.mincut import solve_mincut
from solvers.registry import solve
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
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--exact", action="store_true", help="also time CP-SAT, HiGHS and the tied CP-SAT solve at torch's 0.5 bytes")
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for layers in args.layers:
        def factory(layers=layers):
            return Llama(layers=layers, d_model=args.d_model, heads=4, seq=args.seq)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        joint = capture(factory, (torch.zeros(2, args.seq, dtype=torch.long),), meta=True)
        capture_s = time.perf_counter() - t0
        rss_mb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rss_before) / 1024

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
            "saved": format_bytes(plan.saved_bytes), "peak RSS MB": f"{rss_mb:.0f}",
        })
        if args.exact:
            module = prepare_joint(joint.copy().module)
            info = classify(module, joint.num_fwd_outputs)
            ref = torch_plan(module, info, problem, fraction=0.5)
            best = None
            for key, solver, opts in (("cpsat", "cpsat", {}), ("highs", "milp", {"backend": "highs"}),
                                      ("tied", "cpsat", {"symmetry": "tie"})):
                t = time.perf_counter()
                exact = solve(problem, solver, ref.saved_bytes, time_limit_s=args.time_limit, **opts)
                rows[-1][f"{key} s"] = f"{time.perf_counter() - t:.1f}"
                if key != "tied":
                    rows[-1][f"{key} gap"] = "-" if exact.gap is None else f"{exact.gap:.2%}"
                    e = exact.extra  # variables before -> after the exact presolve
                    rows[-1]["vars"] = f"{e['num_vars'] + e['presolve_merged'] + e['presolve_fixed']}->{e['num_vars']}"
                    best = exact.recompute_cost if best is None else min(best, exact.recompute_cost)
                else:  # optimal for the tied problem: how far from the best untied plan
                    rows[-1]["tied vars"] = exact.extra.get("tie_vars", "-")
                    rows[-1]["tied/best cost"] = f"{exact.recompute_cost / best:.3f}" if best else "-"
                rows[-1][f"{key}/torch cost"] = (f"{exact.recompute_cost / ref.recompute_cost:.2f}"
                                                 if ref.recompute_cost > 0 else "-")
        print(table(rows[-1:], list(rows[-1])), flush=True)
    print("\nsummary (best of %d):" % args.repeats)
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
