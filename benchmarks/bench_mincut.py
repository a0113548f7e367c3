"""Scale: LLaMA-style joint graphs captured without allocating, partitioned by torch and opt-remat.

    python benchmarks/bench_mincut.py [--layers 32 64] [--repeats 3] [--cpu] [--exact] [--time-limit 60]

Prints, per graph, medians over ``--repeats`` runs on copies of one joint graph, torch and
opt-remat alternating in the same process: torch's ``min_cut_rematerialization_partition`` (its
whole partition), opt-remat's stages (prepare + build the problem, min-cut, lower to forward and
backward modules) and its whole partition (``opt_remat.partitioner()``, the default solver: what
``torch.compile`` runs), with the ratios torch / ours. ``whole, GC on``: the same with Python's
cycle collector left on (the partitioner pauses it). Modules are plain GraphModules (compiled
when made); under ``torch.compile`` both partitioners make lazy ones. With ``--exact``: CP-SAT and
HiGHS at the saved bytes of torch's ``activation_memory_budget=0.5`` plan (time, gap, cost ratio,
the program's variables before and after presolve), and CP-SAT on the tied problem
(``symmetry="tie"``: one decision per repeated-layer group; its variables, time and cost against
the best untied plan). ``--cpu``: the partitions timed in this process's CPU time instead of wall
time (on a machine shared with other jobs, waiting for a core does not count).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

import opt_remat
from opt_remat.api import auto_lam, gc_paused
from opt_remat.build import build_problem, classify, prepare_joint
from opt_remat.capture import capture
from opt_remat.costs import get_profile
from opt_remat.lower import lower_plan
from opt_remat.models import Llama
from opt_remat.torch_reference import torch_plan
from opt_remat.report import table
from solvers.budget import format_bytes
from solvers.mincut import solve_mincut
from solvers.catalog import SAVED, solve, typed_options
from torch._functorch.partitioners import min_cut_rematerialization_partition


def _timed(clock, fn) -> float:
    start = clock()
    fn()
    return clock() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--exact", action="store_true",
                    help="also time CP-SAT, HiGHS and the tied CP-SAT solve at torch's 0.5 bytes")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--cpu", action="store_true", help="time the partitions in CPU time, not wall time")
    args = ap.parse_args()
    clock = time.process_time if args.cpu else time.perf_counter
    torch.manual_seed(0)
    lam = auto_lam(get_profile("h100"))  # the default partitioner's min-cut weight
    rows = []
    for layers in args.layers:
        def factory(layers=layers):
            return Llama(layers=layers, d_model=args.d_model, heads=4, seq=args.seq)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        joint = capture(factory, (torch.zeros(2, args.seq, dtype=torch.long),), meta=True)
        capture_s = time.perf_counter() - t0
        rss_mb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rss_before) / 1024
        n = joint.num_fwd_outputs

        times: dict[str, list[float]] = {k: [] for k in ("torch", "build", "mincut", "lower", "whole", "gc on")}
        for _ in range(args.repeats):
            j = joint.copy()
            times["torch"].append(_timed(
                clock, lambda j=j, n=n: min_cut_rematerialization_partition(j.module, None, num_fwd_outputs=n)))
            j = joint.copy()
            times["whole"].append(_timed(
                clock, lambda j=j, n=n: opt_remat.partitioner()(j.module, None, num_fwd_outputs=n)))
            j = joint.copy()
            times["gc on"].append(_timed(clock, lambda j=j, n=n: opt_remat.partitioner()._partition(j.module, None, n,
                                                                                                  None)))
            j = joint.copy()
            with gc_paused():  # the stages as the partitioner runs them
                t = clock()
                module = prepare_joint(j.module)
                problem = build_problem(module, num_fwd_outputs=n, node_info=classify(module, n))
                times["build"].append(clock() - t)
                t = clock()
                plan = solve_mincut(problem, lam)
                times["mincut"].append(clock() - t)
                times["lower"].append(_timed(clock, lambda m=module, p=plan, n=n: lower_plan(m, p, num_fwd_outputs=n)))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({
            "layers": layers, "nodes": len(problem.nodes), "capture s": f"{capture_s:.1f}",
            "torch s": f"{med['torch']:.2f}", "build s": f"{med['build']:.2f}",
            "min-cut s": f"{med['mincut']:.3f}", "lower s": f"{med['lower']:.2f}",
            "whole s": f"{med['whole']:.2f}", "torch / whole": f"{med['torch'] / med['whole']:.1f}x",
            "whole, GC on s": f"{med['gc on']:.2f}", "torch / GC on": f"{med['torch'] / med['gc on']:.1f}x",
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
                exact = solve(problem, solver, ref.saved_bytes,
                              typed_options(solver, {"time_limit_s": args.time_limit, **opts}, SAVED))
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
    print("\nsummary (medians of %d):" % args.repeats)
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
