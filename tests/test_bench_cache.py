"""``bench_default_peak.big_problem``'s cache: captured once, then read back (the capture is
replaced by a small random problem here: what is tested is the cache, not the 7B capture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_default_peak as bench
from solvers.liveness import simulate_plan
from tests.support.random_problems import repeated_problem


def test_big_problem_is_captured_once_then_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[str] = []
    problem = repeated_problem(3)

    def capture(name: str) -> str:
        captured.append(name)
        return name

    monkeypatch.setattr(bench, "_capture_big", capture)
    monkeypatch.setattr(bench, "problem_from_joint", lambda joint, device: (None, problem))
    first = bench.big_problem("7b", str(tmp_path))
    second = bench.big_problem("7b", str(tmp_path))
    assert captured == ["7b"]
    assert (tmp_path / "7b.pkl").exists()
    assert second is not first
    saved = [n.name for n in problem.candidates][:3]
    assert [n.name for n in second.nodes] == [n.name for n in problem.nodes]
    assert simulate_plan(second, saved).peak == simulate_plan(problem, saved).peak
    bench.big_problem("7b")  # no cache: captured again
    assert captured == ["7b", "7b"]
