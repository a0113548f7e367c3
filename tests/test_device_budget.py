"""A device budget through the one road (#41): the API and YAML give the same plan, a device too
small for the rank's states is one clear line (API and CLI), and every place a plan shows splits
its peak by kind (plan files, ``show``, the summary, the HTML report)."""

from __future__ import annotations

import json

import pytest
import torch

import opt_remat
from opt_remat.cli import main
from opt_remat.request import ONE_DEVICE, RequestError, make_request
from opt_remat.runs import load_config, materialize
from opt_remat.runs.curves import TOTAL, step_curve
from opt_remat.runs.execute import solve_one
from opt_remat.verify import training_step
from solvers.catalog import solve as solve_named
from solvers.device_budget import DeviceBudgetError
from solvers.liveness import simulate_plan
from solvers.memory_kinds import MemoryKind as K
from solvers.rank_memory import rank_peak
from solvers.training import training_setup
from tests.support.random_problems import random_problem

LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}
TRAINING = {"sharding": "fsdp", "ranks": 8, "optimizer": "adamw", "param_dtype": "bf16"}
DEVICE = 1_050_000  # below the rank's peak under the plan of the default min-cut path: the plan must change
TOO_SMALL = "300KiB"  # below the states (224.62 KiB) and the smallest graph peak (192.25 KiB) together

CONFIG = f"""\
model:
  factory: opt_remat.hf:causal_lm
  kwargs: {{architecture: LlamaForCausalLM, config: {json.dumps(LLAMA)}}}
  inputs: [{{shape: [2, 32], dtype: int64, high: 256}}]
capture: {{compiler: eager, decompositions: inductor}}
training: {json.dumps(TRAINING)}
budgets: [{{device: {DEVICE}}}, {{device: {TOO_SMALL}}}, 0.5]
solvers: [default]
verify: {{gradients: false, measure_memory: false}}
output: {{dir: out, formats: [table, json, html]}}
"""

