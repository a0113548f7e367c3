"""Live progress: every report a listener hears is labelled with a phase."""

from solvers import progress
from solvers.catalog import solve
from solvers.options import CpsatOptions
from support.random_problems import random_problem


def test_a_report_without_phase_keeps_the_last_one_named() -> None:
    heard: list[progress.Progress] = []
    with progress.reporting(heard.append):
        progress.report(None, None)  # nothing named yet
        progress.report(None, None, "outer")
        progress.report(3.0, 1.0)
        progress.report(None, 0.0, "inner")
        progress.report(2.0, 0.5)
    assert [h.phase for h in heard] == ["", "outer", "outer", "inner", "inner"]
    with progress.reporting(heard.append):  # a new listener starts unlabelled
        progress.report(1.0, 1.0)
    assert heard[-1].phase == ""


def test_cpsat_reports_are_labelled() -> None:
    heard: list[progress.Progress] = []
    problem = random_problem(3, n_forward=150)
    budget = solve(problem, "mincut", None).saved_bytes  # feasible: CP-SAT searches below the free optimum
    with progress.reporting(heard.append):
        solve(problem, "cpsat", budget, CpsatOptions(time_limit_s=5))
    assert heard[0].phase == "cpsat: started" and heard[-1].phase == "cpsat: done"
    assert {h.phase for h in heard[1:-1]} <= {"CP-SAT search"}  # CP-SAT's own reports say so
