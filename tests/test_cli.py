"""The opt-remat CLI end to end on a tiny MLP: run (reports, resume, parallel), solve, show,
compare, plans applied in training, graph-file configs."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

import opt_remat
from opt_remat.cli import main
from opt_remat.errors import PlanMismatchError
from opt_remat.models import mlp
from opt_remat.verify import compare_steps, save_all_backend, training_step

TINY = """\
model:
  factory: opt_remat.models:mlp
  kwargs: {{d_in: 16, hidden: 32, layers: 2}}
  inputs: [{{shape: [4, 16], dtype: float32}}]
device: h100
budgets: [0.5, 0.2]
solvers: [mincut, save-all, greedy]
verify: {{gradients: true, measure_memory: true}}
output: {{dir: {out}, formats: [table, json, csv, plot]}}
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HAS_RAY = importlib.util.find_spec("ray") is not None


pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


def tiny_config(folder: Path, out: str = "out") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.yaml"
    path.write_text(TINY.format(out=out))
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One run of the tiny config, shared by the tests that read its outputs."""
    folder = tmp_path_factory.mktemp("tiny")
    path = tiny_config(folder)
    rc = main(["run", str(path)])
    assert rc == 0
    return path, folder / "out"


def results(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["results"]


def test_run_writes_every_report(tiny_run):
    _, out = tiny_run
    recs = results(out)
    assert [(r["budget"], r["solver"]) for r in recs] == [
        ("0.5", "mincut"), ("0.5", "save-all"), ("0.5", "greedy"),
        ("0.2", "mincut"), ("0.2", "save-all"), ("0.2", "greedy")]
    for r in recs:
        if r["solver"] == "save-all":  # it cannot meet a fractional budget below 1: reported, not fatal
            assert r["status"] == "infeasible" and "infeasible" in r["error"]
            continue
        assert r["saved_bytes"] <= r["budget_bytes"]
        assert r["measured_saved_bytes"] == r["saved_bytes"]  # what the forward really hands over
        assert r["verified"] is True and r["bitwise"] is True  # gradients equal save-all's
        plan = json.loads((out / r["plan_file"]).read_text())["graphs"][0]
        assert plan["saved_bytes"] == r["saved_bytes"] and plan["nodes"]
    # the CSV has every figure, one row per pair
    lines = (out / "results.csv").read_text().splitlines()
    assert len(lines) == 1 + len(recs)
    assert lines[0].startswith("budget,budget_bytes,solver,") and "measured_saved_bytes" in lines[0]
    table = (out / "summary.txt").read_text()
    assert "mincut" in table and "greedy" in table and "verified" in table
    # the Pareto plot is a real PNG that matplotlib reads back
    png = out / "pareto.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.image
    img = matplotlib.image.imread(png)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    doc = json.loads((out / "results.json").read_text())
    assert doc["mincut_hull"] and doc["fingerprint"]["graph_hash"]
    # every plan's simulated step peak, and the live-memory curves as a second plot
    from opt_remat.runs.results import Record
    from opt_remat.runs.summary import memory_curves
    from solvers.liveness import simulate_plan
    planned = [r for r in recs if r.get("saved_bytes") is not None]
    assert all(r["peak_bytes"] > 0 for r in planned) and "step peak" in table
    curves = memory_curves([Record.from_json(r) for r in recs])  # as results.json keeps them
    assert set(curves) == {"0.5", "0.2"}
    problem = _problem_of(out)
    for r in planned:  # the plot's curves agree with the results and with a fresh simulation of the plan file
        curve = curves[r["budget"]][r["solver"]]
        sim = simulate_plan(problem, json.loads((out / r["plan_file"]).read_text())["graphs"][0]["saved"])
        assert curve.live_bytes == [b for _, _, b in sim.steps] and max(curve.live_bytes) == r["peak_bytes"]
        assert curve.peak_gradients == sim.peak_gradients == r["peak_gradient_bytes"] > 0
    img = matplotlib.image.imread(out / "memory.png")
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert not list(out.glob(".*.tmp")), "no temporary files left behind"


def test_memory_plot_legends_stay_in_their_panel_with_units():
    """Seven solvers in five panels: each legend lies under its own panel, overlaps no other panel
    or legend, and every number in it carries its unit."""
    import re

    import matplotlib
    matplotlib.use("Agg", force=True)
    from opt_remat.runs.plots import memory_figure

    solvers = ["mincut", "cpsat", "milp", "greedy", "dp", "save-all", "torch"]
    from opt_remat.runs.curves import Curve

    def curve(live: list[int]) -> Curve:
        return Curve(values=list(range(len(live))), live={"total": live}, phases="ffbb", live_count=[1] * len(live),
                     top=[[] for _ in live], peak_gradients=536_000)

    curves = {b: {s: curve([0, 300_000 + 1000 * i, 700_000 + 20_000 * i, 590_000]) for i, s in enumerate(solvers)}
              for b in ("1.0", "0.8", "0.5", "0.3", "0.1")}
    fig = memory_figure(curves)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert len(axes) == 5
    boxes = [(ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)) for ax in axes]
    for i, (ax_box, leg_box) in enumerate(boxes):
        assert leg_box.y1 <= ax_box.y0 and ax_box.x0 - 60 <= leg_box.x0 and leg_box.x1 <= ax_box.x1 + 60
        for j, (other_ax, other_leg) in enumerate(boxes):
            if i != j:
                assert not leg_box.overlaps(other_ax) and not leg_box.overlaps(other_leg), (i, j)
    texts = [t.get_text() for ax in axes for t in ax.get_legend().get_texts()]
    assert texts[0] == "mincut: peak 683.59 KiB, of it grads 523.44 KiB"
    for text in texts:  # a number is followed by its unit
        assert all(re.match(r"\s(B|KiB|MiB|GiB)\b", text[m.end():]) for m in re.finditer(r"\d+\.\d+", text)), text
    # a solver has one colour in every panel
    colors = {line.get_label(): line.get_color() for ax in axes for line in ax.get_lines()
              if line.get_label()[0] != "_"}
    assert len({colors[k] for k in colors if k.startswith("mincut")}) == 1


def _problem_of(out: Path):
    from opt_remat.runs import load_config, materialize
    return materialize(load_config(out.parent / "tiny.yaml")).problem


def test_run_resumes_skipping_done_pairs(tiny_run, capsys):
    path, out = tiny_run
    before = results(out)
    assert main(["run", str(path)]) == 0
    text = capsys.readouterr().out
    assert "resuming: 6 of 6 pairs" in text and "0 pairs to solve" in text
    assert results(out) == before
    # an interrupted run: drop one pair from the results; only that one is solved again
    doc = json.loads((out / "results.json").read_text())
    doc["results"] = [r for r in doc["results"] if not (r["budget"] == "0.2" and r["solver"] == "greedy")]
    (out / "results.json").write_text(json.dumps(doc))
    assert main(["run", str(path)]) == 0
    text = capsys.readouterr().out
    assert "resuming: 5 of 6 pairs" in text and "1 pairs to solve" in text
    assert "[1/1] budget 0.2" in text and "greedy" in text
    def key(rs):
        return [(r["budget"], r["solver"], r["status"], r.get("saved_bytes"), r.get("verified")) for r in rs]
    assert key(results(out)) == key(before)


def test_parallel_jobs_match_sequential(tiny_run, tmp_path, capsys):
    path, out = tiny_run
    other = tmp_path / "jobs"
    assert main(["run", str(path), "--jobs", "2", "--set", f"output.dir={other}",
                 "--set", "verify.gradients=false"]) == 0
    assert "with 2 process workers" in capsys.readouterr().out
    def key(rs):
        return [(r["budget"], r["solver"], r["status"], r.get("saved_bytes"), r.get("recompute_cost")) for r in rs]
    assert key(results(other)) == key(results(out))


@pytest.mark.skipif(HAS_RAY, reason="ray is installed: the missing-ray message cannot be tested")
def test_ray_executor_without_ray(tiny_run, capsys, tmp_path):
    path, _ = tiny_run
    assert main(["run", str(path), "--executor", "ray", "--set", f"output.dir={tmp_path / 'ray'}"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'opt-remat[ray]'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ray").exists()


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")
def test_ray_executor(tiny_run, tmp_path):
    path, out = tiny_run
    other = tmp_path / "ray"
    assert main(["run", str(path), "--executor", "ray", "--jobs", "2", "--set", f"output.dir={other}",
                 "--set", "verify.gradients=false"]) == 0
    assert [r.get("saved_bytes") for r in results(other)] == [r.get("saved_bytes") for r in results(out)]


def test_results_of_another_graph_are_not_mixed(tiny_run, capsys):
    path, out = tiny_run
    rc = main(["run", str(path), "--set", "model.kwargs.hidden=48", "--set", "model.kwargs.d_in=16"])
    err = capsys.readouterr().err
    assert rc == 2 and "output.dir" in err and "another graph" in err


def test_compare_two_runs(tiny_run, tmp_path, capsys):
    path, out = tiny_run
    other = tmp_path / "b"
    assert main(["run", str(path), "--set", f"output.dir={other}", "--set", "budgets=[0.5]",
                 "--set", "verify.gradients=false", "--set", "output.formats=[json]"]) == 0
    assert not (other / "pareto.png").exists() and not (other / "results.csv").exists()
    capsys.readouterr()
    assert main(["compare", str(out), str(other), "--width", "400"]) == 0
    text = capsys.readouterr().out
    assert "saved A" in text and "saved B" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("0.5 ") or ln.startswith("0.2 ")]
    assert len(rows) == 6 and sum("(none)" in r for r in rows) == 3  # 0.2 is only in A
    wide = max(len(ln) for ln in text.splitlines()[3:])
    # narrower: the same rows in blocks of columns, each repeating budget and solver
    assert main(["compare", str(out), str(other), "--width", "80"]) == 0
    narrow = capsys.readouterr().out.splitlines()[3:]
    assert wide > 80 and max(len(ln) for ln in narrow) <= 80
    rows = [ln for ln in narrow if ln.startswith("0.5 ") or ln.startswith("0.2 ")]
    assert len(rows) % 6 == 0 and len(rows) > 6
    assert {ln.split()[1] for ln in rows} == {ln.split()[1] for ln in text.splitlines() if ln.startswith("0.5 ")}
    assert main(["compare", str(out), str(tmp_path / "missing")]) == 2


def test_solve_show_and_apply_plan_in_training(tiny_run, tmp_path, capsys):
    path, _ = tiny_run
    plan_path = tmp_path / "plan.json"
    assert main(["solve", str(path), "--solver", "mincut", "--budget", "0.5", "-o", str(plan_path)]) == 0
    assert "apply it in training with" in capsys.readouterr().out
    doc = json.loads(plan_path.read_text())
    plan = doc["graphs"][0]
    assert plan["solver"] == "mincut" and plan["graph_id"] and plan["recomputed"]
    assert doc["made_for"]["capture"] == {"compiler": "eager", "decompositions": "inductor", "meta": False}
    assert all("op" in plan["nodes"][n] and "module" in plan["nodes"][n] for n in plan["saved"])

    assert main(["show", str(plan_path)]) == 0
    text = capsys.readouterr().out
    assert "saved by op:" in text and "recomputed by op:" in text and "addmm" in text
    assert "opt_remat.models:mlp(d_in=16, hidden=32, layers=2)" in text and "float32[4, 16]" in text
    assert "compiler=eager, decompositions=inductor" in text and f"torch {torch.__version__}" in text

    # the plan applied to the same model gives save-all's gradients ...
    torch.manual_seed(0)
    model, x = mlp(d_in=16, hidden=32, layers=2), torch.randn(4, 16)
    be = opt_remat.backend(plan=str(plan_path), compiler="eager", decompositions="inductor")
    check = compare_steps(training_step(model, (x,), be), training_step(model, (x,), save_all_backend("inductor")))
    assert check.ok and check.bitwise
    applied = be.partitioner.history[-1].plan
    assert applied.saved == frozenset(plan["saved"]) and applied.solver == "plan:mincut"

    # ... and is refused, with a clear message, for another model
    torch._dynamo.reset()
    other = mlp(d_in=16, hidden=48, layers=2)
    be = opt_remat.backend(plan=str(plan_path), compiler="eager", decompositions="inductor")
    with pytest.raises(Exception) as info:
        training_step(other, (x,), be)
    exc, chain = info.value, []
    while exc is not None:
        chain.append(exc)
        exc = getattr(exc, "inner_exception", None) or exc.__cause__
    mismatch = [e for e in chain if isinstance(e, PlanMismatchError)]
    assert mismatch, chain
    assert "made for a different graph" in str(mismatch[0]) and "solve again" in str(mismatch[0])


def test_solve_budgets_as_yaml_reads_them(tiny_run, tmp_path, capsys):
    path, _ = tiny_run
    # a float above 1 is refused with the config's own message, not read as 2 bytes
    assert main(["solve", str(path), "--solver", "mincut", "--budget", "2.0", "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("budgets: [0.5, 0.2]", "budgets: [2.0]"))
    assert main(["run", str(bad)]) == 2
    yaml_err = capsys.readouterr().err.strip()
    detail = yaml_err.split("budgets[0]: ", 1)[1]
    assert err.endswith("--budget 2.0: " + detail) and "fraction in [0, 1]" in detail
    assert not (tmp_path / "p.json").exists() and len(err.splitlines()) == 1
    # a peak budget, as YAML writes it (the config's first solver by default)
    out = tmp_path / "peak.json"
    assert main(["solve", str(path), "--budget", "{peak: 64KiB}", "-o", str(out)]) == 0
    entry = json.loads(out.read_text())["graphs"][0]
    assert entry["solver"].startswith("default") and entry["peak_budget"] == 65536
    assert entry["peak_bytes"] <= 65536
    # no --budget: every budget of the config, a plan file each
    out = tmp_path / "all.json"
    assert main(["solve", str(path), "--solver", "mincut", "-o", str(out)]) == 0
    files = {p.name: json.loads(p.read_text())["graphs"][0] for p in tmp_path.glob("all-*.json")}
    assert set(files) == {"all-0.5.json", "all-0.2.json"}
    assert files["all-0.2.json"]["saved_bytes"] <= files["all-0.5.json"]["saved_bytes"]
    assert files["all-0.5.json"]["budget_spec"] == 0.5


def test_solve_errors(tiny_run, tmp_path, capsys):
    path, _ = tiny_run
    out = tmp_path / "p.json"
    assert main(["solve", str(path), "--solver", "save-all", "--budget", "0.2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "infeasible" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["show", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_graph_file_config(tmp_path, monkeypatch, capsys):
    """model: {graph: PATH} loads a published graph through opt_remat.formats.checkmate_graph: no capture,
    no verification."""
    from support.random_problems import random_problem

    fake = types.ModuleType("opt_remat.formats.checkmate_graph")
    fake.load_graph = lambda p: random_problem(3, n_forward=10, n_backward=8, ban_prob=0.0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "opt_remat.formats.checkmate_graph", fake)
    import opt_remat.formats
    monkeypatch.setattr(opt_remat.formats, "checkmate_graph", fake, raising=False)
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "g.json").write_text("{}")
    cfg = tmp_path / "conf" / "g.yaml"
    cfg.parent.mkdir()
    cfg.write_text("model: {graph: ../graphs/g.json}\nbudgets: [1.0, 0.5]\nsolvers: [mincut, greedy, torch]\n"
                   "output: {dir: out, formats: [json, plot]}\n")
    assert main(["run", str(cfg)]) == 0
    recs = results(tmp_path / "conf" / "out")
    assert {r["solver"] for r in recs} == {"mincut", "greedy", "torch"}
    for r in recs:
        if r["solver"] == "torch":
            assert r["status"] == "skipped"  # no torch graph to run torch's partitioner on
        else:
            assert r.get("verified") is None and r.get("measured_saved_bytes") is None
            assert r["saved_bytes"] <= r["budget_bytes"]
    assert (tmp_path / "conf" / "out" / "pareto.png").read_bytes()[:8] == PNG_SIGNATURE
    cfg.write_text("model: {graph: ../graphs/missing.json}\nbudgets: [0.5]\nsolvers: [mincut]\n")
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "g.yaml:1: model.graph: graph file" in err and "not found" in err


def test_demo_still_works(capsys):
    assert main(["demo", "--model", "mlp", "--layers", "1", "--solvers", "mincut", "--budget", "0.5"]) == 0
    assert "grads vs save-all" in capsys.readouterr().out


def test_demo_budget_read_as_solve_and_yaml_read_it(tiny_run, tmp_path, capsys):
    from opt_remat.cli import cli_budget
    path, _ = tiny_run
    assert main(["solve", str(path), "--budget", "2.0", "-o", str(tmp_path / "p.json")]) == 2
    solve_detail = capsys.readouterr().err.strip().split("--budget 2.0: ", 1)[1]
    for text in ("2.0", "1.5"):  # not 2 or 1 bytes: a float above 1 is no fraction
        assert main(["demo", "--model", "mlp", "--budget", text]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.endswith(solve_detail.replace("2.0", text)) and "fraction in [0, 1]" in err
    assert main(["demo", "--budget", "lots"]) == 2
    assert "cannot parse budget 'lots'" in capsys.readouterr().err
    assert [cli_budget(t) for t in ("0.5", "1", "1500000", "2MiB", "1e9", "null")] == [
        0.5, 1, 1500000, "2MiB", "1e9", None]


def test_help_is_plain_text_and_complete(capsys):
    """Every command's --help: no reST markup, every argument explained, the solvers named, and
    run's saying where results go and how a rerun resumes."""
    from opt_remat.cli import build_parser
    from opt_remat.options import known_solvers

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) >= {"run", "solve", "show", "compare", "demo"}
    texts = {}
    for name in [None, *commands]:
        assert main(["--help"] if name is None else [name, "--help"]) == 0
        texts[name] = capsys.readouterr().out
        assert "``" not in texts[name] and ":func:" not in texts[name], name
    for name, sub in commands.items():
        for action in sub._actions:
            assert action.help, f"{name} {action.dest} has no help"
    for name in ("solve", "demo"):
        flat = " ".join(texts[name].split())
        assert all(s in flat for s in known_solvers()), name
    run_help = " ".join(texts["run"].split())
    assert "resume" in run_help and "results.json" in run_help and "plans/" in run_help


