"""opt-remat's peak-budget solver against torch's partitioner at the same step peak.

    python benchmarks/bench_peak.py [--models gpt2 llama] [--layers 2]
                                    [--fractions 1.0 0.8 0.5 0.3 0.2 0.1 0.0] [--time-limit 20]

For each model and each torch ``activation_memory_budget`` fraction: run torch's partitioner,
simulate its plan's step peak (``solvers.liveness``, which equals the measured peak when the plans
run), and whether it is valid (torch may recompute dropout's random values, which changes the
gradients); then give ``peak_search`` (solver peak-search) that peak as its budget and print peak, recompute
cost, cost ratio, solve time and status. A last row per model compares the smallest peak of torch's
valid plans with the smallest peak opt-remat reaches (what ``PeakInfeasibleError`` names for a
budget of 1 byte) and with the floor no plan can go below (``peak_lower_bound``).
"""

from __future__ import annotations

import argparse
import time

import torch

from opt_remat.build import build_problem, classify, prepare_joint
from opt_remat.capture import capture
from opt_remat.models import example_inputs, gpt2, llama
from opt_remat.report import table
from opt_remat.torch_reference import torch_plan
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.options import PeakSearchOptions
from solvers.peak import PeakInfeasibleError, peak_search


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.8, 0.5, 0.3, 0.2, 0.1, 0.0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--skip-invalid", action="store_true",
                    help="do not solve at the peaks of torch plans that recompute random ops")
    args = ap.parse_args()
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        model = gpt2(layers=args.layers, dropout=0.1) if name == "gpt2" else llama(layers=args.layers)
        joint = capture(model, example_inputs(name, model), decompositions="inductor")
        module = prepare_joint(joint.module)
        info = classify(module, joint.num_fwd_outputs)
        problem = build_problem(module, num_fwd_outputs=joint.num_fwd_outputs, node_info=info)
        label = f"{name}-{args.layers}L"
        torch_peaks = []
        for fraction in args.fractions:
            ref = torch_plan(module, info, problem, fraction=fraction)
            peak = simulate_plan(problem, ref.saved).peak
            valid = not ref.extra["recomputes_banned"]
            if valid:
                torch_peaks.append(peak)
            row = {"model": label, "torch budget": f"{fraction:g}", "torch peak": peak,
                   "torch valid": "yes" if valid else "NO (recomputes rand)",
                   "torch us": f"{ref.recompute_cost * 1e6:.3f}"}
            if valid or not args.skip_invalid:
                start = time.perf_counter()
                try:
                    plan = peak_search(problem, peak, options=PeakSearchOptions(time_limit_s=args.time_limit))
                    ours = plan.extra["peak"]
                    row.update({"ours peak": ours, "ours us": f"{plan.recompute_cost * 1e6:.3f}",
                                "cost ratio": (f"{plan.recompute_cost / ref.recompute_cost:.2f}"
                                               if ref.recompute_cost > 0 else "-"),
                                "status": plan.status.value
                                + (" +search" if plan.extra.get("local_search") else "")})
                except PeakInfeasibleError as exc:
                    row.update({"ours peak": f"none (min {exc.min_peak})", "ours us": "-",
                                "cost ratio": "-", "status": "infeasible"})
                row["ours s"] = f"{time.perf_counter() - start:.1f}"
            rows.append(row)
            print(table(rows[-1:], list(rows[-1])), flush=True)
        start = time.perf_counter()
        try:
            peak_search(problem, 1, options=PeakSearchOptions(time_limit_s=args.time_limit))
            ours_min = None
        except PeakInfeasibleError as exc:
            ours_min = exc.min_peak
        torch_min = min(torch_peaks) if torch_peaks else None
        floor = peak_lower_bound(problem)
        rows.append({"model": label, "torch budget": "smallest", "torch peak": torch_min if torch_min else "-",
                     "torch valid": "valid plans", "torch us": "-", "ours peak": ours_min, "ours us": "-",
                     "cost ratio": (f"peak {ours_min / torch_min:.2f}x" if ours_min and torch_min else "-"),
                     "status": "min peak", "ours s": f"{time.perf_counter() - start:.1f}",
                     # no plan can peak below the floor: how close the smallest peak found is
                     "floor": floor, "ours / floor": f"{ours_min / floor:.3f}" if ours_min and floor else "-"})
        print(table(rows[-1:], list(rows[-1])), flush=True)
    print("\nsummary:")
    columns = list(dict.fromkeys(k for row in rows for k in row))
    print(table([{k: row.get(k, "-") for k in columns} for row in rows], columns))


if __name__ == "__main__":
    main()
