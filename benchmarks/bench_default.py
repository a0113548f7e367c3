"""The default solver (no solver named) under a budget: its plan against the exact optimum and
min-cut's, and its solve time.

    python benchmarks/bench_default.py [--fractions 0.5 0.2]

For the tests' GPT (dropout), LLaMA and ResNet: capture the step, and at each fraction of torch's
budget range solve with the default path (min-cut, then a CP-SAT search of at most 0.8 s from its
plans), with ``mincut`` alone, and with CP-SAT to optimality (30 s); print the recompute costs,
the default's ratio to the optimum and its wall time.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import opt_remat
from opt_remat.models import example_inputs, gpt2, llama, resnet
from opt_remat.report import table
from opt_remat.solve import choose_default_plan, choose_plan
from opt_remat.verify import training_step

MODELS = {"gpt": lambda: gpt2(layers=2, dropout=0.2), "llama": lambda: llama(layers=2), "resnet": resnet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.2])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for name, make in MODELS.items():
        torch.manual_seed(0)
        model = make()
        inputs = example_inputs(name, model)
        for fraction in args.fractions:
            torch._dynamo.reset()
            be = opt_remat.backend("mincut", fraction, compiler="eager", decompositions="inductor")
            training_step(model, inputs, be, seed=5)
            rec = be.partitioner.history[-1]
            problem, budget = rec.problem, rec.budget_bytes
            start = time.perf_counter()
            default = choose_default_plan(problem, budget, {})
            default_s = time.perf_counter() - start
            exact = choose_plan(problem, "cpsat", budget, {"time_limit_s": 30})
            rows.append({
                "model": name, "fraction": fraction, "nodes": len(problem.nodes),
                "mincut ns": f"{rec.plan.recompute_cost * 1e9:.1f}",
                "default ns": f"{default.recompute_cost * 1e9:.1f}",
                "exact ns": f"{exact.recompute_cost * 1e9:.1f} ({exact.status.value})",
                "default / exact": f"{default.recompute_cost / exact.recompute_cost:.3f}" if exact.recompute_cost else "1.000",
                "default from": default.solver, "default s": f"{default_s:.2f}",
            })
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
