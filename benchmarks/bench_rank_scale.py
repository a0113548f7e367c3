"""Device budgets at scale (issue #41): HF LlamaForCausalLM shapes captured on fake tensors in
bf16, trained with FSDP (AdamW, bf16 compute, fp32 sharded states), planned against a device's
memory with the rank's whole memory simulated (``solvers.rank_memory.with_rank_memory``).

    python benchmarks/bench_rank_scale.py [--models 7b 70b] [--device 80GiB] [--solvers default cpsat]
    python benchmarks/bench_rank_scale.py --offload [--host-memory 204.8GiB 16GiB] [--solvers default cpsat]

Rows: each solver's plan under the device budget, solved as ``opt-remat`` solves it after capture
(``road.solve_problem``: the refusal check, then the peak solve on the rank's problem), with its
wall and CPU seconds and, for the peak search, its proven gap; the cheapest checkpoint-every-k
plan that fits in the same simulation (and the default path's min-cut, which does not fit), each
with its whole-rank peak split by kind; then the states-only refusal where the ranks are too few.

``--offload``: the problem built as an offload request builds it (backward times too), and per
solver the plan without offload and with it under each host-memory cap (per rank), all through
the road (``road.solve_problem`` with ``device_memory``, ``training`` and ``offload``, h100's link):
recompute ms, offloaded GiB, exposed ms, predicted added step time (recompute + exposed, the
model of ``solvers.offload``), the whole-rank peak by kind with the offloads, solve seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import time
from pathlib import Path

import torch

from opt_remat import road
from opt_remat.api import auto_lam
from opt_remat.build import problem_from_joint
from opt_remat.capture import capture
from opt_remat.costs import get_profile
from opt_remat.errors import PeakBudgetError
from opt_remat.hf import causal_lm
from opt_remat.request import make_request
from opt_remat.runs.curves import TOTAL, step_curve
from opt_remat.runs.offload_view import offload_figures, with_transfers
from solvers.baselines import uniform_checkpoints
from solvers.budget import parse_budget
from solvers.device_budget import device_budget
from solvers.errors import DeviceBudgetError
from solvers.mincut import solve_mincut
from solvers.offload_plan import offload_cost
from solvers.problem import Problem
from solvers.rank_memory import rank_peak, with_rank_memory
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


def captured(model: str, cache: Path | None) -> tuple[Problem, str]:
    """The model's problem (``problem_from_joint``), captured on fake tensors, or read from ``cache``
    where an earlier run pickled it (named by the model's shape and torch's version: after a change
    to the capture or the problem's build, empty the folder); with how it was obtained."""
    config, batch, seq, _, _ = MODELS[model]
    config = {**config, "vocab_size": 32000, "max_position_embeddings": seq, "attn_implementation": "sdpa"}
    path = None
    if cache is not None:
        key = json.dumps([config, batch, seq, torch.__version__])
        path = cache / f"{model}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.pkl"
        if path.exists():
            with path.open("rb") as f:
                return pickle.load(f), f"read from {path}"
    start = time.perf_counter()
    joint = capture(lambda: causal_lm("LlamaForCausalLM", config), (torch.zeros(batch, seq, dtype=torch.long),),
                    meta=True, dtype=torch.bfloat16)
    problem = problem_from_joint(joint)[1]
    took = f"captured in {time.perf_counter() - start:.0f} s"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(problem, f)
    return problem, took


def run(model: str, device: int, solvers: list[str], time_limit_s: float, cache: Path | None = None) -> None:
    _, batch, seq, ranks, refused = MODELS[model]
    problem, how = captured(model, cache)
    print(f"\n{model}: batch {batch} x {seq}, {len(problem.nodes)} values, {how}; device {device / GIB:.0f} GiB")
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


def run_offload(model: str, device: int, caps: list[int], solvers: list[str | None], time_limit: float) -> None:
    """Per solver: the plan under the device budget without offload, then with it per host cap."""
    config, batch, seq, ranks, _ = MODELS[model]
    config = {**config, "vocab_size": 32000, "max_position_embeddings": seq, "attn_implementation": "sdpa"}
    start = time.perf_counter()
    joint = capture(lambda: causal_lm("LlamaForCausalLM", config), (torch.zeros(batch, seq, dtype=torch.long),),
                    meta=True, dtype=torch.bfloat16)
    problem = road.prepare(joint.module, joint.num_fwd_outputs, joint.static_lifetime_input_indices,
                           make_request(offload=True), input_roles=joint.input_roles).problem
    setup = _setup(ranks)
    training = {"sharding": "fsdp", "ranks": ranks, "optimizer": "adamw", "param_dtype": "bf16"}
    print(f"\n{model}: batch {batch} x {seq}, {len(problem.nodes)} values, captured in "
          f"{time.perf_counter() - start:.0f} s; device {device / GIB:.0f} GiB, FSDP over {ranks} ranks, h100 link")
    rank = with_rank_memory(problem, setup)
    for solver in solvers:
        opts = {"time_limit_s": time_limit} if solver else {}
        for cap in [None, *caps]:
            request = make_request(solver, options=opts, device_memory=device, training=training,
                                   offload=False if cap is None else {"host_memory": cap})
            name = f"{solver or 'default'}" + ("" if cap is None else f" + offload, host {cap / GIB:g} GiB")
            start = time.perf_counter()
            try:
                plan = road.solve_problem(problem, request, None)
            except (PeakBudgetError, DeviceBudgetError) as exc:
                print(f"  {name}: refused: {exc}")
                continue
            took = time.perf_counter() - start
            link = road.offload_link(make_request(offload=True))
            cost = offload_cost(rank, plan.saved, plan.offloaded, link)
            program = plan.extra.get("offload_program")
            note = ""
            if program is not None and "greedy" in plan.extra:
                greedy = plan.extra["greedy"]
                note = " (the program's plan" + ("" if greedy is None else
                                                 f"; the chooser's added {greedy['added_s'] * 1e3:.2f} ms") + ")"
            elif program is not None:
                note = (f" (the chooser's plan; the program's added {program['added_s'] * 1e3:.2f} ms)"
                        if program.get("fitted") else " (the chooser's plan; the program's plans did not fit)")
            print(f"  {name:<34} peak {cost.peak / GIB:6.2f} GiB  recompute {plan.recompute_cost * 1e3:7.2f} ms  "
                  f"offloaded {cost.host_bytes / GIB:6.2f} GiB  exposed {cost.exposed_s * 1e3:6.2f} ms  "
                  f"added {cost.added_s * 1e3:7.2f} ms  {took:6.1f} s{note}\n      "
                  f"{_kinds(problem, plan, setup, link)}", flush=True)


def _kinds(problem, plan, setup: TrainingSetup, link) -> str:
    """The whole-rank step with the offloads (the runs' curve), split by kind at its peak; "away":
    the offloaded bytes off the device there."""
    curve = step_curve(problem, plan.saved, setup)
    figures, timeline = offload_figures(problem, plan, link, curve)
    moved = with_transfers(curve, timeline)
    at = moved.live[TOTAL].index(moved.peak)
    kinds = {k: v for k, v in moved.peak_by_kind().items() if v}
    return (f"at {moved.peak / GIB:.2f} GiB ({'forward' if moved.phases[at] == 'f' else 'backward'}): "
            + " ".join(f"{k}={v / GIB:.2f}" for k, v in kinds.items()) + f" away={-timeline.adjust[at] / GIB:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["7b"], choices=sorted(MODELS))
    ap.add_argument("--device", default="80GiB")
    ap.add_argument("--offload", action="store_true", help="rows without and with offload (the 7B scenario of #42)")
    # a DGX H100's 2 TiB of host memory over its 8 GPUs, 80% of it (torchtitan's cap), and a tight cap
    ap.add_argument("--host-memory", nargs="+", default=["204.8GiB", "16GiB"])
    ap.add_argument("--solvers", nargs="+", choices=["default", "cpsat"],
                    help="default: the fast default; with --offload, default and cpsat")
    ap.add_argument("--time-limit", type=float, default=60.0, help="the peak search's, in seconds")
    ap.add_argument("--problem-cache", type=Path, metavar="DIR",
                    help="pickle each captured problem here and read it back on later runs (rows without --offload)")
    args = ap.parse_args()
    device = parse_budget(args.device)
    for model in args.models:
        if args.offload:
            caps = [int(parse_budget(c)) for c in args.host_memory]
            solvers = [None if s == "default" else s for s in args.solvers or ["default", "cpsat"]]
            run_offload(model, int(device), caps, solvers, args.time_limit)
        else:
            run(model, int(device), args.solvers or ["default"], args.time_limit, args.problem_cache)


if __name__ == "__main__":
    main()
