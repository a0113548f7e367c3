"""``opt-remat run``: capture once, solve every (budget, solver) pair, check each plan, report.

Results are written as each pair completes (``results.json``, ``results.csv``, atomically), so an
interrupted run keeps them and a rerun skips the pairs already done. Solving can run in parallel
processes or on Ray (``jobs``); capture and checks stay in this process.
"""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from solvers.training import TrainingSetup

from ..request import ONE_DEVICE
from .config import BudgetSpec, Config, SolverSpec
from .curves import Curve
from .execute import Pair, SolveResult, solve_all
from .plan_files import plan_curve, write_plan
from .progress import Display
from .results import Record, ResultsStore, fingerprint
from .run_data import PlanValues, read_run
from .summary import failed_verification, mincut_hull, progress_line, write_reports
from .util import first_line, jsonable, safe_name
from .verification import measure_plan, verify_gradients
from .workload import Workload, materialize


@dataclass
class RunSummary:
    out_dir: Path
    records: list[Record]
    ran: int
    skipped: int
    failed_verification: int


def run(cfg: Config, *, jobs: int = 1, executor: str = "process", work: Workload | None = None,
        verbose: bool = False, display: Display | None = None) -> RunSummary:
    """Solve every (budget, solver) pair of ``cfg`` that the output folder does not already hold.
    ``verbose``: show progress (live on a terminal, else lines); ``display`` chooses it outright."""
    display = display or Display.for_api(verbose)
    if work is None:
        display.message(f"capturing {cfg.name} ...")
        work = materialize(cfg)
    hull = mincut_hull(work.problem)
    store = ResultsStore(cfg, fingerprint(cfg, work.graph_hash, len(work.problem.nodes), work.profile),
                         {"problem": {"nodes": len(work.problem.nodes), "candidates": len(work.problem.candidates),
                                      "capture_s": work.capture_s, "top_anchor_bytes": work.top_anchor_bytes},
                          "mincut_hull": [list(p) for p in hull]})

    records: dict[tuple[str, str], Record] = {}
    plans: dict[tuple[str, str], PlanValues] = {}  # the plans solved here, for the reports
    curves: dict[frozenset[str], Curve] = {}  # each distinct plan simulated once
    pending: list[Pair] = []
    for b in cfg.budgets:
        budget_bytes = work.budget_bytes(b)
        for s in cfg.solvers:
            rec = store.reusable(b, s, budget_bytes)
            if rec is not None:
                records[rec.key] = rec
            else:
                pending.append(Pair(b, s, budget_bytes))

    # peak budgets tightest first: each plan, remembered, is a candidate at the looser budgets
    # (opt_remat.plan_memory), so a looser budget never gets a costlier plan
    pending.sort(key=lambda pair: tightest_first(pair.budget))
    store.open()
    reused = len(records)
    if reused:
        display.message(f"resuming: {reused} of {len(store.order)} pairs already in {store.path}")
    display.message(f"{cfg.name}: {len(work.problem.nodes)} nodes, {len(pending)} pairs to solve"
                    + (f" with {jobs} {executor} workers" if jobs > 1 else ""))
    store.write(list(records.values()))
    with display:
        display.start(len(pending))
        solved = solve_all(work, pending, jobs=jobs, executor=executor, on_progress=display.search,
                           on_start=lambda p: display.doing(f"solving {p.budget.label} {p.solver.label}"))
        with closing(solved):  # Ctrl-C while checking a plan: the pool's solves are dropped too
            for done, (pair, result) in enumerate(solved, 1):
                display.doing(f"checking {pair.budget.label} {pair.solver.label}")
                rec = make_record(cfg, work, pair.budget, pair.solver, pair.budget_bytes, result, curves)
                records[rec.key] = rec
                if result.plan is not None:
                    plans[rec.key] = PlanValues.of(result.plan)
                store.write(list(records.values()))
                display.finished(progress_line(done, len(pending), rec))
                for warning in result.warnings:  # e.g. options of the run's other budgets, left out here
                    display.message(f"  warning: {warning}")

    ordered = store.write(list(records.values()))
    table = write_reports(cfg, work, read_run(store.dir, work.problem, store.contents(ordered), plans))
    display.message("")
    display.message(table)
    display.message(f"\nresults in {store.dir}")
    if "html" in cfg.formats:
        display.message(f"interactive report: {store.dir / 'report.html'} (opens in any browser, offline)")
    return RunSummary(store.dir, ordered, len(pending), reused, failed_verification(ordered))


