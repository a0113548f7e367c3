"""Offload against its predictions on a GPU: for one model and one peak budget, the plan that only
recomputes and the plan that may offload (``partitioner(peak_budget=..., offload=True)``), each
trained through ``torch.compile`` (inductor), and measured beside what opt-remat predicts:

* the step's peak: ``torch.cuda.max_memory_allocated`` over a step, less what is allocated before
  it (parameters, their gradients, inputs), against the simulated (offload-aware) peak;
* the step time: CUDA events around ``--steps`` steps after ``--warmup``, and the difference
  between the two plans, against the predicted added time (recompute + exposed transfer);
* the achieved D2H / H2D bandwidth: the offloaded bytes of a step over the time the profiler's
  memcpy events between device and pinned host memory take, against the host link's preset.

torch's pass is run with its separate stream, sink-wait and reload prefetch (the async lowering
the model of ``solvers.offload`` follows; see docs/limits.md for where the two differ).

    python benchmarks/gpu_validate.py [--model gpt2|llama] [--layers 8] [--d-model 1024]
                                      [--batch 8] [--seq 1024] [--fraction 0.6] [--steps 10]

Without a CUDA device it says so and exits (status 0): nothing here runs on a CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch._functorch import config as functorch_config  # noqa: E402

import opt_remat  # noqa: E402
from opt_remat import road  # noqa: E402
from opt_remat.models import gpt2, llama  # noqa: E402
from opt_remat.report import table  # noqa: E402
from opt_remat.request import make_request  # noqa: E402
from solvers.liveness import simulate_plan  # noqa: E402
from solvers.offload_plan import offload_cost  # noqa: E402

MIB = 2**20


def _model(args: argparse.Namespace) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    make = gpt2 if args.model == "gpt2" else llama
    kw: dict[str, Any] = {"layers": args.layers, "d_model": args.d_model, "heads": args.d_model // 64,
                          "vocab": 32000, "seq": args.seq}
    model = make(**kw).to("cuda", torch.bfloat16)
    return model, (torch.randint(0, 32000, (args.batch, args.seq), device="cuda"),)


def _step(compiled: Any, inputs: tuple[torch.Tensor, ...]) -> None:
    compiled(*inputs).float().sum().backward()


def _measure(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], pfn: opt_remat.Partitioner,
             args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up, then the peak over one step and the mean step time over ``args.steps``."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=opt_remat.backend(partition_fn=pfn))
    for _ in range(args.warmup):
        _step(compiled, inputs)
        model.zero_grad(set_to_none=False)  # gradients stay allocated: outside the step's peak
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _step(compiled, inputs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        _step(compiled, inputs)
    end.record()
    torch.cuda.synchronize()
    return {"peak": peak, "step_s": start.elapsed_time(end) / 1e3 / args.steps, "compiled": compiled}


def _bandwidth(compiled: Any, inputs: tuple[torch.Tensor, ...], offloaded_bytes: int) -> tuple[float, float]:
    """Achieved D2H and H2D bytes/s in one step: the offloaded bytes over the memcpy time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(compiled, inputs)
        torch.cuda.synchronize()
    d2h = h2d = 0.0
    for event in prof.events():
        name = event.name.lower()
        if "memcpy" in name and ("dtoh" in name or "device -> pinned" in name):
            d2h += event.device_time_total / 1e6
        elif "memcpy" in name and ("htod" in name or "pinned -> device" in name):
            h2d += event.device_time_total / 1e6
    return (offloaded_bytes / d2h if d2h else float("nan"), offloaded_bytes / h2d if h2d else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["gpt2", "llama"], default="llama")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--fraction", type=float, default=0.6, help="the peak budget, x the min-cut plan's peak")
    ap.add_argument("--device", default="h100", help="the device profile whose costs and host link plan")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_validate: no CUDA device here: nothing to measure (run it on a machine with a GPU)")
        return 0
    model, inputs = _model(args)
    probe = opt_remat.partitioner(device=args.device)  # the min-cut plan: the budget's scale
    _measure(model, inputs, probe, argparse.Namespace(warmup=1, steps=1))
    rec = probe.history[-1]
    budget = int(args.fraction * simulate_plan(rec.problem, rec.plan.saved).peak)
    rows = []
    with functorch_config.patch(activation_offload_separate_stream=True, activation_offload_sink_wait=True,
                                activation_reload_prefetch=True):
        for offload in (False, True):
            pfn = opt_remat.partitioner(peak_budget=budget, device=args.device, offload=offload)
            got = _measure(model, inputs, pfn, args)
            rec = pfn.history[-1]
            link = road.offload_link(make_request(offload=True, device=args.device))
            cost = offload_cost(rec.problem, rec.plan.saved, rec.plan.offloaded, link)
            d2h, h2d = _bandwidth(got["compiled"], inputs, cost.host_bytes) if rec.plan.offloaded else (0.0, 0.0)
            rows.append({"plan": "with offload" if offload else "recompute only",
                         "peak MiB predicted": f"{cost.peak / MIB:.1f}", "measured": f"{got['peak'] / MIB:.1f}",
                         "added ms predicted": f"{cost.added_s * 1e3:.2f}", "step ms": f"{got['step_s'] * 1e3:.2f}",
                         "offloaded MiB": f"{cost.host_bytes / MIB:.1f}",
                         "exposed ms predicted": f"{cost.exposed_s * 1e3:.2f}",
                         "D2H GB/s": f"{d2h / 1e9:.1f}", "H2D GB/s": f"{h2d / 1e9:.1f}",
                         "link GB/s": f"{link.d2h / 1e9:.0f}"})
    print(f"{args.model}, {args.layers} layers, d_model {args.d_model}, batch {args.batch} x {args.seq}, bf16, "
          f"peak budget {budget / MIB:.1f} MiB ({args.fraction:g} x min-cut), {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d')}")
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
