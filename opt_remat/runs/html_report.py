"""A run's interactive HTML report (``OUT/report.html``): written by ``opt-remat run`` at the end of
a run, and by ``opt-remat report OUT`` for a finished run.

The page needs the run's graph (the hovers name its values; the saved/recomputed breakdown is
counted on it); the curves come with the records. ``run`` has the graph at hand; ``report`` captures
it again from the configuration stored in results.json, exactly as ``run`` did, and refuses a graph
whose hash is not the one the run solved. Data: ``html_data``; figures: ``html_figures``; the page:
``html_page``.
"""

from __future__ import annotations

import copy
from pathlib import Path

from solvers import Problem

from .html_data import ReportError, report_data
from .html_page import REPORT_FILE, write_page
from .results import load_results
from .run_data import LoadedRun, read_run

__all__ = ["REPORT_FILE", "ReportError", "write_html_report", "report_run"]


def write_html_report(run: LoadedRun, problem: Problem) -> Path:
    """Write ``report.html`` into the run's folder; returns its path."""
    return write_page(report_data(run, problem), run.dir)


def report_run(run_dir: str | Path) -> Path:
    """``opt-remat report``: (re)write the report of a finished run, capturing its graph again."""
    from pydantic import ValidationError

    from .config import Config, RunSpec
    from .config_rules import check, first_error
    from .workload import materialize

    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: not a folder (expected the output folder of opt-remat run)")
    results = load_results(run_dir / "results.json")  # the one read of it
    header = results.header
    data = copy.deepcopy(header.get("config"))
    if not isinstance(data, dict):
        raise ReportError(f"{run_dir / 'results.json'}: holds no configuration (written by an older opt-remat?)")
    data.setdefault("output", {})["dir"] = str(run_dir)  # the folder may have moved since
    # the configuration as run (paths already resolved), checked as load_config checks a file
    cfg = Config(Path(header.get("config_file") or run_dir / "results.json"), data, {}, [("output", "dir")])
    try:
        cfg.spec = RunSpec.model_validate(data)
    except ValidationError as exc:
        raise first_error(cfg, exc) from None
    check(cfg)
    work = materialize(cfg)
    expected = (header.get("fingerprint") or {}).get("graph_hash")
    if expected and work.graph_hash != expected:
        raise ReportError(f"the graph captured now (hash {work.graph_hash}) is not the one the run in {run_dir} "
                          f"solved ({expected}): the model, its factory or torch changed since; rerun it with "
                          "opt-remat run")
    return write_html_report(read_run(run_dir, work.problem, results), work.problem)
