"""The interactive HTML report (report.html): its data against the simulator and the results, the
``report`` command, and the page in a real browser (headless chromium through playwright; skipped
without them, unless OPT_REMAT_REQUIRE_BROWSER is set, as CI sets it)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from opt_remat.cli import main
from opt_remat.formats.plan_file import read_plan_file
from opt_remat.runs import load_config, materialize
from opt_remat.runs.html_data import TOP_LIVE, load_run
from opt_remat.runs.html_page import page_data
from solvers.liveness import simulate_plan
from support.counting import count_simulations

ROOT = Path(__file__).resolve().parent.parent
TINY = """\
model:
  factory: opt_remat.models:mlp
  kwargs: {d_in: 16, hidden: 32, layers: 2}
  inputs: [{shape: [4, 16], dtype: float32}]
device: h100
budgets: [0.5, 0.2, {peak: 1MiB}]
solvers: [mincut, save-all, greedy]
verify: {gradients: true, measure_memory: true}
output: {dir: out, formats: [json, html]}
"""
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.usefixtures("reset_dynamo")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("html")
    (folder / "tiny.yaml").write_text(TINY)
    assert main(["run", str(folder / "tiny.yaml")]) == 0
    out = folder / "out"
    return out, materialize(load_config(folder / "tiny.yaml")).problem


def embedded_data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert m, "the page embeds its data"
    return json.loads(m.group(1))


def test_page_is_self_contained(tiny_run):
    out, _ = tiny_run
    html = (out / "report.html").read_text()
    assert "Plotly" in html and len(html) > 1_000_000  # plotly.js itself is in the page
    # no element loads anything from elsewhere (scripts are inline: their texts are left out here;
    # the browser test refuses every request besides the page itself)
    markup = re.sub(r"<script([^>]*)>.*?</script>", r"<script\1></script>", html, flags=re.S)
    assert markup.count("<script") == 3 and " src=" not in markup
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', markup)
    data = embedded_data(html)
    ids = [f["id"] for f in data["figures"]]
    kinds = [i for i in ids if i.startswith("fig-kinds-")]  # memory by kind: one per distinct plan
    assert [i for i in ids if i not in kinds] == ["fig-pareto", "fig-memory-0", "fig-memory-1", "fig-memory-2",
                                                   "fig-solve"]
    assert len(kinds) == len(data["curves"])
    for fid in ids:
        assert f'id="{fid}"' in html


def test_curves_agree_with_the_simulator_and_the_results(tiny_run):
    out, problem = tiny_run
    report = load_run(out, problem)
    planned = [r for r in report.records if r.saved_bytes is not None]
    # save-all has no plan under fractional budgets, greedy and save-all none under a peak budget
    assert len(report.plans) == len(planned) == 5
    for view in report.plans:
        rec, curve = view.record, report.curves[view.curve]
        graph = read_plan_file(out / rec.plan_file)["graphs"][0]
        sim = simulate_plan(problem, graph["saved"])
        assert curve.live_bytes == [b for _, _, b in sim.steps]
        assert curve.peak == rec.peak_bytes == max(curve.live_bytes)  # results.json's figure
        names = [report.values[i][0] for i in curve.values]
        assert names == [n for _, n, _ in sim.steps]
        # the steps marked as recomputation are the plan's recomputed values
        assert {n for n, k in zip(names, curve.phases) if k == "r"} == set(graph["recomputed"])
        assert curve.forward_steps == sum(1 for p, _, _ in sim.steps if p == "forward")
        for i, top in enumerate(curve.top):
            sizes = [report.values[v][4] for v, _ in top]
            assert sizes == sorted(sizes, reverse=True) and len(top) == min(TOP_LIVE, curve.live_count[i])
            assert sum(sizes) <= curve.live_bytes[i]
            if curve.live_count[i] <= TOP_LIVE:  # every live buffer is named: they add up
                assert sum(sizes) == curve.live_bytes[i]
        # at the peak, what the hover names is what the simulator found live there
        at = curve.live_bytes.index(curve.peak)
        assert curve.live_count[at] == len(sim.peak_live)
        assert {report.values[v][0] for v, _ in curve.top[at]} <= set(sim.peak_live)
        saved_storages = {problem.by_name[v].storage_id for v in graph["saved"]}
        for (v, tag) in (e for top in curve.top for e in top):
            if tag == "s":
                assert problem.by_name[report.values[v][0]].storage_id in saved_storages


def test_breakdowns_add_up_to_the_plans(tiny_run):
    out, problem = tiny_run
    report = load_run(out, problem)
    for view in report.plans:
        rec = view.record
        for rows in (view.by_op, view.by_module):
            assert sum(r["saved_bytes"] for r in rows) == rec.saved_bytes
            assert sum(r["saved"] for r in rows) == rec.n_saved
            assert sum(r["recomputed"] for r in rows) == rec.n_recomputed
            assert math.isclose(sum(r["recompute_cost"] for r in rows), rec.recompute_cost, rel_tol=1e-9, abs_tol=1e-15)
        graph = read_plan_file(out / rec.plan_file)["graphs"][0]
        nodes = [problem.by_name[n] for n in graph["saved"] + graph["recomputed"]]
        assert {r["group"] for r in view.by_op} == {  # aten.mm.default: mm
            "graph input" if n.role.value == "input" else n.op.split(".")[1] for n in nodes}


def test_figures_have_a_trace_per_solver_and_plan(tiny_run):
    out, problem = tiny_run
    report = load_run(out, problem)
    figs = {f["id"]: f for f in page_data(report)["figures"]}
    solvers_with_plans = {v.record.solver for v in report.plans}
    names = [t["name"] for t in figs["fig-pareto"]["data"]]
    assert names[0] == "min-cut hull" and sorted(names[1:]) == sorted(solvers_with_plans)
    for i, budget in enumerate(["0.5", "0.2", "peak 1MiB"]):
        views = [v for v in report.plans if v.record.budget == budget]
        traces = figs[f"fig-memory-{i}"]["data"]
        assert len(traces) == len({v.curve for v in views})  # plans that save the same values: one line
        assert sorted(s for t in traces for s in t["name"].split(" (peak")[0].split(" = ")) == sorted(
            v.record.solver for v in views)
    peak = figs["fig-memory-2"]  # the peak budget, drawn as a line across
    assert [v.record.solver for v in report.plans if v.record.budget == "peak 1MiB"] == ["mincut"]
    unit = re.search(r"\((\w+)\)", peak["layout"]["yaxis"]["title"]["text"]).group(1)
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20}[unit]
    assert [s["y0"] * scale for s in peak["layout"]["shapes"] if s["xref"] == "paper"] == [2**20]
    assert sorted(t["name"] for t in figs["fig-solve"]["data"]) == ["greedy", "mincut", "save-all"]


def test_report_command_rewrites_the_same_page(tiny_run, capsys, monkeypatch, tmp_path):
    out, _ = tiny_run
    before = (out / "report.html").read_bytes()
    (out / "report.html").unlink()
    simulated = count_simulations(monkeypatch)
    assert main(["report", str(out)]) == 0
    assert str(out / "report.html") in capsys.readouterr().out
    assert (out / "report.html").read_bytes() == before
    assert not simulated  # the curves come from results.json
    # results of format 2 hold no curves: the report simulates each plan, and draws the same page
    old = tmp_path / "old"
    shutil.copytree(out, old)
    doc = json.loads((old / "results.json").read_text())
    doc["format"] = 2
    for rec in doc["results"]:
        rec.pop("curve", None)
    (old / "results.json").write_text(json.dumps(doc))
    assert main(["report", str(old)]) == 0
    assert (old / "report.html").read_bytes() == before.replace(str(out).encode(), str(old).encode())
    plans = {frozenset(read_plan_file(old / r["plan_file"])["graphs"][0]["saved"]) for r in doc["results"]
             if r.get("plan_file")}
    assert set(simulated) == plans and set(simulated.values()) == {1}  # each distinct plan once


def test_report_command_refuses_what_it_cannot_report(tiny_run, tmp_path, capsys):
    out, _ = tiny_run
    assert main(["report", str(tmp_path)]) == 2
    assert "no results.json there" in capsys.readouterr().err
    other = tmp_path / "moved"
    shutil.copytree(out, other)
    doc = json.loads((other / "results.json").read_text())
    doc["fingerprint"]["graph_hash"] = "0" * 24  # as if the model changed since the run
    (other / "results.json").write_text(json.dumps(doc))
    assert main(["report", str(other)]) == 2
    assert "is not the one the run" in capsys.readouterr().err


def test_no_page_unless_asked(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY.replace("[json, html]", "[json]").replace(
        "solvers: [mincut, save-all, greedy]", "solvers: [greedy]").replace("gradients: true", "gradients: false"))
    assert main(["run", str(tmp_path / "tiny.yaml")]) == 0
    assert (tmp_path / "out" / "results.json").exists() and not (tmp_path / "out" / "report.html").exists()


# ---- in a browser ------------------------------------------------------------------------------
def _chromium() -> str | None:
    return os.environ.get("OPT_REMAT_CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture(scope="module")
def browser():
    required = bool(os.environ.get("OPT_REMAT_REQUIRE_BROWSER"))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            pytest.fail("playwright is not installed (pip install -e '.[browser]')")
        pytest.skip("playwright is not installed (pip install -e '.[browser]')")
    exe = _chromium()
    if exe is None:
        if required:
            pytest.fail("no chromium found (apt-get install chromium, or set OPT_REMAT_CHROMIUM)")
        pytest.skip("no chromium found (apt-get install chromium, or set OPT_REMAT_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=BROWSER_ARGS)
        yield b
        b.close()


def check_page(browser, path: Path) -> None:
    """Open the page offline; no console error; every trace drawn; hovers name the op and plan."""
    data = embedded_data(path.read_text())
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    fetched: list[str] = []

    def offline(route):  # anything but the file itself is refused: the page must not need it
        if route.request.url != path.as_uri():
            fetched.append(route.request.url)
            return route.abort()
        return route.continue_()

    page.route("**/*", offline)
    page.goto(path.as_uri())
    # drawn, or stopped by an error (the page's own handler writes it into #errors)
    page.wait_for_function("document.body.dataset.drawn || document.getElementById('errors').textContent",
                           timeout=30_000)
    assert not problems and not fetched, (problems, fetched)
    assert page.inner_text("#errors") == "" and page.get_attribute("body", "data-drawn") == "true"
    for fig in data["figures"]:
        drawn = page.evaluate("""id => { const gd = document.getElementById(id);
            return [gd.data.length, Array.from(gd.querySelectorAll('.scatterlayer .trace, .barlayer .trace'))
              .map(t => t.querySelectorAll('path.js-line[d]:not([d=""]), .point').length)]; }""", fig["id"])
        assert drawn[0] == len(fig["data"]) == len(drawn[1]) > 0, (fig["id"], drawn)
        assert all(n > 0 for n in drawn[1]), f"{fig['id']}: a trace with nothing drawn: {drawn[1]}"
        for t, trace in enumerate(fig["data"]):
            if "curve" in (trace.get("meta") or {}):  # a live-memory line: hover its peak
                curve = data["curves"][trace["meta"]["curve"]]
                step = curve["live_bytes"].index(curve["peak"])
                op = data["values"][curve["values"][step]][1]
                expect = [f"step {step}", f"op {op}", "the peak"]
            elif fig["id"] == "fig-pareto" and t > 0:
                step, expect = 0, [trace["name"].removesuffix(" (MIP)")]
            else:
                continue
            # the trace alone (the others hidden, as a click on the legend does): traces that
            # share a point would otherwise answer for it
            text = page.evaluate("""async ([id, c, p]) => { const gd = document.getElementById(id);
                const others = gd.data.map((_, i) => i).filter(i => i !== c);
                if (others.length) await Plotly.restyle(gd, {visible: 'legendonly'}, others);
                Plotly.Fx.hover(gd, [{curveNumber: c, pointNumber: p}]);
                const text = gd.querySelector('.hoverlayer').textContent;
                Plotly.Fx.unhover(gd);
                if (others.length) await Plotly.restyle(gd, {visible: true}, others);
                return text; }""", [fig["id"], t, step])
            for word in expect:
                assert word in text, (fig["id"], trace["name"], word, text)
    # the plan chooser shows one plan's breakdown at a time
    page.select_option("#plan-choice", "1")
    assert page.evaluate("Array.from(document.querySelectorAll('.breakdown')).filter(d => !d.hidden)"
                         ".map(d => d.dataset.plan)") == ["1"]
    assert not problems, problems
    page.close()


def test_page_in_a_browser(tiny_run, browser):
    check_page(browser, tiny_run[0] / "report.html")


@pytest.mark.slow
def test_mlp_config_report_in_a_browser(tmp_path, browser):
    """The README's quickest run, as a user runs it: its report opens offline and draws everything."""
    assert main(["run", str(ROOT / "configs" / "mlp.yaml"), "--set", f"output.dir={tmp_path}"]) == 0
    check_page(browser, tmp_path / "report.html")


