"""The default solver (no solver named) under a saved-bytes budget: its plan against the proven
optimum and min-cut's, and its wall time.

    python benchmarks/bench_default.py [--models gpt llama resnet 7b 70b] [--fractions 0.5 0.2]
                                       [--exact-limit 120]

Models: the tests' GPT (dropout), LLaMA and ResNet (captured by a real training step), and
``opt_remat.models.llama`` at the LLaMA-7B shape (32 layers, d 4096, hidden 11008, 32 heads,
vocab 32000, batch 8 x 2048, bf16) and the 70B shape (80 layers, d 8192, hidden 28672, 64 heads,
batch 1 x 4096, bf16), both captured fake (``meta=True``: nothing allocated), costs on the h100
roofline. At each fraction of torch's budget range: the default path (``choose_default_plan``),
``mincut`` alone, and the optimum proven by an engine other than the default's where it can within
``--exact-limit`` s (CP-SAT on the small models; HiGHS at 7B/70B, where CP-SAT needs a minute
or more); recompute costs, the default's ratio to the optimum, which solver found its plan, and
its wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

from opt_remat.capture import capture
from opt_remat.models import example_inputs, gpt2, llama, resnet
from opt_remat.report import table
from opt_remat.request import make_request
from opt_remat.runs.workload import prepare_captured
from opt_remat.solve import choose_default_plan, choose_plan, resolve_budget
from solvers.problem import Problem

SMALL = {"gpt": lambda: gpt2(layers=2, dropout=0.2), "llama": lambda: llama(layers=2), "resnet": resnet}
# (model shape, batch x sequence) of the fake-captured LLaMA shapes
BIG = {
    "7b": (dict(layers=32, d_model=4096, heads=32, hidden=11008, vocab=32000, seq=2048), (8, 2048)),
    "70b": (dict(layers=80, d_model=8192, heads=64, hidden=28672, vocab=32000, seq=4096), (1, 4096)),
}


def _small(name: str, fractions: list[float]) -> tuple[Problem, dict[float, int], str]:
    import opt_remat
    from opt_remat.verify import training_step

    torch.manual_seed(0)
    model = SMALL[name]()
    inputs = example_inputs(name, model)
    problem, budgets = None, {}
    for fraction in fractions:  # torch's budget anchor comes with the partitioner's own capture
        torch._dynamo.reset()
        be = opt_remat.backend("mincut", fraction, compiler="eager", decompositions="inductor")
        training_step(model, inputs, be, seed=5)
        rec = be.partitioner.history[-1]
        problem, budgets[fraction] = rec.problem, rec.budget_bytes
    assert problem is not None
    return problem, budgets, "cpsat"


def _big(name: str, fractions: list[float]) -> tuple[Problem, dict[float, int], str]:
    kw, shape = BIG[name]
    joint = capture(lambda: llama(**kw), (torch.zeros(*shape, dtype=torch.long),), meta=True,
                    dtype=torch.bfloat16)
    prepared = prepare_captured(joint, make_request(device="h100"))
    problem = prepared.problem
    budgets = {f: resolve_budget(problem, f, top_anchor=prepared.top_anchor) for f in fractions}
    return problem, budgets, "milp"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[*SMALL, *BIG], choices=[*SMALL, *BIG])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.2])
    parser.add_argument("--exact-limit", type=float, default=120.0,
                        help="seconds for the engine that proves the optimum")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for name in args.models:
        problem, budgets, prover = (_big if name in BIG else _small)(name, args.fractions)
        unit, unit_name = (1e3, "ms") if name in BIG else (1e9, "ns")
        for fraction in args.fractions:
            budget = budgets[fraction]
            start = time.perf_counter()
            default = choose_default_plan(problem, budget, {})
            default_s = time.perf_counter() - start
            cut = choose_plan(problem, "mincut", budget, {})
            options = {"time_limit_s": args.exact_limit, **({"backend": "highs"} if prover == "milp" else {})}
            exact = choose_plan(problem, prover, budget, options)
            ratio = default.recompute_cost / exact.recompute_cost if exact.recompute_cost else 1.0
            rows.append({
                "model": name, "fraction": fraction, "values": len(problem.nodes),
                "mincut": f"{cut.recompute_cost * unit:.3f} {unit_name}",
                "default": f"{default.recompute_cost * unit:.3f} {unit_name}",
                "optimum": f"{exact.recompute_cost * unit:.3f} {unit_name}",
                "proven by": f"{prover if prover == 'cpsat' else 'highs'} ({exact.status.value})",
                "default / optimum": f"{ratio:.4f}",
                "default from": default.solver, "default s": f"{default_s:.2f}",
            })
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), file=sys.stderr, flush=True)
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
