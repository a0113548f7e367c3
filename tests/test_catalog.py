"""The solver catalog: it matches the functions it describes; an option a solver does not take
(under the budgets given) is refused with the options it does take, through the API, YAML and the
CLI; a peak plan says what found it; a solve's progress shows as lines when piped."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.random_problems import random_problem

import opt_remat
from opt_remat.cli import main
from opt_remat.runs import ConfigError, load_config
from opt_remat.runs.progress import Display
from solvers import catalog
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.mincut import solve_mincut
from solvers.options import MilpOptions, PeakSearchOptions, value_error
from solvers.progress import Progress

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


@pytest.mark.parametrize("name", catalog.names())
def test_each_solver_is_one_whole_object(name):
    entry = catalog.info(name)
    assert entry.name == name and entry.summary and entry.options.__dataclass_params__.frozen
    fields = dataclasses.fields(entry.options)
    for f in fields:  # documented, valid by default, and taken under some budget the solver meets
        assert f.metadata["doc"] and value_error(f, f.default) is None, f.name
        assert any(f.name in entry.takes(m) for m in entry.modes), f.name
    if name != catalog.TORCH:  # torch's baseline runs on the FX graph, in opt_remat
        assert (entry.run is not None) == (bool(set(entry.modes) - {catalog.PEAK}) and name != catalog.DEFAULT)
        assert (entry.run_peak is not None) == (catalog.PEAK in entry.modes)
    if entry.peak_alias:  # an old name under a peak budget: the solver it names runs, with its options
        ran = catalog.resolve(name, catalog.PEAK)
        assert ran.name == entry.peak_alias and ran.run_peak is not None
        assert catalog.typed_options(name, {}, catalog.PEAK) == ran.options()


def test_the_peak_modes_and_their_old_names():
    assert catalog.resolve(None, catalog.PEAK).name == catalog.resolve("mincut", catalog.PEAK).name == "default"
    assert {catalog.resolve(n, catalog.PEAK).name for n in ("cpsat", "milp", "peak-search")} == {"peak-search"}
    assert catalog.resolve("mincut", catalog.SAVED).name == "mincut"
    assert catalog.supporting(catalog.PEAK) == ["default", "mincut", "cpsat", "milp", "peak-search"]


def test_options_reach_the_solver_as_typed():
    # the same plan through the catalog as from the engine called directly, options and all
    problem = random_problem(5, n_forward=10, n_backward=8, ban_prob=0.0)
    typed = catalog.typed_options("mincut", {"lam": 1e-6, "backend": "networkx"}, catalog.FREE)
    plan = catalog.solve(problem, "mincut", None, typed)
    direct = solve_mincut(problem, 1e-6, backend="networkx")
    assert plan.saved == direct.saved and plan.extra["backend"] == "networkx"
    budget = catalog.solve(problem, "save-all").saved_bytes // 2
    milp = catalog.solve(problem, "milp", budget, catalog.typed_options("milp", {"backend": "highs"}, catalog.SAVED))
    assert milp.extra["backend"] == "highs"


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
    with pytest.raises(ValueError, match="'gap' of solver 'cpsat' does not apply under a saved-bytes budget"):
        catalog.check_options("cpsat", {"gap": 0.1}, [catalog.SAVED])
    with pytest.raises(ValueError, match="'threads' is not taken by the default path .* without a budget; "
                                         "there it takes: lam, backend"):
        catalog.check_options(None, {"threads": 1}, [catalog.FREE])
    catalog.check_options(None, {"threads": 1}, [catalog.FREE, catalog.SAVED])  # the exact search's


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
    top = simulate_plan(problem, catalog.solve(problem, "save-all").saved).peak
    budget = (floor + top) // 2
    options = PeakSearchOptions(time_limit_s=5)
    plan = catalog.solve_peak(problem, "cpsat", budget, options=options)
    assert plan.solver == f"peak-search (found by {plan.extra['found_by']})"
    assert plan.message.startswith("asked for as 'cpsat', which names 'peak-search' under a peak budget; ")
    assert simulate_plan(problem, plan.saved).peak <= budget
    same = catalog.solve_peak(problem, "peak-search", budget, options=options)
    assert same.saved == plan.saved and not same.message.startswith("asked for")
    plan = catalog.solve_peak(problem, "milp", budget, options=options)
    assert plan.solver.startswith("peak-search (found by ")
    plan = catalog.solve_peak(problem, "mincut", top)
    assert plan.solver.startswith("default (found by ") and "asked for as 'mincut'" in plan.message
    assert catalog.solve_peak(problem, None, top).saved == plan.saved


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
    top = simulate_plan(problem, catalog.solve(problem, "save-all").saved).peak
    middle = (peak_lower_bound(problem) + top) // 2
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "opt_remat.cli", "solve", str(path), "--solver", "cpsat",
                           "--budget", f"{{peak: {middle}}}", "-o", str(tmp_path / "p.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"solving budget peak {middle} with cpsat: ")]
    assert len(lines) >= 2, proc.stdout  # piped: no bar, a line per change
    assert all("phase " in ln and "best " in ln and "bound " in ln for ln in lines), lines
    assert "\r" not in proc.stdout and "peak-search (found by " in proc.stdout


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
    assert any("plan by peak-search (found by " in ln for ln in lines), err
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
    assert "\ndefault: what runs when no solver is named" in "\n" + out
    assert "budgets: none, saved bytes; peak: runs peak-search" in out
    assert "- gap=0.01: stop once the plan is within this relative gap of the bound; budgets: peak" in out
    assert "- lam=None:" in out and "budgets: none\n" in out


def test_searches_report_their_start_and_end():
    # the MILP engines (HiGHS, CBC) report nothing while they run: their start and end are reported
    from solvers import progress

    problem = random_problem(4, n_forward=12, n_backward=8, ban_prob=0.0)
    budget = catalog.solve(problem, "save-all").saved_bytes // 2
    heard: list[Progress] = []
    with progress.reporting(heard.append):
        plan = catalog.solve(problem, "milp", budget, MilpOptions(backend="highs", time_limit_s=10))
        catalog.solve(problem, "greedy", budget)  # a baseline reports nothing
    assert heard[0].phase == "milp: started" and heard[0].incumbent is None
    assert heard[-1].phase == "milp: done" and heard[-1].incumbent == plan.recompute_cost
    assert heard[-1].bound == plan.bound
