"""The step across graphs, measured (issue #41): the small HF LLaMA of the rank-memory cross-check
(4 layers, hidden 512, AdamW) on one device, bf16 throughout (parameters, gradients, AdamW's
state), its step planned offline under a device budget with ``capture.per_layer`` (the layer
graph once per layer, the root eager), then trained with each decoder layer compiled by
``torch.compile(layer, backend=opt_remat.backend(plan=FILE, compiler="eager",
decompositions="none"))``, the root eager. The step's live storages are measured by
``opt_remat.step_memory.StepTracker`` (compiled layers included) plus the parameters and the
optimizer state, and compared with the prediction (``solvers.step.step_peak``).

    python benchmarks/bench_step.py                  # budgets at 0, 1/2 and 1 of the plans' range
    python benchmarks/bench_step.py --batch 4 --seq 256
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LLAMA = dict(num_hidden_layers=4, hidden_size=512, intermediate_size=1376, num_attention_heads=8,
             num_key_value_heads=8, vocab_size=1024, max_position_embeddings=512, attn_implementation="sdpa")
PATH = "model.model.layers"  # the decoder layers in opt_remat.hf.causal_lm's wrapper
SETUP = dict(param_dtype="bf16", master_dtype="bf16", reduce_dtype="bf16", optimizer="adamw", state_dtype="bf16")


def plan_step(batch: int, seq: int, where: float, plan_path: Path) -> dict[str, Any]:
    """Capture the step per layer on fake tensors, solve it at ``where`` of the way from the lowest
    step peak of its plans to eager's, write the plan file; the prediction."""
    import torch

    from opt_remat.formats.step_plan import step_document
    from opt_remat.hf import causal_lm
    from opt_remat.request import make_request
    from opt_remat.step_capture import build_step, capture_step
    from solvers.baselines import inputs_only, save_all
    from solvers.step import step_peak
    from solvers.step_solve import solve_step
    from solvers.training import training_setup

    ids = torch.randint(0, LLAMA["vocab_size"], (batch, seq))
    start = time.perf_counter()
    captured = capture_step(lambda: causal_lm("LlamaForCausalLM", LLAMA), [ids], per_layer=PATH, compiler="eager",
                            decompositions="none", meta=True, dtype=torch.bfloat16)
    work = build_step(captured, make_request())
    capture_s = time.perf_counter() - start
    setup = training_setup(SETUP)
    step = work.step

    def plans(make: Any) -> dict[str, frozenset[str]]:
        return {g.key: g.fixed if g.fixed is not None else make(g.problem).saved for g in step.graphs}

    low = step_peak(step, plans(inputs_only), setup).total
    eager = step_peak(step, plans(save_all), setup).total
    budget = int(low + where * (eager - low))
    start = time.perf_counter()
    solved = solve_step(step, budget, setup)
    solve_s = time.perf_counter() - start
    doc = step_document(step, solved.plans, work.values, solved.peak, solved.cost, {"model": "hf llama small"},
                        device_memory=budget, training=SETUP)
    plan_path.write_text(json.dumps(doc, indent=1, default=str))
    layer = next(g for g in step.graphs if g.fixed is None)
    return {"budget": budget, "predicted": solved.peak.total, "at": solved.peak.at,
            "by_kind": {k.value: v for k, v in solved.peak.by_kind.items()},
            "eager_predicted": eager, "lowest_predicted": low, "layer_graph": layer.key, "layers": layer.repeat,
            "layer_saved": len(solved.plans[layer.key].saved),
            "layer_recomputed": len(solved.plans[layer.key].recomputed), "recompute_s": solved.cost,
            "capture_s": capture_s, "solve_s": solve_s}


