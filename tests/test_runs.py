"""The runs layer's own pieces: a config key declared once (output.title), results of format 1
read back, and the progress display in its three modes."""

from __future__ import annotations

import io
import json
import os

from opt_remat.runs import load_config, materialize, read_results
from opt_remat.runs.progress import Display, terminal_mode
from solvers import progress
from support.counting import count_simulations

CONFIG = """\
model: {factory: opt_remat.models:mlp, kwargs: {d_in: 8, hidden: 16, layers: 1}, inputs: [{shape: [2, 8]}]}
budgets: [0.5]
solvers: [mincut]
"""


def test_output_title_is_one_declared_key(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(CONFIG)
    cfg = load_config(path)
    assert cfg.title == "t" and cfg.spec.output.title is None  # default: the run's name
    cfg = load_config(path, ["output.title=MLP, one layer"])
    assert cfg.title == "MLP, one layer"


def test_results_of_format_1_are_read(tmp_path):
    old = {"format": 1, "name": "x", "fingerprint": {"graph_hash": "abc"},
           "results": [{"budget": "0.5", "solver": "mincut", "solver_name": "mincut", "options": {},
                        "status": "optimal", "saved_bytes": 1024, "error": None, "verified": None,
                        "verify_note": None, "traceback": "dropped"}]}
    (tmp_path / "results.json").write_text(json.dumps(old))
    res = read_results(tmp_path / "results.json")
    assert res is not None and res.format == 1 and res.fingerprint["graph_hash"] == "abc"
    rec = res.records[0]
    assert rec.key == ("0.5", "mincut") and rec.done and rec.saved_bytes == 1024 and rec.verify_note == ""
    out = rec.to_json()  # format 2: empty fields left out
    assert "error" not in out and "verified" not in out and out["saved_bytes"] == 1024


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_display_modes(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    assert terminal_mode(io.StringIO()) == "lines" and terminal_mode(_Tty()) == "live"
    for mode, stream in (("off", io.StringIO()), ("lines", io.StringIO()), ("live", _Tty())):
        with Display(mode, stream) as d:
            d.message("hello")
            d.start(2)
            d.doing("solving 0.5 cpsat")
            with progress.reporting(d.search):
                progress.report(2e-6, 1e-6)
            d.finished("[1/2] done")
        text = stream.getvalue()
        if mode == "off":
            assert text == ""
        else:
            assert "hello" in text and "[1/2] done" in text
        assert ("pairs |" in text) == (mode == "live")  # the bar: live only


def test_progress_reports_only_to_a_listener_in_its_own_process():
    seen: list = []
    progress.report(1.0, 0.5)  # no listener: nothing happens
    with progress.reporting(seen.append):
        assert progress.listening()
        progress.report(2.0, 1.0)
        if os.fork() == 0:  # a forked worker inherits the listener but must not report
            progress.report(3.0, 1.0)
            os._exit(0 if not progress.listening() else 1)
        _, status = os.wait()
        assert status == 0
    assert not progress.listening()
    assert [(p.incumbent, p.bound, p.gap) for p in seen] == [(2.0, 1.0, 0.5)]


def test_a_run_simulates_each_plan_once_and_reads_results_once(tmp_path, monkeypatch):
    """``opt-remat run configs/mlp.yaml``: the reports (summary, plots, HTML) simulate no plan
    again, results.json is read once (the resume check), and each plan file is written once and
    never read back. The simulator runs for real; calls from the run's side are counted."""
    import pathlib
    from collections import Counter
    from pathlib import Path

    import solvers.liveness as liveness
    from opt_remat.runs import plan_files, run

    root = Path(__file__).resolve().parent.parent
    cfg = load_config(root / "configs" / "mlp.yaml", [f"output.dir={tmp_path / 'out'}"])
    work = materialize(cfg)
    original = liveness.simulate_plan
    simulated = count_simulations(monkeypatch, ("opt_remat.runs", "opt_remat.report"))  # not a solver's search
    reads: list = []
    real_read_text, real_read_bytes = pathlib.Path.read_text, pathlib.Path.read_bytes

    def read_text(self, *args, **kwargs):
        reads.append(self.name)
        return real_read_text(self, *args, **kwargs)

    def read_bytes(self):
        reads.append(self.name)
        return real_read_bytes(self)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    writes: Counter = Counter()
    real_write = plan_files.write_atomic

    def write_atomic(path, data):
        writes[Path(path).name] += 1
        return real_write(path, data)

    monkeypatch.setattr(plan_files, "write_atomic", write_atomic)

    summary = run(cfg, work=work)
    monkeypatch.undo()

    assert reads.count("results.json") == 1
    planned = [r for r in summary.records if r.saved_bytes is not None]
    assert len(planned) >= 20 and (tmp_path / "out" / "report.html").exists()
    assert not [n for n in reads if n.endswith(".json") and n != "results.json"], "a plan file was read back"
    assert writes == Counter(Path(r.plan_file).name for r in planned)  # each once
    saved = {r.key: frozenset(json.loads((tmp_path / "out" / r.plan_file).read_text())["graphs"][0]["saved"])
             for r in planned}
    assert set(simulated) == set(saved.values()) and set(simulated.values()) == {1}  # each distinct plan once
    # the stored curve is the simulator's, in memory and in results.json alike
    stored = {r.key: r for r in read_results(tmp_path / "out" / "results.json").records}
    for rec in planned:
        sim = original(work.problem, saved[rec.key])
        assert rec.curve.live_bytes == [b for _, _, b in sim.steps] and rec.curve.peak == sim.peak == rec.peak_bytes
        assert stored[rec.key].curve == rec.curve
