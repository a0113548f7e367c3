"""Solving a run's pairs: in this process, in a process pool, or on Ray.

Each pair is a ``SolveRequest`` (``pair_request``: the run's settings with the pair's budget,
solver and the options of its kind of budget), solved by ``opt_remat.road``: ``solve_pair`` calls
its pure part on a ``Problem`` (picklable in and out), so it runs in worker processes; torch's own
partitioner needs the captured FX graph and always runs here. ``solve_all`` yields each pair's
``SolveResult`` as it finishes, in whichever executor.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import signal
import sys
import threading
import time
import traceback
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generator, Iterator, Sequence

from solvers import Plan, Problem, catalog
from solvers import progress as solver_progress

from .. import road
from ..plan_memory import GraphKey, graph_key
from ..errors import DeviceBudgetError, RequestError
from ..options import mode_of, options_in_mode
from ..request import DEFAULT_SOLVER, SolveRequest, request_for
from ..solve import BudgetError, PeakBudgetError
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


def pair_request(work: Workload, solver: SolverSpec | str, budget: BudgetSpec | None,
                 options: dict[str, Any] | None = None) -> SolveRequest | SolveResult:
    """The request of one (budget, solver) pair: the run's settings (``work.request``) with the
    pair's budget, solver and the options of its kind of budget (a run's solver entry serves all its
    budgets: options of another kind are its other pairs'); a skipped result if the solver cannot
    solve under this kind of budget."""
    name = solver if isinstance(solver, str) else solver.name
    opts = dict(options if options is not None else ({} if isinstance(solver, str) else solver.options))
    limit = None if budget is None else budget.peak_limit
    raw = None if budget is None else budget.saved_raw
    mode = mode_of(raw, limit)
    if name != TORCH_SOLVER and not catalog.info(name).supports(mode):
        return SolveResult(status="skipped", error=f"{name} cannot solve {catalog.MODE_WORDS[mode]} (solvers "
                                                   f"that can: {', '.join(catalog.supporting(mode))})")
    if name == TORCH_SOLVER and limit is not None:
        return SolveResult(status="skipped", error="torch's partitioner has no peak budget (its "
                                                   "activation_memory_budget bounds saved bytes)")
    solver_name = None if name == DEFAULT_SOLVER else name
    try:
        return request_for(work.request, solver_name, raw, peak_budget=None if budget is None else budget.peak,
                           count_gradients=True if budget is None else budget.count_gradients,
                           options=options_in_mode(solver_name, opts, mode, warn=False),
                           device_memory=None if budget is None else budget.device)
    except RequestError as exc:  # the config's checks refuse these first: a pair that slipped through
        return SolveResult(status="error", error=str(exc))


def solve_pair(problem: Problem, request: SolveRequest, budget_bytes: int | None, *,
               must_save: frozenset[str] = frozenset(), memory: GraphKey | None = None,
               must_offload: frozenset[str] = frozenset()) -> SolveResult:
    """One pair, solved on its problem alone (``opt_remat.road.solve_problem``): a plan, or why
    there is none. Picklable in and out. ``memory``: the graph's key for plans remembered across
    solves (``opt_remat.plan_memory``)."""
    with _keep_sigint():
        return _solve_recorded(lambda: road.solve_problem(problem, request, budget_bytes, must_save=must_save,
                                                          memory=memory, must_offload=must_offload))


def _solve_recorded(make_plan: Callable[[], Plan]) -> SolveResult:
    """Run one solve: its plan, or why there is none, with its wall time and warnings."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = SolveResult(plan=make_plan(), status="")
        except BudgetError as exc:
            out = SolveResult(status="infeasible", error=str(exc), min_feasible_bytes=exc.min_feasible_bytes)
        except PeakBudgetError as exc:
            out = SolveResult(status="infeasible", error=str(exc), min_peak_bytes=exc.min_peak)
        except DeviceBudgetError as exc:  # the rank's states alone leave no room: no plan to search for
            out = SolveResult(status="infeasible", error=str(exc))
        except Exception as exc:
            out = SolveResult(status="error", error=first_line(exc), traceback=traceback.format_exc(limit=5))
    out.wall_s = time.perf_counter() - start
    out.warnings = [str(w.message) for w in caught if not issubclass(w.category, (FutureWarning, DeprecationWarning))]
    return out


