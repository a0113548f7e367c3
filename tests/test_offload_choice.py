"""Offload chosen by the planner through the API (``partitioner(peak_budget=..., offload=True)``):
the plan fits the peak by the offload-aware simulation, adds no more time than the plan without
offload, is lowered with exactly its offloads, and trains with the gradients of the same plan
without them (on a CPU torch's pass copies to host memory too)."""

import dataclasses
from unittest import mock

import pytest
import torch

import opt_remat
from opt_remat import road
from opt_remat.models import example_inputs, gpt2
from opt_remat.offload import offloaded_values
from opt_remat.request import RequestError, make_request
from opt_remat.verify import compare_steps, training_step
from solvers import check_plan
from solvers.liveness import simulate_plan
from solvers.offload import offload_errors, offloaded_curve
from solvers.offload_plan import offload_cost

pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py

# a slow device (so recompute costs as much as copies do on these small tensors), every value a candidate
DEVICE = {"name": "slow", "peak_flops": 1e9, "bandwidth": 1e9, "host_bandwidth": 1e9}
OFFLOAD = {"min_bytes": 1}


class _Lowered(opt_remat.Partitioner):
    """Records what the lowered forward offloads (inductor edits its graphs later)."""

    def __post_init__(self):
        super().__post_init__()
        self.done: list[set[str]] = []

    def __call__(self, *args, **kw):
        fw, bw = super().__call__(*args, **kw)
        self.done.append(offloaded_values(fw))
        return fw, bw


class _Without(_Lowered):
    """The plan ``fixed`` (made with offload) without its offloads."""

    fixed = None

    def __call__(self, *args, **kw):
        with mock.patch.object(road, "solve_problem", lambda *a, **k: dataclasses.replace(self.fixed,
                                                                                          offloaded=frozenset())):
            return super().__call__(*args, **kw)

    def uuid(self):
        return "without-" + super().uuid()


def _gpt():
    torch.manual_seed(0)
    model = gpt2(layers=2, dropout=0.2)
    return model, example_inputs("gpt", model, batch=2)


def _peak_between(model, inputs):
    """A peak budget between the least-peak plan's and saving everything's."""
    pfn = opt_remat.partitioner(device=DEVICE)
    training_step(model, inputs, opt_remat.backend(compiler="eager", partition_fn=pfn), seed=1)
    problem = pfn.history[-1].problem
    top = simulate_plan(problem, [n for n in problem.backward_reads if problem.can_save(n)]).peak
    torch._dynamo.reset()
    return int(top * 0.85)


@pytest.mark.parametrize("compiler", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_gpt_planned_with_offload_trains_as_the_same_plan_without(compiler):
    model, inputs = _gpt()
    peak = _peak_between(model, inputs)
    plain = opt_remat.partitioner(peak_budget=peak, device=DEVICE)
    training_step(model, inputs, opt_remat.backend(compiler=compiler, partition_fn=plain), seed=3)
    torch._dynamo.reset()
    pfn = _Lowered(peak_budget=peak, device=DEVICE, offload=OFFLOAD)
    off = training_step(model, inputs, opt_remat.backend(compiler=compiler, partition_fn=pfn), seed=3)
    rec, before = pfn.history[-1], plain.history[-1]
    link = road.offload_link(pfn.request)
    assert rec.plan.offloaded, "a tight peak on a slow device: offload is chosen"
    assert check_plan(rec.problem, rec.plan).valid and not offload_errors(rec.problem, rec.plan, link)
    assert pfn.done[-1] == set(rec.plan.offloaded)
    curve, _ = offloaded_curve(rec.problem, rec.plan.saved, rec.plan.offloaded, link)
    assert curve.peak <= peak
    with_off = offload_cost(rec.problem, rec.plan.saved, rec.plan.offloaded, link)
    assert with_off.added_s <= offload_cost(rec.problem, before.plan.saved, (), link).added_s + 1e-12
    torch._dynamo.reset()
    same = _Without(peak_budget=peak, device=DEVICE)
    same.fixed = rec.plan
    ref = training_step(model, inputs, opt_remat.backend(compiler=compiler, partition_fn=same), seed=3)
    assert same.history[-1].plan.saved == rec.plan.saved and not same.done[-1]
    check = compare_steps(off, ref)
    assert check.ok and (check.bitwise if compiler == "eager" else check.max_rel_error <= 1e-6), check


def test_offload_settings_are_checked_where_they_enter():
    request = make_request(peak_budget="1GiB", offload={"host_memory": "2GiB", "min_bytes": "4MiB"})
    assert (request.offload, request.host_memory, request.offload_min_bytes) == (True, 2 << 30, 4 << 20)
    assert not make_request().offload
    for bad, field in (("yes", "offload"), ({"host": 1}, "offload.host"), ({"host_memory": 0.5}, "offload.host_memory"),
                       ({"min_bytes": "lots"}, "offload.min_bytes")):
        with pytest.raises(RequestError) as info:
            make_request(offload=bad)
        assert info.value.field == field and "\n" not in str(info.value)


def test_a_run_with_offload_shows_it_in_records_plan_files_show_and_html(tmp_path, capsys):
    import json

    from opt_remat.runs import load_config, materialize, read_results, run
    from opt_remat.cli import main

    config = tmp_path / "gpt.yaml"
    config.write_text(f"""
model:
  factory: opt_remat.models:gpt2
  kwargs: {{layers: 2, d_model: 64, heads: 4, vocab: 256, seq: 32}}
  inputs: [{{shape: [2, 32], dtype: int64, high: 256}}]
  loss: sum
capture: {{compiler: eager, decompositions: inductor, dtype: float32}}
device: {json.dumps(DEVICE)}
offload: {{min_bytes: 1, host_memory: 1GiB}}
budgets: [0.5]
solvers: [default]
verify: {{gradients: true, measure_memory: false}}
output: {{dir: {tmp_path / 'out'}, formats: [table, json, csv, html]}}
""")
    work = materialize(load_config(config))
    problem = work.problem
    peak = int(simulate_plan(problem, [n for n in problem.backward_reads if problem.can_save(n)]).peak * 0.85)
    cfg = load_config(config, [f"budgets=[{{peak: {peak}}}]"])
    summary = run(cfg, work=work)
    rec = summary.records[0]
    assert rec.offload["offloaded"] > 0 and rec.verified, rec
    assert rec.peak_bytes <= peak and rec.offload["added_time_s"] == pytest.approx(
        rec.recompute_cost + rec.offload["exposed_transfer_s"])
    assert rec.curve.live["in flight"] and max(rec.curve.live["in flight"]) > 0
    assert read_results(tmp_path / "out" / "results.json").records[0].offload == rec.offload
    csv_text = (tmp_path / "out" / "results.csv").read_text()
    assert "added_time_s" in csv_text.splitlines()[0]
    assert "in flight" in (tmp_path / "out" / "report.html").read_text()
    capsys.readouterr()
    main(["show", str(tmp_path / "out" / rec.plan_file)])
    assert f"{rec.offload['offloaded']} values offloaded" in capsys.readouterr().out


@pytest.mark.parametrize("setting, field, words", [
    ("{host: 1GiB}", "offload.host", "unknown offload setting 'host'"),
    ("{host_memory: 0.5}", "offload.host_memory", "bytes"),
    ("true\ndevice: {peak_flops: 1.0e12, bandwidth: 1.0e11}", "offload", "host_bandwidth"),
])
def test_yaml_offload_errors_name_the_field_and_line(tmp_path, setting, field, words):
    from opt_remat.runs import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{graph: g.txt}}\nbudgets: [0.5]\nsolvers: [default]\noffload: {setting}\n")
    (tmp_path / "g.txt").write_text("")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == field and words in str(info.value) and ":4:" in str(info.value).split()[0]


