"""Training a small Hugging Face LLaMA under FSDP2 with opt-remat (README: "Training under FSDP2").

Each decoder layer is compiled with opt-remat's backend, then sharded with ``fully_shard``; the
root last. FSDP2's hooks stay outside the compiled graphs (``torch._dynamo.config.skip_fsdp_hooks``,
on by default), so the graph partitioned is one decoder layer on its gathered parameters, and one
compiled graph (one plan) serves every layer.

    # GPUs: one process per GPU (nccl); solve in the first run and keep its plans, apply them later
    torchrun --nproc-per-node 8 examples/fsdp2_llama.py --budget 0.5 --save-plans plans.json
    torchrun --nproc-per-node 8 examples/fsdp2_llama.py --plan plans.json
    # CPU: 2 processes over gloo; --check: one step against the same FSDP step without opt-remat
    python examples/fsdp2_llama.py --cpu-ranks 2 --compiler eager --budget 0.3 --check

``tests/test_fsdp2_training.py`` runs ``check`` below on 2 gloo processes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import opt_remat

# small enough for 2 CPU processes on 2 cores; any LlamaConfig field may be changed
LLAMA = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=128, use_cache=False)
BATCH, SEQ = 2, 64


def build_model(config: dict[str, Any] | None = None, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)  # every rank builds the same weights (fully_shard keeps its shard)
    return LlamaForCausalLM(LlamaConfig(**(config or LLAMA)))


def shard(model: torch.nn.Module, mesh: DeviceMesh, backend: Callable[..., Any] | None = None,
          param_dtype: torch.dtype = torch.bfloat16, reshard_after_forward: bool = True) -> torch.nn.Module:
    """``fully_shard`` per decoder layer and on the root, each layer compiled with ``backend``
    first (as torchtitan does): the compiled forward runs between FSDP2's pre- and post-forward hooks."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if backend is not None:
            layer.compile(backend=backend)
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def tokens(rank: int, device: torch.device | str = "cpu", batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    """Each rank's own batch (data parallel), the same in every run."""
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(0, LLAMA["vocab_size"], (batch, seq), generator=gen).to(device)


def step(model: torch.nn.Module, optim: torch.optim.Optimizer, ids: torch.Tensor) -> torch.Tensor:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optim.step()
    optim.zero_grad()
    return loss.detach()


def make_backend(args: argparse.Namespace) -> Any:
    """opt-remat's backend from the command line: a plan file, or a solver under a budget."""
    extra: dict[str, Any] = {"decompositions": "inductor"} if args.compiler == "eager" else {}
    if args.plan:
        return opt_remat.backend(plan=args.plan, compiler=args.compiler, **extra)
    if args.device_memory:
        extra.update(device_memory=args.device_memory, training={
            "sharding": "fsdp", "ranks": dist.get_world_size(), "param_dtype": "bf16", "master_dtype": "fp32",
            "reduce_dtype": "fp32", "optimizer": "adamw", "state_dtype": "fp32"})
    return opt_remat.backend(args.solver, args.budget, compiler=args.compiler, **extra)


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every gradient whole (a collective: every rank calls it)."""
    return {name: p.grad.full_tensor()
            for name, p in model.named_parameters() if p.grad is not None}


def check(args: argparse.Namespace, device: torch.device, mesh: DeviceMesh) -> dict[str, Any]:
    """One AdamW step with opt-remat against the same FSDP step in eager: the loss, every full
    gradient and every updated parameter, as relative errors; and the plans this rank made."""
    ids = tokens(dist.get_rank(), device)
    runs: dict[str, Any] = {}
    for name, backend in (("eager", None), ("opt-remat", make_backend(args))):
        torch._dynamo.reset()
        model = shard(build_model().to(device), mesh, backend)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = full_grads(model)
        optim.step()
        params = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
        runs[name] = (loss.detach(), grads, params, backend, layer_states(model, optim))
    (loss_e, grads_e, params_e, *_), (loss_o, grads_o, params_o, backend, states) = runs["eager"], runs["opt-remat"]
    pfn = backend.partitioner
    if args.save_plans and dist.get_rank() == 0:
        opt_remat.save_plans(args.save_plans, pfn.history, pfn.settings)
    dist.barrier()  # the file is whole before any rank reads it
    return {
        "rank": dist.get_rank(), "loss": float(loss_o), "loss_eager": float(loss_e),
        "grad_error": max(_rel(grads_o[k], grads_e[k]) for k in grads_e),
        "param_error": max(_rel(params_o[k], params_e[k]) for k in params_e),
        "same_names": sorted(grads_o) == sorted(grads_e),
        "plans": [{"solver": r.plan.solver, "graph_id": r.graph_id, "recomputed": len(r.plan.recomputed),
                   "saved": sorted(_ids(r, r.plan.saved)), "repr": str(r),
                   "device_peak": None if r.device_peak is None else
                   {"total": r.device_peak.total, **{k.value: v for k, v in r.device_peak.by_kind.items()}}}
                  for r in pfn.history],
        "layer_states": states,
    }


def layer_states(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, int]:
    """What this rank holds for the first decoder layer, read off FSDP2's own tensors: its
    parameter shards, the layer gathered in the compute dtype (bf16), the optimizer state on the
    shards (AdamW's moments; its step counters left out, as the rank model does)."""
    params = list(model.model.layers[0].parameters())
    return {"sharded": sum(p.to_local().numel() * p.element_size() for p in params),
            "gathered": sum(p.numel() * 2 for p in params),
            "optimizer": sum(t.to_local().numel() * t.element_size() for p in params
                             for k, t in optim.state[p].items() if k != "step")}


def _ids(rec: Any, names: Any) -> list[str]:
    ids = {v["name"]: v["id"] for v in rec.values}
    return [ids[n] for n in names]


def _rel(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float((x - y).norm()) / max(float(y.norm()), 1e-30)


def rank_main(args: argparse.Namespace) -> None:
    """One rank under torchrun (its environment names the rank, world size and store): train or check."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        run(args, device, init_device_mesh(device.type, (dist.get_world_size(),)))
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace, device: torch.device, mesh: DeviceMesh) -> None:
    if args.check:
        result = check(args, device, mesh)
        if args.out:
            Path(args.out, f"rank{result['rank']}.json").write_text(json.dumps(result))
        print(json.dumps({k: v for k, v in result.items() if k != "plans"}), flush=True)
        return
    backend = make_backend(args)
    model = shard(build_model().to(device), mesh, backend)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(args.steps):
        loss = step(model, optim, tokens(dist.get_rank(), device))
        if dist.get_rank() == 0:
            print(f"step {i}: loss {float(loss):.4f}", flush=True)
    pfn = backend.partitioner
    if dist.get_rank() == 0:
        for rec in pfn.history:  # one per graph partitioned: per-layer compile, one for every layer
            print(rec)
        if args.save_plans:
            opt_remat.save_plans(args.save_plans, pfn.history, pfn.settings)


def _spawned(rank: int, world: int, store: str, runs: list[argparse.Namespace]) -> None:
    torch.set_num_threads(1)  # the CPU ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        for args in runs:  # one after the other in the same processes (imports and the group paid once)
            run(args, torch.device("cpu"), mesh)
    finally:
        dist.destroy_process_group()


def launch_cpu(ranks: int, runs: list[argparse.Namespace]) -> None:
    """``ranks`` processes on this machine over gloo (no torchrun; a file store in a temporary
    folder), each doing ``runs`` in order."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_spawned, args=(ranks, str(Path(tmp, "store")), runs), nprocs=ranks)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default=None, help="opt-remat solver (default: the fast default)")
    ap.add_argument("--budget", default=None, help="saved-activation budget: a fraction (0.5) or bytes (512MiB)")
    ap.add_argument("--device-memory", default=None, help="the device's bytes (80GiB), with FSDP over the ranks")
    ap.add_argument("--plan", default=None, help="a plan file (--save-plans of an earlier run) instead of solving")
    ap.add_argument("--save-plans", default=None, help="write the plans made here (rank 0) to this file")
    ap.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="one step against the same FSDP step without opt-remat")
    ap.add_argument("--out", default=None, help="with --check: write each rank's result as OUT/rankN.json")
    ap.add_argument("--cpu-ranks", type=int, default=0, help="run N processes on the CPU over gloo (no torchrun)")
    args = ap.parse_args(argv)
    if args.budget is not None and args.budget.replace(".", "", 1).isdigit():  # a fraction, or bytes
        args.budget = float(args.budget) if "." in args.budget else int(args.budget)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.cpu_ranks:
        launch_cpu(args.cpu_ranks, [args])
    else:
        rank_main(args)


if __name__ == "__main__":
    main()