def solve_torch_pair(work: Workload, request: SolveRequest, budget_bytes: int | None) -> SolveResult:
    """torch's own partitioner's choice on the captured graph (needs the FX graph: runs here), at
    the fraction whose plan fits the budget's bytes."""
    prepared = work.prepared
    if prepared is None:
        return SolveResult(status="skipped", error="the torch baseline needs a captured torch model, not a graph file")
    # in bytes: the fraction that fits them is searched, as the run's other solvers meet the bytes
    in_bytes = replace(request, budget=budget_bytes)
    with quiet_torch():  # on a copy: torch's partitioner annotates the graph it is given
        return _solve_recorded(lambda: road.plan_for(prepared.copy(), in_bytes).plan)


def _solve_here(work: Workload, pair: Pair) -> SolveResult:
    request = pair_request(work, pair.solver, pair.budget)
    if isinstance(request, SolveResult):
        return request
    if request.torch_baseline:
        return solve_torch_pair(work, request, pair.budget_bytes)
    return solve_pair(work.problem, request, pair.budget_bytes, must_save=work.must_save,
                      memory=memory_key(work, pair), must_offload=work.must_offload)


def memory_key(work: Workload, pair: Pair | None = None) -> GraphKey | None:
    """The key plans of this graph are remembered by, for a peak-budget pair (else None)."""
    if pair is not None and pair.budget.peak_limit is None:
        return None
    return graph_key(work.values, work.graph_id)


def solve_all(work: Workload, pairs: Sequence[Pair], *, jobs: int = 1, executor: str = "process",
              on_start: Callable[[Pair], None] = lambda pair: None,
              on_progress: Callable[[solver_progress.Progress], None] | None = None,
              ) -> Generator[tuple[Pair, SolveResult], None, None]:
    """Each pair with its result, as they finish. ``on_start`` hears of each pair solved here as it
    starts, ``on_progress`` of its search's incumbent and bound (solves in this process only)."""
    requests = [(p, pair_request(work, p.solver, p.budget)) for p in pairs] if jobs > 1 else []
    pooled = [(p, r) for p, r in requests if isinstance(r, SolveRequest) and not r.torch_baseline]
    if len(pooled) < 2:
        pooled = []
    pool = _executor(executor, jobs) if pooled else None
    try:
        futures = {pool.submit(solve_pair, work.problem, r, p.budget_bytes, must_save=work.must_save,
                               memory=memory_key(work, p), must_offload=work.must_offload): p
                   for p, r in pooled} if pool is not None else {}
        in_pool = [p for p, _ in pooled]
        for pair in pairs:
            if pair not in in_pool:
                on_start(pair)
                with solver_progress.reporting(on_progress) if on_progress is not None else nullcontext():
                    result = _solve_here(work, pair)
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
    request = pair_request(work, solver, spec, options)
    if isinstance(request, SolveResult):
        result = request
    elif request.torch_baseline:
        result = solve_torch_pair(work, request, bytes_)
    else:
        result = solve_pair(work.problem, request, bytes_, must_save=work.must_save,
                            memory=memory_key(work) if request.peak_budget is not None else None,
                            must_offload=work.must_offload)
    if result.plan is None:
        kind = SolveRefused if result.status in ("infeasible", "skipped") else RunError
        raise kind(result.error or result.status)
    for w in result.warnings:
        if warn is not None:
            warn(f"opt-remat: warning: {w}")
        else:
            print(f"opt-remat: warning: {w}", file=sys.stderr)
    return result.plan, bytes_
