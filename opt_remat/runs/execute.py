"""Solving a run's pairs: in this process, in a process pool, or on Ray.

``solve_pair`` is pure Python on a ``Problem`` (picklable in and out), so it runs in worker
processes; torch's own partitioner needs the captured FX graph and always runs here. ``solve_all``
yields each pair's ``SolveResult`` as it finishes, in whichever executor.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import signal
import threading
import time
import traceback
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from solvers import Plan, Problem, catalog
from solvers import progress as solver_progress

from ..plan_memory import GraphKey, graph_key
from .config import TORCH_SOLVER, BudgetSpec, SolverSpec
from .util import RunError, SolveRefused, first_line, quiet_torch
from .workload import Workload

@dataclass(frozen=True)
class Pair:
    """One (budget, solver) pair of a run, with the saved bytes its budget allows on this graph."""
    budget: BudgetSpec
    solver: SolverSpec
    budget_bytes: int | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.budget.label, self.solver.label)


@dataclass
class SolveResult:
    """A plan, or why there is none; with the solve's wall time and warnings."""
    plan: Plan | None = None
    status: str = "error"  # without a plan: infeasible, skipped or error
    error: str | None = None
    min_feasible_bytes: int | None = None
    min_peak_bytes: int | None = None
    wall_s: float | None = None
    warnings: list[str] = field(default_factory=list)
    traceback: str | None = None


@contextmanager
def _keep_sigint() -> Iterator[None]:
    """Put Python's Ctrl-C handler back after a solve: OR-Tools' CP-SAT installs its own C handler
    (which ends the process without Python's clean-up) and leaves it installed."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGINT, previous)


def default_lam(work: Workload) -> float | None:
    """The drop-in path's ``lam="auto"`` on this workload's device."""
    from ..api import auto_lam
    return None if getattr(work.profile, "bandwidth", None) is None else auto_lam(work.profile)


def solve_pair(problem: Problem, solver: str, budget_bytes: int | None, options: dict[str, Any],
               peak_budget: int | None = None, *, count_gradients: bool = True,
               default_lam: float | None = None, memory: GraphKey | None = None) -> SolveResult:
    """One (budget, solver) pair: a plan, or why there is none. Picklable in and out.
    ``default_lam``: the default path's min-cut plan joins a peak solve's candidates; ``memory``:
    the graph's key for plans remembered across solves (``opt_remat.plan_memory``)."""
    from ..options import mode_of
    from ..solve import choose_peak_plan, choose_plan

    mode = mode_of(budget_bytes, peak_budget)
    if not catalog.info(solver).supports(mode):
        return SolveResult(status="skipped", error=f"{solver} cannot solve {catalog.MODE_WORDS[mode]} (solvers "
                                                   f"that can: {', '.join(catalog.supporting(mode))})")
    # a run's solver entry may hold options of its other budgets' mode: this pair does without them
    left = catalog.not_applying(solver, options, mode)
    options = {k: v for k, v in options.items() if k not in left}
    with _keep_sigint():
        if peak_budget is not None:
            result = _solve_recorded(lambda: choose_peak_plan(
                problem, solver, peak_budget, budget_bytes, options, default_lam=default_lam,
                count_gradients=count_gradients, memory=memory))
        else:
            result = _solve_recorded(lambda: choose_plan(problem, solver, budget_bytes, options))
    if left:
        result.warnings.insert(0, f"option(s) {', '.join(left)} of {solver} do not apply "
                                  f"{catalog.MODE_WORDS[mode]}: this pair did without them")
    return result


def _solve_recorded(make_plan: Callable[[], Plan]) -> SolveResult:
    """Run one solve: its plan, or why there is none, with its wall time and warnings."""
    from ..solve import BudgetError, PeakBudgetError

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = SolveResult(plan=make_plan(), status="")
        except BudgetError as exc:
            out = SolveResult(status="infeasible", error=str(exc), min_feasible_bytes=exc.min_feasible_bytes)
        except PeakBudgetError as exc:
            out = SolveResult(status="infeasible", error=str(exc), min_peak_bytes=exc.min_peak)
        except Exception as exc:
            out = SolveResult(status="error", error=first_line(exc), traceback=traceback.format_exc(limit=5))
    out.wall_s = time.perf_counter() - start
    out.warnings = [str(w.message) for w in caught if not issubclass(w.category, (FutureWarning, DeprecationWarning))]
    return out


def solve_torch_pair(work: Workload, budget_bytes: int | None, peak_budget: int | None = None) -> SolveResult:
    """torch's own partitioner's choice on the captured graph (needs the FX graph: runs here)."""
    if peak_budget is not None:
        return SolveResult(status="skipped", error="torch's partitioner has no peak budget (its "
                                                   "activation_memory_budget bounds saved bytes)")
    from .. import torch_reference
    from ..build import classify

    fn = getattr(torch_reference, "torch_plan", None)
    if fn is None:
        return SolveResult(status="skipped", error="the torch baseline is not available in this install "
                                                   "(opt_remat.torch_reference.torch_plan)")
    prepared = work.prepared
    if prepared is None:
        return SolveResult(status="skipped", error="the torch baseline needs a captured torch model, not a graph file")

    def make_plan() -> Plan:
        joint = prepared.copy()
        info = classify(joint.module, joint.num_fwd_outputs, joint.static_lifetime_input_indices)
        return fn(joint.module, info, work.problem, budget_bytes)

    with quiet_torch():
        return _solve_recorded(make_plan)


