"""The solver catalog: it matches the functions it describes; an option a solver does not take
(under the budgets given) is refused with the options it does take, through the API, YAML and the
CLI; a peak plan says what found it; a solve's progress shows as lines when piped."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import opt_remat
from opt_remat.cli import main
from opt_remat.runs import ConfigError, load_config
from opt_remat.runs.progress import Display
from solvers import catalog, registry
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.progress import Progress
from solvers.random_problems import random_problem

REPO = Path(__file__).resolve().parents[1]
TINY = """\
model:
  factory: opt_remat.models:mlp
  kwargs: {{d_in: 16, hidden: 32, layers: 2}}
  inputs: [{{shape: [4, 16], dtype: float32}}]
device: h100
budgets: {budgets}
solvers: [mincut, {{name: cpsat, time_limit_s: 5, {option}}}]
verify: {{gradients: false, measure_memory: false}}
output: {{dir: out, formats: [json]}}
"""


def _params(fn) -> dict[str, inspect.Parameter]:
    return {p.name: p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


@pytest.mark.parametrize("name", [n for n in catalog.names() if n != catalog.TORCH])
def test_catalog_matches_the_functions_it_describes(name):
    registry.available()
    entry = catalog.info(name)
    fields = {f.name: f for f in dataclasses.fields(entry.options)}
    for f in fields.values():
        assert f.metadata["doc"] and set(f.metadata["modes"]) <= set(catalog.MODES)
    saved = [k for k, f in fields.items() if catalog.SAVED in f.metadata["modes"] or catalog.FREE in f.metadata["modes"]]
    params = _params(registry._SOLVERS[name])
    assert sorted(saved) == sorted(params), "every option of the saved-bytes entry is declared, and no more"
    for key in saved:
        assert fields[key].default == params[key].default, key
    if catalog.PEAK in entry.modes:
        module, _, attr = registry._PEAK_ENTRIES[name].partition(":")
        peak_fn = getattr(__import__(module, fromlist=[attr]), attr)
        peak_params = _params(peak_fn)
        for key in entry.takes(catalog.PEAK):
            assert key in peak_params and fields[key].default == peak_params[key].default, key


def test_unknown_and_misplaced_options_name_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown option 'tie' for solver 'cpsat'; it takes: time_limit_s, "
                                         "threads, seed, warm_start_cuts, symmetry, gap"):
        catalog.check_options("cpsat", {"tie": 1}, catalog.MODES)
    with pytest.raises(ValueError, match="'backend' of solver 'milp' does not apply under a peak budget"):
        catalog.check_options("milp", {"backend": "highs"}, [catalog.PEAK])
    with pytest.raises(ValueError, match="'lam' of solver 'mincut' does not apply under a saved-bytes "
                                         "budget; there it takes: backend"):
        catalog.check_options("mincut", {"lam": 0.1}, [catalog.SAVED])
    catalog.check_options("cpsat", {"gap": 0.05, "symmetry": "warm"}, [catalog.SAVED, catalog.PEAK])
    with pytest.raises(ValueError, match="greedy.*cannot solve under a peak budget.*mincut, cpsat, milp"):
        catalog.typed_options("greedy", {}, catalog.PEAK)
    # the saved-bytes entry of the registry checks the same way: nothing reaches a solver unchecked
    problem = random_problem(0, n_forward=8, n_backward=6)
    with pytest.raises(ValueError, match="'gap' of solver 'cpsat' does not apply under a saved-bytes budget"):
        registry.solve(problem, "cpsat", 10**9, gap=0.1)


def test_yaml_refuses_options_of_no_budget_of_the_run(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(TINY.format(budgets="[0.5]", option="gap: 0.05"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert f"{path}:7" in text and "solvers[1].gap" in text
    assert "does not apply under a saved-bytes budget; there it takes: time_limit_s, threads, seed, " \
           "warm_start_cuts, symmetry" in text
    path.write_text(TINY.format(budgets="[0.5, {peak: '1MiB'}]", option="gap: 0.05"))
    assert load_config(path).solvers[1].options == {"time_limit_s": 5, "gap": 0.05}  # used by the peak pair
    path.write_text(TINY.format(budgets="[{peak: '1MiB'}]", option="symmetry: warm"))
    with pytest.raises(ConfigError, match="symmetry.*does not apply under a peak budget; there it takes: "
                                          "time_limit_s, threads, seed, gap"):
        load_config(path)


def test_cli_refuses_an_unknown_option_with_exit_2(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(TINY.format(budgets="[0.5]", option="threads: 1"))
    rc = main(["solve", str(path), "--solver", "cpsat", "-o", str(tmp_path / "p.json"),
               "--set", "solvers.1.time_limt_s=3"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown option 'time_limt_s' for solver 'cpsat'; it takes: time_limit_s" in err


def test_peak_plans_say_what_found_them():
    problem = random_problem(3, n_forward=14, n_backward=10, ban_prob=0.0)
    floor = peak_lower_bound(problem)
    top = simulate_plan(problem, registry.solve(problem, "save-all").saved).peak
    budget = (floor + top) // 2
    plan = registry.solve_peak(problem, "cpsat", budget, options={"time_limit_s": 5})
    assert plan.solver == f"cpsat (peak: {plan.extra['found_by']})"
    assert plan.message.startswith("the peak search (HiGHS relaxation and cut rounds, local search), "
                                   "asked for as 'cpsat': ")
    assert simulate_plan(problem, plan.saved).peak <= budget
    plan = registry.solve_peak(problem, "milp", budget, options={"time_limit_s": 5})
    assert plan.solver.startswith("milp (peak: ")
    plan = registry.solve_peak(problem, "mincut", top)
    assert plan.solver.startswith("mincut (peak: ")


def test_lines_mode_prints_a_line_per_change():
    out = io.StringIO()
    display = Display("lines", stream=out)
    display.doing("solving 0.5 cpsat")
    for p in [Progress(None, None, "relaxation"), Progress(2e-3, 1e-3, "relaxation"),
              Progress(2e-3, 1e-3, "relaxation"), Progress(2e-3, 1.5e-3, "cuts")]:
        display.search(p)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[1].startswith("solving 0.5 cpsat: phase relaxation, best 2 ms, bound 1 ms, gap 50.0% (")
    assert "phase cuts" in lines[2] and "bound 1.5 ms" in lines[2] and "gap 25.0%" in lines[2]


def test_solve_piped_prints_progress_lines(tmp_path):
    from opt_remat.runs import materialize

    path = tmp_path / "c.yaml"
    path.write_text(TINY.format(budgets="[0.5]", option="threads: 1"))
    problem = materialize(load_config(path)).problem
    top = simulate_plan(problem, registry.solve(problem, "save-all").saved).peak
    middle = (peak_lower_bound(problem) + top) // 2
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "opt_remat.cli", "solve", str(path), "--solver", "cpsat",
                           "--budget", f"{{peak: {middle}}}", "-o", str(tmp_path / "p.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"solving budget peak {middle} with cpsat: ")]
    assert len(lines) >= 2, proc.stdout  # piped: no bar, a line per change
    assert all("phase " in ln and "best " in ln and "bound " in ln for ln in lines), lines
    assert "\r" not in proc.stdout and "cpsat (peak: " in proc.stdout


def test_partitioner_verbose_prints_lines_to_stderr(capfd):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    pfn = opt_remat.partitioner("cpsat", peak_budget="1MiB", verbose=True, time_limit_s=5)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=opt_remat.backend(partition_fn=pfn, compiler="eager"))
    compiled(torch.randn(4, 8)).sum().backward()
    out, err = capfd.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("opt-remat: ")]
    assert any("phase " in ln and "best " in ln and "bound " in ln for ln in lines), err
    assert any("plan by cpsat (peak: " in ln for ln in lines), err
    assert "opt-remat: " not in out


def test_a_run_gives_each_pair_the_options_of_its_kind_of_budget(tmp_path, capsys):
    # one solver entry serves both kinds of budget (documented): the saved-bytes pair uses symmetry,
    # the peak pair leaves it out without a warning; an option of neither kind is refused
    path = tmp_path / "c.yaml"
    path.write_text(TINY.format(budgets="[0.5, {peak: '10MiB'}]", option="symmetry: warm")
                    .replace("dir: out", f"dir: {tmp_path / 'out'}"))
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out and "do not apply" not in out
    records = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    cpsat = [r for r in records if r["solver"] == "cpsat"]
    assert len(cpsat) == 2 and all(r["status"] not in ("error", "skipped", "infeasible") for r in cpsat), cpsat
    path.write_text(TINY.format(budgets="[0.5]", option="gap: 0.1"))
    assert main(["run", str(path)]) == 2
    assert "solvers[1].gap" in capsys.readouterr().err


def test_solvers_command_lists_every_solver_and_option(capsys):
    assert main(["solvers"]) == 0
    out = capsys.readouterr().out
    for name in catalog.names():
        assert f"\n{name}: " in "\n" + out
    assert "- gap=0.01: stop once the plan is within this relative gap of the bound; budgets: peak" in out
    assert "- lam=None:" in out and "budgets: none\n" in out


def test_searches_report_their_start_and_end():
    # the MILP engines (HiGHS, CBC) report nothing while they run: their start and end are reported
    from solvers import progress

    problem = random_problem(4, n_forward=12, n_backward=8, ban_prob=0.0)
    budget = registry.solve(problem, "save-all").saved_bytes // 2
    heard: list[Progress] = []
    with progress.reporting(heard.append):
        plan = registry.solve(problem, "milp", budget, backend="highs", time_limit_s=10)
        registry.solve(problem, "greedy", budget)  # a baseline reports nothing
    assert heard[0].phase == "milp: started" and heard[0].incumbent is None
    assert heard[-1].phase == "milp: done" and heard[-1].incumbent == plan.recompute_cost
    assert heard[-1].bound == plan.bound