def test_a_peak_only_offload_meets_is_met_and_one_it_cannot_is_refused():
    from opt_remat.errors import PeakBudgetError

    model, inputs = _gpt()
    pfn = opt_remat.partitioner(device=DEVICE, offload=True)  # built as offload requests build it
    training_step(model, inputs, opt_remat.backend(compiler="eager", partition_fn=pfn), seed=1)
    problem = pfn.history[-1].problem
    with pytest.raises(PeakBudgetError) as info:
        road.solve_problem(problem, make_request(peak_budget=1, device=DEVICE), None)
    budget = info.value.min_peak  # the least peak found without offload: 16 KiB steps below, a refused one
    for _ in range(8):
        budget -= 16 * 1024
        try:
            road.solve_problem(problem, make_request(peak_budget=budget, device=DEVICE), None)
        except PeakBudgetError:
            break
    else:
        pytest.fail("every budget tried was met without offload")
    request = make_request(peak_budget=budget, device=DEVICE, offload=OFFLOAD)
    plan = road.solve_problem(problem, request, None)
    curve, _ = offloaded_curve(problem, plan.saved, plan.offloaded, road.offload_link(request))
    assert plan.offloaded and curve.peak <= budget
    with pytest.raises(PeakBudgetError, match="with it no plan found fits either"):
        road.solve_problem(problem, make_request(peak_budget=1, device=DEVICE, offload=OFFLOAD), None)


def test_a_solved_plan_file_shows_what_the_run_records_from_one_simulation(monkeypatch):
    """``opt-remat solve``'s plan entry and a run's record read the same curve (the rank's memory
    and the offload applied), and the entry simulates the plan once."""
    from support.counting import count_simulations
    from support.random_problems import random_problem

    from opt_remat.formats.plan_file import values_of_problem
    from opt_remat.runs.plan_files import plan_curve, plan_entry
    from opt_remat.runs.workload import Workload
    from solvers.baselines import save_all
    from solvers.offload import HostLink, offload_candidates

    problem = random_problem(3)
    request = make_request(device=DEVICE, offload=OFFLOAD, training={"optimizer": "adamw"})
    work = Workload(problem, "", request.profile, request, values=values_of_problem(problem))
    plan = save_all(problem)
    away = next(v for v in offload_candidates(problem, HostLink(1.0, 1.0, min_bytes=1)) if v in plan.saved)
    plan = dataclasses.replace(plan, offloaded=frozenset({away}))
    simulated = count_simulations(monkeypatch, ("opt_remat.runs", "solvers.offload"))
    entry = plan_entry(work, plan, setup=request.training)
    assert sum(simulated.values()) == 1
    curve, figures = plan_curve(work, plan, request.training)
    assert entry["offload"] == figures and figures["offloaded"] == 1
    assert (entry["peak_bytes"], entry["peak_by_kind"]) == (curve.peak, curve.peak_by_kind())
    on_device = plan_curve(work, dataclasses.replace(plan, offloaded=frozenset()), request.training)[0]
    assert curve.live["total"] != on_device.live["total"]  # the value away shows
