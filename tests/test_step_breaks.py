"""A step with graph breaks under a peak budget: ``opt-remat solve`` plans its graphs together (one
budget for the step, ``solvers.step_solve``), and each compiled region applies its plan."""

from __future__ import annotations

import json

import torch

import opt_remat
from opt_remat.cli import main
from solvers.step import Step, StepGraph, step_peak
from solvers.step_solve import solve_step


def test_graph_breaks_share_one_peak_budget(tmp_path, capsys):
    config = tmp_path / "broken.yaml"
    config.write_text('model: {factory: "test_offline_plans:Broken", inputs: [{shape: [64, 16]}]}\n'
                      "capture: {meta: true}\nbudgets: [{peak: 50KiB}]\nsolvers: [default]\n")
    plan = tmp_path / "plan.json"
    assert main(["solve", str(config), "-o", str(plan)]) == 0
    doc = json.loads(plan.read_text())
    assert len(doc["graphs"]) == 2 and [g["repeat"] for g in doc["step"]["graphs"]] == [1, 1]
    assert doc["step"]["peak_bytes"] <= 50 * 1024
    assert "step peak" in capsys.readouterr().out

    from test_offline_plans import Broken
    torch.manual_seed(0)
    be = opt_remat.backend(plan=str(plan), compiler="eager", decompositions="inductor")
    torch.compile(Broken(), backend=be)(torch.randn(64, 16)).sum().backward()
    assert [r.plan.solver for r in be.partitioner.history] == ["plan:step", "plan:step"]
    # the budget is the step's: the two graphs' plans together, as one step
    problems = [r.problem for r in be.partitioner.history]
    step = Step(tuple(StepGraph(str(i), p) for i, p in enumerate(problems)))
    saved = {str(i): r.plan.saved for i, r in enumerate(be.partitioner.history)}
    assert step_peak(step, saved).total == doc["step"]["peak_bytes"]
    assert solve_step(step, 50 * 1024).peak.total <= 50 * 1024