def tightest_first(budget: BudgetSpec) -> tuple[int, int]:
    """The budgets without a peak in their order, then the peak budgets by their peak, then the
    device budgets by the device's bytes."""
    if budget.device is not None:
        return (2, budget.device)
    return (int(budget.peak is not None), budget.peak or 0)


def curve_setup(cfg: Config, work: Workload) -> TrainingSetup | None:
    """The set-up every plan's curve counts the rank's memory under (one for the run, so that
    curves compare): the ``training`` section, else one device where a budget is a device's."""
    if work.request.training is not None:
        return work.request.training
    return ONE_DEVICE if any(b.device is not None for b in cfg.budgets) else None


def make_record(cfg: Config, work: Workload, b: BudgetSpec, s: SolverSpec, budget_bytes: int | None,
                result: SolveResult, curves: dict[frozenset[str], Curve]) -> Record:
    """A pair's record: its plan's figures and simulated step (``curves``: the run's, by saved
    values), its plan file, and its checks (or why there is no plan)."""
    rec = Record(budget=b.label, solver=s.label, solver_name=s.name, options=dict(s.options), budget_raw=b.raw,
                 budget_bytes=budget_bytes, peak_budget=b.peak, device_memory=b.device, solve_time_s=result.wall_s)
    plan = result.plan
    if plan is None:
        rec.status, rec.error = result.status, result.error
        rec.min_feasible_bytes, rec.min_peak_bytes = result.min_feasible_bytes, result.min_peak_bytes
        return rec
    out_dir = cfg.output_dir
    plan_file = out_dir / "plans" / f"{safe_name(b.label)}__{safe_name(s.label)}.json"
    curve, rec.offload = plan_curve(work, plan, curve_setup(cfg, work), curves)
    rec.status, rec.saved_bytes, rec.recompute_cost = plan.status.value, plan.saved_bytes, plan.recompute_cost
    rec.objective, rec.bound, rec.gap, rec.solve_time_s = plan.objective, plan.bound, plan.gap, plan.solve_time_s
    rec.n_saved, rec.n_recomputed, rec.message = len(plan.saved), len(plan.recomputed), plan.message
    rec.curve, rec.peak_bytes, rec.peak_gradient_bytes = curve, curve.peak, curve.peak_gradients
    rec.extra, rec.warnings = jsonable(dict(plan.extra or {})), list(result.warnings)
    rec.plan_file = str(plan_file.relative_to(out_dir))
    write_plan(plan_file, cfg, [work], [plan], [(curve, rec.offload)], budget_spec=b.raw,
               peak_budget=b.peak, device_memory=b.device)

    start = time.perf_counter()
    if cfg.measure_memory and work.prepared is not None:
        try:
            rec.measured_saved_bytes = measure_plan(work, plan)
        except Exception as exc:
            rec.verify_note, rec.verified = f"lowering failed: {first_line(exc)}", False
    if cfg.verify_gradients and work.model is not None and rec.verified is not False:
        try:
            check = verify_gradients(cfg, work, plan)
        except Exception as exc:
            rec.verified, rec.verify_note = False, f"training step failed: {first_line(exc)}"
        else:
            rec.verified, rec.bitwise, rec.max_rel_error = check.verified, check.bitwise, check.max_rel_error
            rec.loss, rec.loss_reference, rec.verify_note = check.loss, check.loss_reference, check.note
    if rec.measured_saved_bytes is not None and rec.measured_saved_bytes != plan.saved_bytes:
        rec.verify_note = (rec.verify_note + " measured saved bytes differ from the prediction").strip()
    if cfg.verify_gradients or cfg.measure_memory:
        rec.verify_s = time.perf_counter() - start
    return rec
