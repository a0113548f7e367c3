"""torch's own estimate of a rank's memory under FSDP2: ``FSDPMemTracker`` over a fake process
group of N ranks, on CPU. The independent reference the rank-memory simulation is checked against
(``tests/test_rank_memory.py``, ``benchmarks/bench_rank_memory.py``).

Run in its own process (process-group init is global state)::

    python benchmarks/fsdp_tracker.py --reshard 1   # prints one JSON object: bytes per category
"""

from __future__ import annotations

import argparse
import json
from typing import Any

# the small HF LLaMA of issue #41's cross-check: 4 layers, hidden 512
LLAMA = dict(num_hidden_layers=4, hidden_size=512, intermediate_size=1376, num_attention_heads=8,
             num_key_value_heads=8, vocab_size=1024, max_position_embeddings=256,
             attn_implementation="sdpa")
BATCH, SEQ = 2, 128


def build_llama() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA))


def track(reshard: bool, ranks: int = 8, steps: int = 2) -> dict[str, Any]:
    """Bytes per category at the peak of the last of ``steps`` training steps (the first allocates
    the optimizer state), and the peak."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        model = build_llama()
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        ids = torch.randint(0, LLAMA["vocab_size"], (BATCH, SEQ))
        tracker = FSDPMemTracker(model, optim)
        tracker.track_inputs((ids,))
        with tracker:
            for _ in range(steps):
                tracker.reset_mod_stats()
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optim.step()
                optim.zero_grad()
        snap = tracker.get_tracker_snapshot("peak")
        by_device = next(iter(snap.values()))
        return {str(k): int(v) for k, v in by_device.items()}
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reshard", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=8)
    args = ap.parse_args()
    print(json.dumps(track(bool(args.reshard), args.ranks)))


if __name__ == "__main__":
    main()
