"""Device budgets at scale (issue #41): HF LlamaForCausalLM shapes captured on fake tensors in
bf16, trained with FSDP (AdamW, bf16 compute, fp32 sharded states), planned against a device's
memory with the rank's whole memory simulated (``solvers.rank_memory.with_rank_memory``).

    python benchmarks/bench_rank_scale.py [--models 7b 70b] [--device 80GiB] [--solvers default cpsat]

Rows: each solver's plan under the device budget, solved as ``opt-remat`` solves it after capture
(``road.solve_problem``: the refusal check, then the peak solve on the rank's problem), with its
wall and CPU seconds and, for the peak search, its proven gap; the cheapest checkpoint-every-k
plan that fits in the same simulation (and the default path's min-cut, which does not fit), each
with its whole-rank peak split by kind; then the states-only refusal where the ranks are too few.
"""

from __future__ import annotations

import argparse
import time

import torch

from opt_remat import road
from opt_remat.api import auto_lam
from opt_remat.build import problem_from_joint
from opt_remat.capture import capture
from opt_remat.costs import get_profile
from opt_remat.errors import PeakBudgetError
from opt_remat.hf import causal_lm
from opt_remat.request import make_request
from solvers.baselines import uniform_checkpoints
from solvers.budget import parse_budget
from solvers.device_budget import device_budget
from solvers.errors import DeviceBudgetError
from solvers.mincut import solve_mincut
from solvers.rank_memory import rank_peak
from solvers.training import TrainingSetup

GIB = 2**30
# name -> (config, batch, sequence, ranks planned, ranks refused)
MODELS = {
    "7b": ({"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_key_value_heads": 32}, 8, 4096, 8, None),
    "70b": ({"num_hidden_layers": 80, "hidden_size": 8192, "intermediate_size": 28672,
             "num_attention_heads": 64, "num_key_value_heads": 8}, 1, 4096, 64, 8),
}


def _setup(ranks: int) -> TrainingSetup:
    return TrainingSetup(param_dtype="bf16", master_dtype="fp32", reduce_dtype="fp32", optimizer="adamw",
                         state_dtype="fp32", sharding="fsdp", ranks=ranks)


def _row(name: str, problem, saved, setup: TrainingSetup, cost: float, seconds: str = "-") -> str:
    peak = rank_peak(problem, saved, setup)
    kinds = " ".join(f"{k.name.lower()}={v / GIB:.2f}" for k, v in peak.by_kind.items() if v)
    return (f"  {name:<22} peak {peak.total / GIB:7.2f} GiB  recompute {cost * 1e3:8.2f} ms  {seconds:>22}  "
            f"at {peak.phase} {peak.at}\n      {kinds}")


def _solve(problem, solver: str | None, setup: TrainingSetup, device: int, time_limit_s: float) -> str:
    """One solver's row: the plan the road finds under the device budget, timed from the problem."""
    options = {} if solver is None else {"time_limit_s": time_limit_s}
    request = make_request(solver, device_memory=device, training=setup, options=options)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        plan = road.solve_problem(problem, request, None)
    except PeakBudgetError as exc:
        return f"  {solver or 'default'} refused: {exc}"
    seconds = f"{time.perf_counter() - wall:.1f} s ({time.process_time() - cpu:.1f} s CPU)"
    gap = "" if plan.gap is None else f", gap {plan.gap:.1%}"
    return _row(f"{solver or 'default'}{gap}", problem, plan.saved, setup, plan.recompute_cost, seconds)


def run(model: str, device: int, solvers: list[str], time_limit_s: float) -> None:
    config, batch, seq, ranks, refused = MODELS[model]
    config = {**config, "vocab_size": 32000, "max_position_embeddings": seq, "attn_implementation": "sdpa"}
    start = time.perf_counter()
    joint = capture(lambda: causal_lm("LlamaForCausalLM", config), (torch.zeros(batch, seq, dtype=torch.long),),
                    meta=True, dtype=torch.bfloat16)
    problem = problem_from_joint(joint)[1]
    print(f"\n{model}: batch {batch} x {seq}, {len(problem.nodes)} values, captured in "
          f"{time.perf_counter() - start:.0f} s; device {device / GIB:.0f} GiB")
    setup = _setup(ranks)
    print(f" FSDP over {ranks} ranks:")
    budget = device_budget(problem, setup, device)
    print(f"  {budget.describe()}; conservative graph budget {budget.peak_budget / GIB:.2f} GiB")
    mincut = solve_mincut(problem, auto_lam(get_profile("h100")))  # the default path's min-cut
    print(_row("min-cut (default path)", problem, mincut.saved, setup, mincut.recompute_cost))
    for solver in solvers:
        print(_solve(problem, None if solver == "default" else solver, setup, device, time_limit_s))
    fitting = [p for p in uniform_checkpoints(problem, (1, 2, 4, 8))
               if rank_peak(problem, p.saved, setup).total <= device]
    if fitting:
        best = min(fitting, key=lambda p: p.recompute_cost)
        print(_row(f"checkpoint every {best.extra.get('every')}", problem, best.saved, setup,
                   best.recompute_cost))
    else:
        print("  no checkpoint-every-k plan fits")
    if refused:
        try:
            device_budget(problem, _setup(refused), device)
            print(f" FSDP over {refused} ranks: fits (unexpected)")
        except DeviceBudgetError as exc:
            print(f" FSDP over {refused} ranks: refused: {exc}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["7b"], choices=sorted(MODELS))
    ap.add_argument("--device", default="80GiB")
    ap.add_argument("--solvers", nargs="+", default=["default"], choices=["default", "cpsat"])
    ap.add_argument("--time-limit", type=float, default=60.0, help="the peak search's, in seconds")
    args = ap.parse_args()
    device = parse_budget(args.device)
    for model in args.models:
        run(model, int(device), args.solvers, args.time_limit)


if __name__ == "__main__":
    main()
