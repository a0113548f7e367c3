"""costs="profile": recompute costs timed on the device (here the CPU), cached on disk, and
changing plans where the roofline misjudges (small ops: launch overhead the roofline ignores)."""

import json

import torch

from opt_remat.build import problem_from_joint
from opt_remat.capture import capture
from opt_remat.models import example_inputs, gpt2
from opt_remat.profile_costs import cache_path
from solvers.mincut import solve_mincut


def _joint():
    torch.manual_seed(0)
    model = gpt2(layers=1, d_model=32, heads=2, vocab=64, seq=16)
    return capture(model, example_inputs("gpt2", model), decompositions="inductor")


def test_profiled_costs_are_measured_cached_and_change_the_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("OPT_REMAT_CACHE_DIR", str(tmp_path))
    joint = _joint()
    _, roofline = problem_from_joint(joint, device="h100")
    _, profiled = problem_from_joint(joint, device="h100", costs="profile")
    cache = json.loads(cache_path().read_text())
    assert len(cache) > 10 and all(v > 0 for v in cache.values())
    timed = [n for n in profiled.candidates
             if n.cost != roofline.by_name[n.name].cost]
    assert len(timed) > 10 and all(n.cost > 0 for n in timed)
    # on a CPU, a tiny elementwise op takes microseconds, not the roofline's nanoseconds
    small = [n for n in timed if roofline.by_name[n.name].cost < 1e-9]
    assert small and all(n.cost > 10 * roofline.by_name[n.name].cost for n in small)

    # a second build times nothing: every op comes from the cache, with the same costs
    before = cache_path().stat().st_mtime_ns
    _, again = problem_from_joint(joint, device="h100", costs="profile")
    assert cache_path().stat().st_mtime_ns == before
    assert {n.name: n.cost for n in again.nodes} == {n.name: n.cost for n in profiled.nodes}

    # the plans differ: with measured costs recomputing small ops is dearer than the roofline says
    lam = 0.1 * 3.35e12
    assert solve_mincut(roofline, lam).saved != solve_mincut(profiled, lam).saved


def test_a_profile_run_reports_both_estimates(tmp_path, monkeypatch):
    from opt_remat.cli import main
    monkeypatch.setenv("OPT_REMAT_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "run.yaml"
    config.write_text(
        "model:\n  factory: opt_remat.models:mlp\n  kwargs: {d_in: 16, hidden: 32, layers: 2}\n"
        "  inputs: [{shape: [4, 16], dtype: float32}]\n  loss: sum\n"
        "costs: profile\nbudgets: [0.5]\nsolvers: [mincut]\n"
        f"output: {{dir: {tmp_path / 'out'}, formats: [table, json]}}\n")
    assert main(["run", str(config)]) == 0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "recompute costs per op kind" in summary and "measured / roofline" in summary
    assert json.loads((tmp_path / "cache" / "op_costs.json").read_text())