def _api(device_memory: int | str, training: dict | None = TRAINING):
    pytest.importorskip("transformers")
    from opt_remat.hf import causal_lm
    torch.manual_seed(0)
    model = causal_lm("LlamaForCausalLM", LLAMA)
    torch._dynamo.reset()
    be = opt_remat.backend(compiler="eager", decompositions="inductor", device_memory=device_memory,
                           training=training)
    training_step(model, (torch.randint(0, 256, (2, 32)),), be)
    return be.partitioner.history[-1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("device") / "llama.yaml"
    path.write_text(CONFIG)
    assert main(["run", str(path)]) == 0
    return path.parent / "out"


@pytest.mark.hf
def test_api_and_yaml_give_the_same_plan_under_a_device_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("OPT_REMAT_PLAN_MEMORY", "0")  # each solve on its inputs alone
    rec = _api(DEVICE)
    ids = {v["name"]: v["id"] for v in rec.values}
    api_ids = frozenset(ids[n] for n in rec.plan.saved)
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    cfg = load_config(path)
    work = materialize(cfg)
    plan, _ = solve_one(work, "default", cfg.budgets[0])
    ids = {v["name"]: v["id"] for v in work.values}
    assert api_ids == frozenset(ids[n] for n in plan.saved)
    assert (rec.plan.saved_bytes, rec.plan.recompute_cost) == (plan.saved_bytes, plan.recompute_cost)
    # the plan fits the device, counting the rank's whole memory, where the default path's does not
    setup = training_setup(TRAINING)
    assert rec.device_peak.total == rank_peak(rec.problem, rec.plan.saved, setup).total <= DEVICE
    unbudgeted = solve_named(rec.problem, "mincut")
    assert rank_peak(rec.problem, unbudgeted.saved, setup).total > DEVICE
    text = repr(rec)
    assert "device peak" in text and "of 1.00 MiB" in text and "\n" not in text


@pytest.mark.hf
def test_a_device_below_the_states_is_one_line_through_the_api():
    with pytest.raises(DeviceBudgetError) as err:
        _api(TOO_SMALL)
    text = str(err.value)
    assert "\n" not in text and "224.62 KiB of states" in text and "optimizer state" in text
    assert "would fit with FSDP over" in text  # what would fit is named
    assert isinstance(err.value, opt_remat.OptRematError)


@pytest.mark.hf
def test_a_device_below_the_states_is_one_line_through_the_cli(tmp_path, capsys):
    pytest.importorskip("transformers")
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    rc = main(["solve", str(path), "--budget", f"{{device: {TOO_SMALL}}}", "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    line = [x for x in err.splitlines() if "error" in x]
    assert len(line) == 1 and "cannot hold the step" in line[0] and "224.62 KiB of states" in line[0]
    assert not (tmp_path / "p.json").exists()


@pytest.mark.hf
def test_show_summary_and_html_split_the_peak_by_kind(run_dir, capsys):
    results = json.loads((run_dir / "results.json").read_text())
    by_budget = {r["budget"]: r for r in results["results"]}
    fits = by_budget[f"device {DEVICE}"]
    assert fits["device_memory"] == DEVICE and fits["peak_bytes"] <= DEVICE
    kinds = fits["peak_by_kind"]
    assert sum(kinds.values()) == fits["peak_bytes"] and kinds[K.OPTIMIZER.value] > 0
    assert by_budget[f"device {TOO_SMALL}"]["status"] == "infeasible"
    assert "cannot hold the step" in by_budget[f"device {TOO_SMALL}"]["error"]
    curve = fits["curve"]["live"]  # a series per kind beside the total, summing to it
    assert [sum(at) for at in zip(*(v for k, v in curve.items() if k != TOTAL))] == curve[TOTAL]
    summary = (run_dir / "summary.txt").read_text()
    assert "step peak by kind" in summary and "gathered parameters" in summary and "optimizer state" in summary
    html = (run_dir / "report.html").read_text()
    assert 'id="fig-kinds-0"' in html and '"stackgroup"' in html and "memory by kind" in html
    plan_file = run_dir / fits["plan_file"]
    assert main(["show", str(plan_file)]) == 0
    out = capsys.readouterr().out
    assert "peak by kind" in out and "optimizer state" in out and "(device 1.00 MiB)" in out


def test_request_checks_device_memory_and_training():
    assert make_request(device_memory="80GiB").device_memory == 80 * 2**30
    assert make_request(device_memory="80GiB").rank_setup == ONE_DEVICE
    assert make_request(training=TRAINING).training == training_setup(TRAINING)
    for kwargs, field in (({"device_memory": 0.5}, "device_memory"), ({"device_memory": "lots"}, "device_memory"),
                          ({"training": {"optimizer": "lion"}}, "training.optimizer"),
                          ({"training": {"rank": 8}}, "training.rank"),
                          ({"device_memory": "1GiB", "peak_budget": "1GiB"}, "device_memory"),
                          ({"device_memory": "1GiB", "solver": "greedy"}, "solver")):
        with pytest.raises(RequestError) as err:
            make_request(**kwargs)
        assert err.value.field == field and "\n" not in str(err.value)


@pytest.mark.parametrize("seed", range(8))
def test_curves_split_by_kind_add_up_to_the_simulation(seed):
    """The report's curve (one simulation, split by kind) against the plain simulation and the
    rank's peak, computed independently."""
    p = random_problem(seed)
    saved = solve_named(p, "greedy" if seed % 2 else "inputs-only").saved
    plain = simulate_plan(p, saved)
    curve = step_curve(p, saved)
    assert curve.live[TOTAL] == [b for _, _, b in plain.steps] and curve.peak == plain.peak
    assert curve.peak_gradients == plain.peak_gradients
    kinds = curve.peak_by_kind()
    assert sum(kinds.values()) == curve.peak
    graph = rank_peak(p, saved, None)
    assert {k.value: v for k, v in graph.by_kind.items() if v} == {k: v for k, v in kinds.items() if v}


def test_a_random_problem_without_parameters_on_one_device_is_the_graph():
    p = random_problem(3)
    saved = solve_named(p, "inputs-only").saved
    assert step_curve(p, saved, ONE_DEVICE).peak == step_curve(p, saved).peak == simulate_plan(p, saved).peak


@pytest.mark.parametrize("change,where", [
    (("budgets: [", "budgets: [{device: 0.5}, "), "budgets[0].device"),
    (("budgets: [", "budgets: [{device: 1MiB, peak: 1MiB}, "), "budgets[0]"),
    (('"optimizer": "adamw"', '"optimizer": "lion"'), "training.optimizer"),
    (('"ranks": 8', '"rank": 8'), "training.rank"),
])
def test_yaml_errors_name_the_field(tmp_path, change, where):
    from opt_remat.runs import ConfigError
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.replace(*change))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert f": {where}: " in text and "\n" not in text
