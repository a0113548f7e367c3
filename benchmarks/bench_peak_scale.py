"""Peak budgets at the scale users plan offline: the LLaMA-7B shape (fake capture) and small
LLaMA-style graphs of 8/32/64 layers.

    python benchmarks/bench_peak_scale.py [--models 7b 32] [--fractions 0.3 0.45 0.6 0.8]
                                          [--time-limit 60] [--torch-fractions 1.0 0.5 0.2 0.0]

Rows per model, every plan simulated by the same simulator (``solvers.liveness``): the floor no
plan can go below, save-all, the default min-cut (``lam="auto"``, h100), checkpointing every
1/2/4/8 blocks (``uniform``), torch's partitioner at ``activation_memory_budget`` fractions, and
opt-remat's ``solve_peak`` at peak budgets = fractions x the min-cut peak (below the floor the
relaxation proves them infeasible). Columns: peak, recompute cost (h100 roofline), proven lower
bound and gap, the cheapest checkpoint-every-k plan that fits the same budget, solve seconds.
"""

from __future__ import annotations

import argparse
import time

import torch

from opt_remat.api import auto_lam
from opt_remat.build import classify, problem_from_joint
from opt_remat.capture import capture
from opt_remat.costs import get_profile
from opt_remat.models import llama
from opt_remat.report import table
from opt_remat.torch_reference import torch_plan
from solvers.baselines import save_all, uniform_checkpoints
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.mincut import solve_mincut
from solvers.peak import PeakInfeasibleError, solve_peak

GIB = 2**30


def _capture(name: str):
    if name == "7b":  # LLaMA-7B shape, batch 8 x 2048, bf16, nothing allocated
        factory = lambda: llama(layers=32, d_model=4096, heads=32, hidden=11008, vocab=32000, seq=2048)  # noqa: E731
        return capture(factory, (torch.zeros(8, 2048, dtype=torch.long),), meta=True, dtype=torch.bfloat16)
    layers = int(name)
    return capture(lambda: llama(layers=layers), (torch.zeros(2, 32, dtype=torch.long),), meta=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["7b", "8", "32", "64"])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.3, 0.45, 0.6, 0.8])
    ap.add_argument("--torch-fractions", type=float, nargs="+", default=[1.0, 0.5, 0.2, 0.0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    rows = []
    for name in args.models:
        unit, unit_name = (GIB, "GiB") if name == "7b" else (2**20, "MiB")
        t_scale, t_name = (1e3, "ms") if name == "7b" else (1e6, "us")
        label = "llama-7b" if name == "7b" else f"llama-{name}L"
        joint = _capture(name)
        prepared, problem = problem_from_joint(joint, device="h100")

        def row(plan_name: str, peak: int | None, cost: float | None, **more) -> None:
            r = {"model": label, "plan": plan_name,
                 f"peak {unit_name}": "-" if peak is None else f"{peak / unit:.2f}",
                 f"recompute {t_name}": "-" if cost is None else f"{cost * t_scale:.2f}"}
            r.update(more)
            rows.append(r)
            print(table([r], list(r)), flush=True)

        row("floor", peak_lower_bound(problem), None)
        sa = save_all(problem)
        row("save-all", simulate_plan(problem, sa.saved).peak, sa.recompute_cost)
        lam = auto_lam(get_profile("h100"))
        mc = solve_mincut(problem, lam)
        mc_peak = simulate_plan(problem, mc.saved).peak
        row("min-cut (lam auto)", mc_peak, mc.recompute_cost)
        checkpoints = []
        for plan in uniform_checkpoints(problem, (1, 2, 4, 8)):
            peak = simulate_plan(problem, plan.saved).peak
            checkpoints.append((peak, plan.recompute_cost))
            row(f"checkpoint every {plan.extra['every']}", peak, plan.recompute_cost)
        for fraction in args.torch_fractions:
            copy = prepared.copy()  # torch's partitioner annotates the graph it is given
            info = classify(copy.module, copy.num_fwd_outputs, copy.static_lifetime_input_indices)
            ref = torch_plan(copy.module, info, problem, fraction=fraction)
            valid = "valid" if not ref.extra["recomputes_banned"] else "recomputes random ops"
            row(f"torch {fraction:g}", simulate_plan(problem, ref.saved).peak, ref.recompute_cost,
                note=valid)
        for fraction in args.fractions:
            budget = int(fraction * mc_peak)
            fitting = [c for p, c in checkpoints if p <= budget]
            cheapest = f"{min(fitting) * t_scale:.2f}" if fitting else "none fits"
            start = time.perf_counter()
            try:
                plan = solve_peak(problem, budget, time_limit_s=args.time_limit)
            except PeakInfeasibleError as exc:
                row(f"opt-remat {fraction:g}x min-cut", None, None, budget=f"{budget / unit:.2f}",
                    **{f"bound {t_name}": "-", "gap": "-", f"checkpoint {t_name}": cheapest,
                       "solve s": f"{time.perf_counter() - start:.1f}",
                       "note": "infeasible" + (" (proven)" if exc.infeasible_proven else "")})
                continue
            row(f"opt-remat {fraction:g}x min-cut", plan.extra["peak"], plan.recompute_cost,
                budget=f"{budget / unit:.2f}",
                **{f"bound {t_name}": f"{plan.bound * t_scale:.2f}", "gap": f"{plan.extra['gap']:.1%}",
                   f"checkpoint {t_name}": cheapest, "solve s": f"{time.perf_counter() - start:.1f}",
                   "note": f"{plan.status.value}, by {plan.extra['found_by']}"})
        start = time.perf_counter()
        try:
            solve_peak(problem, 1, time_limit_s=args.time_limit)
        except PeakInfeasibleError as exc:
            row("opt-remat smallest peak", exc.min_peak, None,
                **{"solve s": f"{time.perf_counter() - start:.1f}"})
    print("\nsummary:")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    print(table([{k: r.get(k, "-") for k in columns} for r in rows], columns))


if __name__ == "__main__":
    main()
