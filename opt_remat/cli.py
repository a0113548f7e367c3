"""The ``opt-remat`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from solvers.budget import format_bytes


def _demo(args: argparse.Namespace) -> int:
    import torch

    import opt_remat
    from opt_remat import models
    from opt_remat.report import describe_plan, table
    from opt_remat.verify import compare_steps, measured_saved_bytes, save_all_backend, training_step

    torch.manual_seed(0)
    factory = getattr(models, args.model)
    model = factory(layers=args.layers) if args.model in ("gpt2", "llama", "mlp") else factory()
    inputs = models.example_inputs(args.model, model, batch=args.batch)
    reference = training_step(model, inputs, save_all_backend("inductor"))
    rows = []
    for solver in args.solvers:
        torch._dynamo.reset()
        be = opt_remat.backend(solver, args.budget, compiler="eager", decompositions="inductor",
                               device=args.device)
        step = training_step(model, inputs, be)
        check = compare_steps(step, reference)
        rec = be.partitioner.history[-1]
        print(f"\n== {args.model} ({len(rec.problem.nodes)} nodes in the joint graph) ==")
        print(describe_plan(rec.problem, rec.plan))
        measured = measured_saved_bytes(rec.fw_module, rec.num_fwd_outputs)
        rows.append({
            "solver": solver, "status": rec.plan.status.value,
            "saved (predicted)": format_bytes(rec.plan.saved_bytes), "saved (measured)": format_bytes(measured),
            "recompute us": f"{rec.plan.recompute_cost * 1e6:.2f}",
            "solve s": f"{rec.plan.solve_time_s:.3f}",
            "grads vs save-all": "bitwise" if check.bitwise else f"rel err {check.max_rel_error:.1e}",
        })
    print()
    print(table(rows, list(rows[0])))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opt-remat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="partition a built-in model's training step and verify it")
    demo.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "resnet", "mlp"])
    demo.add_argument("--layers", type=int, default=2)
    demo.add_argument("--batch", type=int, default=2)
    demo.add_argument("--solvers", nargs="+", default=["mincut"])
    demo.add_argument("--budget", default=None, help="saved bytes ('2MiB') or a fraction (0.5)")
    demo.add_argument("--device", default="h100")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    if args.budget is not None:
        try:
            args.budget = float(args.budget) if "." in args.budget and args.budget.replace(".", "", 1).isdigit() \
                else args.budget
        except ValueError:
            pass
    try:
        return args.func(args)
    except (ValueError, KeyError) as exc:
        print(f"opt-remat: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
