"""One run as its reports read it (``LoadedRun``): results.json's contents, parsed once, and what
each plan saves and recomputes. ``opt-remat run`` builds it from what it holds in memory; ``report``
reads it from the output folder (``read_run``). The summary, the plots and the HTML page all read
this one object; each plan's curve comes with its record (``Record.curve``). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from solvers import Plan, Problem

from .curves import Curve, step_curve
from .plan_files import read_plan_values
from .results import Record, ResultsError, ResultsFile, load_results


@dataclass(frozen=True)
class PlanValues:
    """What a plan saves, recomputes and offloads, by value name."""
    saved: tuple[str, ...]
    recomputed: tuple[str, ...]
    offloaded: tuple[str, ...] = ()

    @classmethod
    def of(cls, plan: Plan) -> "PlanValues":
        return cls(tuple(plan.saved), tuple(plan.recomputed), tuple(sorted(plan.offloaded)))


@dataclass
class LoadedRun:
    dir: Path
    results: ResultsFile
    plans: dict[tuple[str, str], PlanValues] = field(default_factory=dict)  # per record with a plan
    missing: list[str] = field(default_factory=list)  # plan files that could not be read

    @property
    def records(self) -> list[Record]:
        return self.results.records

    @property
    def header(self) -> dict[str, Any]:
        return self.results.header

    @property
    def title(self) -> str:
        return self.results.title(self.dir.name)

    @property
    def hull(self) -> list[tuple[int, float]]:
        return self.results.hull


def read_run(run_dir: Path, problem: Problem, results: ResultsFile | None = None,
             plans: Mapping[tuple[str, str], PlanValues] | None = None) -> LoadedRun:
    """The run in ``run_dir`` whose graph is ``problem``: ``results`` and ``plans`` as the caller
    holds them, the rest read from the folder (results.json once; the plan files of records whose
    plans are not in ``plans``). A record of an older results format, which holds no curve, gets
    its curve simulated here."""
    run_dir = Path(run_dir)
    run = LoadedRun(run_dir, results if results is not None else load_results(run_dir / "results.json"),
                    dict(plans or {}))
    curves: dict[frozenset[str], Curve] = {}
    for rec in run.records:
        if not rec.plan_file or rec.saved_bytes is None:
            continue
        values = run.plans.get(rec.key)
        if values is None:
            try:
                values = PlanValues(*read_plan_values(run_dir / rec.plan_file))
            except (OSError, ValueError):
                run.missing.append(rec.plan_file)  # removed or damaged by hand: left out, said so
                continue
            run.plans[rec.key] = values
        unknown = [v for v in (*values.saved, *values.recomputed) if v not in problem.by_name]
        if unknown:
            raise ResultsError(f"{rec.plan_file} names values that are not in the run's graph "
                               f"(e.g. {unknown[0]}): the folder holds plans of another graph")
        if rec.curve is None:  # each distinct plan once
            key = frozenset(values.saved)
            if key not in curves:
                curves[key] = step_curve(problem, values.saved)
            rec.curve = curves[key]
    return run
