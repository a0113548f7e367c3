"""Training under FSDP2 with opt-remat, on the CPU over 2 gloo processes: the README's example
(``examples/fsdp2_llama.py``): a small HF LLaMA, ``fully_shard`` per decoder layer and on the root,
bf16 compute with fp32 sharded parameters, each layer compiled with ``opt_remat.backend``. One
AdamW step equals the same FSDP step in eager (loss, full gradients, updated parameters) with a
plan solved under a budget (it recomputes), with that plan read back from its file, and under a
device budget that makes the layer recompute; there the layer record's states are FSDP2's own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

import opt_remat
from opt_remat.formats.plan_file import read_plan_file
from opt_remat.verify import compare_steps

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _ranks(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def _plan_ids(entry: dict) -> tuple[str, list[str]]:
    ids = {v[0]: v[1] for v in entry["values"]}
    return entry["graph_id"], sorted(ids[n] for n in entry["saved"])


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class _Blocks(torch.nn.Module):
    """Three blocks of the same shapes, each compiled on its own (as decoder layers under FSDP2)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x).sin()
        return x


def _step(model: torch.nn.Module, backend) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch._dynamo.reset()
    for block in model.blocks:
        block.compile(backend=backend)
    loss = model(torch.randn(4, 16, generator=torch.Generator().manual_seed(0))).square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_save_plans_keeps_one_plan_per_graph_and_applies(tmp_path):
    torch.manual_seed(0)
    model = _Blocks()
    solved = opt_remat.backend(budget=0.0, compiler="eager", decompositions="inductor")
    loss, grads = _step(model, solved)
    history = solved.partitioner.history
    # the first block's input needs no gradient, the others' do: two graphs, the second serving two blocks
    assert len(history) == 2 and all(r.plan.recomputed for r in history)
    path = opt_remat.save_plans(tmp_path / "plans.json", history * 2, solved.partitioner.settings)
    doc = read_plan_file(path)
    assert [g["graph_id"] for g in doc["graphs"]] == [r.graph_id for r in history]  # one plan per graph
    assert doc["made_for"]["capture"] == {"compiler": "eager", "decompositions": "inductor"}

    model.zero_grad()
    applied = opt_remat.backend(plan=str(path), compiler="eager", decompositions="inductor")
    check = compare_steps(_step(model, applied), (loss, grads))
    assert [(r.plan.solver, r.plan.saved_bytes, r.graph_id) for r in applied.partitioner.history] == [
        ("plan:" + r.plan.solver, r.plan.saved_bytes, r.graph_id) for r in history]
    assert check.ok and check.bitwise
    with pytest.raises(ValueError, match="no partition records"):
        opt_remat.save_plans(tmp_path / "empty.json", [])


@pytest.mark.hf
@pytest.mark.slow
def test_fsdp2_step_with_opt_remat_equals_eager_fsdp(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    if "spawn" not in mp.get_all_start_methods():
        pytest.skip("processes cannot be spawned here (multiprocessing has no 'spawn' start method)")
    if "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # the ranks are local: no need for the host name to resolve
    sys.path.insert(0, str(EXAMPLES))
    import fsdp2_llama as example

    plans, solved, applied, device = (tmp_path / name for name in ("plans.json", "solved", "applied", "device"))
    for folder in (solved, applied, device):
        folder.mkdir()
    common = ["--check", "--compiler", "eager"]
    example.launch_cpu(2, [
        example.parse(common + ["--budget", "0.3", "--save-plans", str(plans), "--out", str(solved)]),
        example.parse(common + ["--plan", str(plans), "--out", str(applied)]),
        # between the layer graph's least peak (625 KiB) and its min-cut plan's (788 KiB): it recomputes to fit
        example.parse(common + ["--device-memory", "720KiB", "--out", str(device)]),
    ])

    for run in (solved, applied, device):
        for rank in _ranks(run):
            assert rank["same_names"], run
            assert rank["loss"] == pytest.approx(rank["loss_eager"], rel=1e-6), (run, rank)
            assert rank["grad_error"] <= 1e-5 and rank["param_error"] <= 1e-5, (run, rank)

    # under a device budget the record of the layer graph (planned as if it were the step) holds
    # one layer's states, as FSDP2's own shards, gathered layer and AdamW state on each rank are
    for rank in _ranks(device):
        [rec] = rank["plans"]
        held = rank["layer_states"]
        assert rec["device_peak"]["sharded parameters"] == held["sharded"], rec["repr"]
        assert rec["device_peak"]["gathered parameters"] == held["gathered"], rec["repr"]
        assert rec["device_peak"]["optimizer state"] == held["optimizer"], rec["repr"]
        assert rec["device_peak"]["total"] <= 720 * 1024 and rec["recomputed"] > 0, rec["repr"]

    # one layer graph serves both decoder layers; under the budget its plan recomputes
    doc = read_plan_file(plans)
    assert len(doc["graphs"]) == 1
    expect = _plan_ids(doc["graphs"][0])
    for run, solver in ((solved, lambda s: not s.startswith("plan:")), (applied, lambda s: s.startswith("plan:"))):
        for rank in _ranks(run):
            [rec] = rank["plans"]
            assert solver(rec["solver"]), rec["repr"]
            assert rec["recomputed"] > 0, rec["repr"]
            # both ranks, solving on their own or reading the file, run the plan the file holds
            assert (rec["graph_id"], rec["saved"]) == expect, (run, rank["rank"])