def test_plans_that_save_the_same_but_offload_differently_keep_their_own_curves(tmp_path):
    """The report shares one curve between plans that save the same values only when they also
    offload the same: an offloaded plan's curve (values away, bytes in flight) is its own."""
    import dataclasses

    from support.random_problems import random_problem

    from opt_remat.runs.curves import step_curve
    from opt_remat.runs.html_data import report_data
    from opt_remat.runs.offload_view import offload_figures, with_transfers
    from opt_remat.runs.results import Record, ResultsFile
    from opt_remat.runs.run_data import LoadedRun, PlanValues
    from solvers.baselines import save_all
    from solvers.offload import HostLink, offload_candidates

    problem = random_problem(3)
    plan = save_all(problem)
    link = HostLink(1e3, 1e3, min_bytes=1)
    away = next(v for v in offload_candidates(problem, link) if v in plan.saved)
    offloaded = dataclasses.replace(plan, offloaded=frozenset({away}))
    plain = step_curve(problem, plan.saved)
    moved = with_transfers(plain, offload_figures(problem, offloaded, link, plain)[1])
    assert moved.live["total"] != plain.live["total"]  # the offload shows on this problem
    records = [Record("b", s, saved_bytes=plan.saved_bytes, curve=c) for s, c in (("a", plain), ("o", moved))]
    plans = {("b", "a"): PlanValues.of(plan), ("b", "o"): PlanValues.of(offloaded)}
    report = report_data(LoadedRun(tmp_path, ResultsFile("r", 3, {}, records), plans), problem)
    assert [report.curves[v.curve].live for v in report.plans] == [plain.live, moved.live]