def _solve_here(work: Workload, pair: Pair, lam: float | None) -> SolveResult:
    if pair.solver.name == TORCH_SOLVER:
        return solve_torch_pair(work, pair.budget_bytes, pair.budget.peak)
    return solve_pair(work.problem, pair.solver.name, pair.budget_bytes, dict(pair.solver.options),
                      pair.budget.peak, count_gradients=pair.budget.count_gradients, default_lam=lam,
                      memory=memory_key(work, pair))


def memory_key(work: Workload, pair: Pair | None = None) -> GraphKey | None:
    """The key plans of this graph are remembered by, for a peak-budget pair (else None)."""
    if pair is not None and pair.budget.peak is None:
        return None
    return graph_key(work.values, work.graph_id)


def solve_all(work: Workload, pairs: Sequence[Pair], *, jobs: int = 1, executor: str = "process",
              on_start: Callable[[Pair], None] = lambda pair: None,
              on_progress: Callable[[solver_progress.Progress], None] | None = None,
              ) -> Iterator[tuple[Pair, SolveResult]]:
    """Each pair with its result, as they finish. ``on_start`` hears of each pair solved here as it
    starts, ``on_progress`` of its search's incumbent and bound (solves in this process only)."""
    lam = default_lam(work)
    pooled = [p for p in pairs if p.solver.name != TORCH_SOLVER] if jobs > 1 else []
    if len(pooled) < 2:
        pooled = []
    pool = _executor(executor, jobs) if pooled else None
    try:
        futures = {pool.submit(solve_pair, work.problem, p.solver.name, p.budget_bytes, dict(p.solver.options),
                               p.budget.peak, count_gradients=p.budget.count_gradients, default_lam=lam,
                               memory=memory_key(work, p)): p
                   for p in pooled} if pool is not None else {}
        for pair in pairs:
            if pair not in pooled:
                on_start(pair)
                with solver_progress.reporting(on_progress) if on_progress is not None else nullcontext():
                    result = _solve_here(work, pair, lam)
                yield pair, result
        if pool is not None:
            stream = pool.drain() if isinstance(pool, _RayPool) else cf.as_completed(futures)
            for fut in stream:
                try:
                    result = fut.result()
                except Exception as exc:  # the worker died
                    result = SolveResult(status="error", error=first_line(exc))
                yield futures[fut], result
    except BaseException:  # Ctrl-C (or the caller stopped): do not wait for the solves still running
        if isinstance(pool, cf.Executor):
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    if isinstance(pool, cf.Executor):
        pool.shutdown(wait=True)


def _executor(kind: str, jobs: int) -> Any:
    if kind == "ray":
        import ray  # checked by the caller
        return _RayPool(ray, jobs)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)


class _RayPool:
    """The parts of an Executor the runs use, on Ray tasks."""

    def __init__(self, ray: Any, jobs: int) -> None:
        self.ray = ray
        if not ray.is_initialized():
            ray.init(num_cpus=jobs, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
        self.remote = ray.remote(solve_pair)
        self.futures: dict[Any, cf.Future] = {}

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        self.futures[self.remote.remote(*args, **kwargs)] = fut
        return fut

    def drain(self) -> Iterator[cf.Future]:
        pending = list(self.futures)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for ref in done:
                fut = self.futures[ref]
                try:
                    fut.set_result(self.ray.get(ref))
                except Exception as exc:  # a task that died
                    fut.set_exception(exc)
                yield fut


def ray_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("ray") is not None


def solve_one(work: Workload, solver: str, spec: BudgetSpec | None,
              options: dict[str, Any] | None = None,
              warn: Callable[[str], None] | None = None) -> tuple[Plan, int | None]:
    """``opt-remat solve``: one plan for one graph, solver and budget (saved bytes and/or peak).
    ``warn`` hears the solve's warnings (default: printed on stderr)."""
    bytes_ = work.budget_bytes(spec) if spec is not None else None
    peak = spec.peak if spec is not None else None
    if solver == TORCH_SOLVER:
        result = solve_torch_pair(work, bytes_, peak)
    else:
        result = solve_pair(work.problem, solver, bytes_, dict(options or {}), peak_budget=peak,
                            count_gradients=spec.count_gradients if spec is not None else True,
                            default_lam=default_lam(work), memory=memory_key(work) if peak else None)
    if result.plan is None:
        kind = SolveRefused if result.status in ("infeasible", "skipped") else RunError
        raise kind(result.error or result.status)
    import sys
    for w in result.warnings:
        if warn is not None:
            warn(f"opt-remat: warning: {w}")
        else:
            print(f"opt-remat: warning: {w}", file=sys.stderr)
    return result.plan, bytes_