def test_shipped_checkmate_config_runs_from_anywhere(tmp_path, monkeypatch):
    """configs/checkmate-resnet50.yaml reads the graph shipped in configs/data/checkmate/ (a path
    relative to the config, whatever the working folder): it runs in a fresh clone."""
    config = Path(__file__).resolve().parents[1] / "configs" / "checkmate-resnet50.yaml"
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(config), "--set", f"output.dir={tmp_path / 'out'}", "--set", "budgets=[0.8, 0.3]",
                 "--set", "solvers=[mincut, greedy]", "--set", "output.formats=[json]"]) == 0
    recs = results(tmp_path / "out")
    assert len(recs) == 4 and all(r["saved_bytes"] <= r["budget_bytes"] for r in recs)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["config"]["model"]["graph"].endswith("configs/data/checkmate/ResNet50_256_train_nx.json")


@pytest.mark.slow  # a meta capture of a bigger model: run by .ci/run
def test_meta_capture_run_plans_without_weights(tmp_path, capsys):
    # the same model captured for real and with fake tensors: the problems match, so do the plans
    def config(meta: bool, out: str) -> Path:
        text = (TINY.replace("opt_remat.models:mlp", "opt_remat.models:llama")
                .replace("{{d_in: 16, hidden: 32, layers: 2}}",
                         "{{layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}}")
                .replace("{{shape: [4, 16], dtype: float32}}", "{{shape: [2, 16], dtype: int64, high: 64}}")
                .replace("[mincut, save-all, greedy]", "[mincut, {{name: milp, backend: highs}}, torch]")
                .replace("gradients: true", f"gradients: {str(not meta).lower()}"))
        if meta:
            text += "capture: {{meta: true}}\n"
        path = tmp_path / f"{out}.yaml"
        path.write_text(text.format(out=out))
        return path

    assert main(["run", str(config(True, "fake"))]) == 0
    assert main(["run", str(config(False, "real"))]) == 0
    fake, real = results(tmp_path / "fake"), results(tmp_path / "real")
    assert len(fake) == len(real) == 6
    for f, r in zip(fake, real):
        assert (f["solver"], f["budget"]) == (r["solver"], r["budget"])
        assert f["saved_bytes"] == f["measured_saved_bytes"]
        if f["solver"] != "torch":  # torch's choices may follow the graph's input order
            assert f["saved_bytes"] == r["saved_bytes"]
            assert f["recompute_cost"] == pytest.approx(r["recompute_cost"], rel=1e-9)
        assert f.get("verified") is None and r["verified"] is True

    bad = config(True, "bad").read_text().replace("gradients: false", "gradients: true")
    (tmp_path / "bad.yaml").write_text(bad)
    assert main(["run", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "verify.gradients" in err and "capture.meta: false" in err


def test_peak_budgets_in_a_run(tmp_path, capsys):
    # a peak budget between the floor and the least-recompute plan's peak (the peak-aware solvers
    # meet it, the others are skipped), and one below the floor (a clear infeasible record)
    from opt_remat.runs import load_config, materialize
    from solvers.liveness import peak_lower_bound, simulate_plan
    from solvers.catalog import solve

    text = (TINY.replace("opt_remat.models:mlp", "opt_remat.models:llama")
            .replace("{{d_in: 16, hidden: 32, layers: 2}}", "{{layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}}")
            .replace("{{shape: [4, 16], dtype: float32}}", "{{shape: [2, 16], dtype: int64, high: 64}}")
            .replace("[mincut, save-all, greedy]", "[mincut, {{name: cpsat, time_limit_s: 2}}, greedy, torch]"))
    path = tmp_path / "peak.yaml"
    path.write_text(text.format(out="out"))
    problem = materialize(load_config(path)).problem
    floor = peak_lower_bound(problem)
    top = simulate_plan(problem, solve(problem, "save-all", None).saved).peak
    middle = (floor + top) // 2
    path.write_text(text.replace("budgets: [0.5, 0.2]", f"budgets: [{{{{peak: {middle}}}}}, "
                                 f"{{{{peak: {floor - 1}, saved: 0.5}}}}, "
                                 f"{{{{peak: {middle}, count_gradients: false}}}}]").format(out="out"))
    assert main(["run", str(path)]) == 0
    recs = {(r["budget"], r["solver"]): r for r in results(tmp_path / "out")}
    r = recs[(f"peak {middle}", "cpsat")]
    assert r["peak_budget"] == middle and r["peak_bytes"] <= middle
    assert r["verified"] is True
    assert 0 < r["peak_gradient_bytes"] <= r["peak_bytes"]  # the split of the step's peak
    # activations alone under the same budget (a YAML peak budget with count_gradients: false)
    bare = recs[(f"peak {middle} (no grads)", "cpsat")]
    assert bare["status"] in ("optimal", "feasible") and bare["extra"]["count_gradients"] is False
    r = recs[(f"peak {middle}", "mincut")]  # a heuristic: it fits, or names a larger peak it found
    assert r.get("peak_bytes", 0) <= middle < r.get("min_peak_bytes", middle + 1)
    for solver in ("mincut", "cpsat"):
        low = recs[(f"peak {floor - 1} + 0.5", solver)]
        assert low["status"] == "infeasible" and low["min_peak_bytes"] >= floor
        assert str(low["min_peak_bytes"]) in low["error"]
    for solver in ("greedy", "torch"):
        assert recs[(f"peak {middle}", solver)]["status"] == "skipped"
    assert "peak " in (tmp_path / "out" / "summary.txt").read_text()

    path.write_text(text.replace("budgets: [0.5, 0.2]", "budgets: [{{peak: 0.5}}]").format(out="out2"))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "budgets[0].peak" in err and "not a fraction" in err


def test_show_piped_into_head_and_help_without_torch(tiny_run, tmp_path):
    import os
    import subprocess
    _, out = tiny_run
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    plan_file = next((out / "plans").glob("*.json"))
    proc = subprocess.Popen([sys.executable, "-m", "opt_remat.cli", "show", "--names", str(plan_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # as `| head` does once it has its lines: every write fails
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err
    assert err == b"", err
    (tmp_path / "bin.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    assert main(["show", str(tmp_path / "bin.json")]) == 2
    check = subprocess.run([sys.executable, "-c", "import sys; from opt_remat.cli import main; "
                            "rc = main(['run', '--help']); assert 'torch' not in sys.modules; sys.exit(rc)"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert check.returncode == 0 and "--executor" in check.stdout, check.stderr
