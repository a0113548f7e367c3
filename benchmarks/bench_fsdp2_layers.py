"""Per-layer compile under FSDP2 with a device budget: what the partition records say against
torch's ``FSDPMemTracker`` for the step, on the small HF LLaMA of issue #41's cross-check (4
layers, hidden 512, AdamW, bf16 compute, fp32 sharded states, batch 2 x 128) over 2 fake ranks.

Three numbers per kind: the whole step's prediction (``rank_peak`` on the whole model's graph,
eager's plan, as ``bench_rank_memory``), the tracker's step (eager: under the tracker dynamo
compiles nothing), and the record of the layer graph that per-layer compile partitions with
``backend(device_memory=..., training=...)`` (each decoder layer ``layer.compile`` before
``fully_shard``; one graph serves the 4 layers without the KV cache).

    python benchmarks/bench_fsdp2_layers.py [--ranks 2] [--reshard 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "examples"))

import bench_rank_memory as whole  # noqa: E402
from fsdp2_llama import shard  # noqa: E402
from fsdp_tracker import BATCH, LLAMA, SEQ, build_llama  # noqa: E402

from solvers.memory_kinds import MemoryKind as K  # noqa: E402
from solvers.rank_memory import rank_peak  # noqa: E402


def layer_records(reshard: bool, ranks: int, device_memory: str = "80GiB") -> list[Any]:
    """The partition records of one FSDP2 step with each decoder layer compiled by opt-remat
    under a device budget, on a fake process group of ``ranks`` (this process; torch's own)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import opt_remat

    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        model = build_llama()
        # no decompositions: eager's ops, as the whole-step capture and the tracker see them
        backend = opt_remat.backend(device_memory=device_memory, training=whole.setup(reshard, ranks),
                                    compiler="eager", decompositions="none")
        shard(model, mesh, backend, reshard_after_forward=reshard)  # the example's: bf16 compute, fp32 reduce
        ids = torch.randint(0, LLAMA["vocab_size"], (BATCH, SEQ))
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return list(backend.partitioner.history)
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reshard", type=int, default=1)
    args = ap.parse_args()
    reshard = bool(args.reshard)
    tracked = whole.tracker(reshard, args.ranks)
    problem = whole.llama_problem()
    step = rank_peak(problem, whole.eager_saved(problem), whole.setup(reshard, args.ranks))
    records = layer_records(reshard, args.ranks)
    print(f"\nFSDP2 over {args.ranks} ranks, reshard_after_forward={reshard}; the step's predicted peak in the "
          f"{step.phase} at {step.at}; {len(records)} layer graph(s) partitioned for {LLAMA['num_hidden_layers']} "
          "layers:")
    for rec in records:
        print(f"  {rec}")
    layer = records[0].device_peak
    mib = 2**20
    print(f"\n{'kind':<24}{'step predicted':>15}{'tracker':>9}{'diff':>8}{'layer record':>14}")
    for k in [*K, "total"]:
        p = step.total if k == "total" else step.by_kind.get(k, 0)
        t = tracked.get(k, 0)
        r = layer.total if k == "total" else layer.by_kind.get(k, 0)
        diff = f"{(p - t) / t:+.1%}" if t else ""
        print(f"{getattr(k, 'value', k):<24}{p / mib:>15.2f}{t / mib:>9.2f}{diff:>8}{r / mib:>14.2f}")


if __name__ == "__main__":
    main()
