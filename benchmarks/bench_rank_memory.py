"""The rank's memory (``solvers.rank_memory``) against torch's ``FSDPMemTracker`` on the small HF
LLaMA of issue #41 (4 layers, hidden 512, AdamW, bf16 compute, fp32 sharded states, FSDP over 8
ranks, batch 2 x 128), reshard after forward on and off, under the save-all plan (what eager
autograd saves). Prints a table of MiB per kind; ``compare`` is what tests/test_rank_memory.py checks.

    python benchmarks/bench_rank_memory.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from fsdp_tracker import BATCH, LLAMA, SEQ  # noqa: E402

from solvers.memory_kinds import MemoryKind as K  # noqa: E402
from solvers.rank_memory import rank_peak  # noqa: E402
from solvers.training import TrainingSetup  # noqa: E402

# the tracker's categories -> ours (its unsharded gradients are our graph's gradients)
TRACKER_KINDS = {
    "Sharded Param": K.SHARDED_PARAMS, "Unsharded Param": K.GATHERED_PARAMS,
    "Sharded Grad": K.SHARDED_GRADS, "Unsharded Grad": K.GRADIENTS, "Activation": K.ACTIVATIONS,
    "Temp": K.TEMPORARIES, "All Gather": K.ALL_GATHER, "Reduce Scatter": K.REDUCE_SCATTER,
    "OptState": K.OPTIMIZER,
}


def setup(reshard: bool, ranks: int = 8) -> TrainingSetup:
    return TrainingSetup(param_dtype="bf16", master_dtype="fp32", reduce_dtype="fp32", optimizer="adamw",
                         state_dtype="fp32", sharding="fsdp", ranks=ranks, reshard_after_forward=reshard,
                         prefetch=True)


def llama_problem() -> Any:
    """The step's problem: the LLaMA captured on fake tensors in bf16 (FSDP2's compute dtype),
    without decompositions (eager autograd's ops: a decomposed SiLU saves an fp32 copy)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from opt_remat.build import problem_from_joint
    from opt_remat.capture import capture
    from opt_remat.hf import CausalLMLoss

    config = LlamaConfig(**LLAMA)
    ids = torch.randint(0, LLAMA["vocab_size"], (BATCH, SEQ))
    joint = capture(lambda: CausalLMLoss(LlamaForCausalLM(config)), (ids,), meta=True, dtype=torch.bfloat16,
                    decompositions="none")
    return problem_from_joint(joint)[1]


def tracker(reshard: bool, ranks: int = 8) -> dict[K | str, int]:
    """The tracker's peak by kind, run in a subprocess (process-group init is global state)."""
    out = subprocess.run([sys.executable, str(HERE / "fsdp_tracker.py"), "--reshard", str(int(reshard)),
                          "--ranks", str(ranks)],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    raw = json.loads(out.stdout.strip().splitlines()[-1])
    got: dict[K | str, int] = {k: 0 for k in K}
    for name, nbytes in raw.items():
        key = name.split(".")[-1]
        label = {"SHARDED_PARAM": "Sharded Param", "UNSHARDED_PARAM": "Unsharded Param",
                 "SHARDED_GRAD": "Sharded Grad", "UNSHARDED_GRAD": "Unsharded Grad", "ACT": "Activation",
                 "TEMP": "Temp", "ALL_GATHER": "All Gather", "REDUCE_SCATTER": "Reduce Scatter",
                 "OPT": "OptState"}.get(key, key)
        if label in TRACKER_KINDS:
            got[TRACKER_KINDS[label]] += nbytes
        elif label == "Total":
            got["total"] = nbytes
    return got


def eager_saved(problem: Any) -> frozenset[str]:
    """What eager autograd saves: every forward value the backward reads; values that only the
    backward needs (``either``) run there, from saved inputs."""
    from solvers.baselines import _walk
    from solvers.problem import Role
    return _walk(problem, lambda v: problem.by_name[v].role is not Role.EITHER)


def compare(problem: Any, reshard: bool) -> tuple[dict[K | str, int], dict[K | str, int]]:
    """(predicted, tracked) bytes by kind and "total", under eager's plan (``eager_saved``)."""
    peak = rank_peak(problem, eager_saved(problem), setup(reshard))
    predicted: dict[K | str, int] = dict(peak.by_kind)
    predicted["total"] = peak.total
    predicted["at"] = f"{peak.phase} {peak.at}"  # type: ignore[assignment]
    return predicted, tracker(reshard)


def main() -> None:
    problem = llama_problem()
    mib = 2**20
    for reshard in (True, False):
        predicted, tracked = compare(problem, reshard)
        print(f"\nreshard_after_forward={reshard}: predicted peak at {predicted.pop('at')}")
        print(f"{'kind':<24}{'opt-remat MiB':>14}{'tracker MiB':>13}{'diff':>8}")
        for k in [*K, "total"]:
            p, t = predicted.get(k, 0), tracked.get(k, 0)
            diff = f"{(p - t) / t:+.1%}" if t else ""
            print(f"{getattr(k, 'value', k):<24}{p / mib:>14.2f}{t / mib:>13.2f}{diff:>8}")


if __name__ == "__main__":
    main()