def train_measured(batch: int, seq: int, plan_path: Path | None, steps: int = 3) -> dict[str, Any]:
    """Train with each decoder layer compiled with the plan (None: eager), the root eager; the
    last step's measured peak (live storages made in it, plus parameters and optimizer state)."""
    import torch

    import opt_remat
    from opt_remat.hf import causal_lm
    from opt_remat.step_memory import StepTracker, optimizer_tensors, storage_bytes

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = causal_lm("LlamaForCausalLM", LLAMA).to(torch.bfloat16)
    backends = []
    if plan_path is not None:
        for layer in model.get_submodule(PATH):
            be = opt_remat.backend(plan=str(plan_path), compiler="eager", decompositions="none")
            layer.compile(backend=be)
            backends.append(be)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    ids = torch.randint(0, LLAMA["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1))
    for _ in range(steps - 1):
        model(ids).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    states = storage_bytes([*model.parameters(), *optimizer_tensors(optim)])
    with StepTracker() as tracker:
        loss = model(ids)
        loss.backward()
        del loss
    applied = sorted({r.plan.solver for be in backends for r in be.partitioner.history})
    partitions = sum(len(be.partitioner.history) for be in backends)
    return {"measured": tracker.peak + states, "states": states, "step": tracker.peak,
            "plans_applied": applied, "partitions": partitions}


def fsdp_against_tracker(reshard: bool) -> tuple[dict[Any, int], dict[Any, int]]:
    """The cross-check's step (``bench_rank_memory``: FSDP2 over 8 fake ranks, bf16 compute, fp32
    states) captured per layer, every part under eager's plan: (predicted, tracked) by kind, with
    "total" and (predicted) "at"."""
    import torch

    import bench_rank_memory as rank
    from opt_remat.hf import causal_lm
    from opt_remat.request import make_request
    from opt_remat.step_capture import build_step, capture_step
    from solvers.step import step_peak
    from solvers.step_parts import eager_saved

    ids = torch.randint(0, rank.LLAMA["vocab_size"], (rank.BATCH, rank.SEQ))
    captured = capture_step(lambda: causal_lm("LlamaForCausalLM", rank.LLAMA), [ids], per_layer=PATH,
                            decompositions="none", meta=True, dtype=torch.bfloat16)
    step = build_step(captured, make_request()).step
    plans = {g.key: g.fixed if g.fixed is not None else eager_saved(g.problem) for g in step.graphs}
    peak = step_peak(step, plans, rank.setup(reshard))
    predicted: dict[Any, int] = dict(peak.by_kind)
    predicted["total"] = peak.total
    predicted["at"] = peak.at  # type: ignore[assignment]
    return predicted, rank.tracker(reshard)


def row(batch: int, seq: int, where: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = Path(tmp) / "step-plan.json"
        out = plan_step(batch, seq, where, plan_path)
        out.update(train_measured(batch, seq, plan_path))
    out["error"] = out["predicted"] / out["measured"] - 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--where", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--fsdp", action="store_true", help="eager plans under FSDP against FSDPMemTracker instead")
    args = ap.parse_args()
    mib = 2 ** 20
    if args.fsdp:
        for reshard in (True, False):
            predicted, tracked = fsdp_against_tracker(reshard)
            print(f"reshard {reshard}: predicted {predicted['total'] / mib:.2f} MiB at {predicted['at']}, tracked "
                  f"{tracked['total'] / mib:.2f} MiB ({predicted['total'] / tracked['total'] - 1:+.2%})")
        return
    print(f"batch {args.batch} x {args.seq}; MiB")
    print("| budget | predicted | measured | error | peak at | layer plan (saved / recomputed) | recompute |")
    print("|---|---|---|---|---|---|---|")
    for where in args.where:
        r = row(args.batch, args.seq, where)
        print(f"| {r['budget'] / mib:.2f} | {r['predicted'] / mib:.2f} | {r['measured'] / mib:.2f} | "
              f"{r['error']:+.1%} | {r['at']} | {r['layer_saved']} / {r['layer_recomputed']} | "
              f"{r['recompute_s'] * 1e6:.0f} us |", flush=True)
        print(f"  by kind: {', '.join(f'{k} {v / mib:.2f}' for k, v in r['by_kind'].items())}; "
              f"states {r['states'] / mib:.2f}; applied {r['plans_applied']} in {r['partitions']} partitions; "
              f"capture {r['capture_s']:.1f} s, solve {r['solve_s']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
