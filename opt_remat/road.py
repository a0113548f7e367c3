"""One road from a joint graph to a plan and its graphs: prepare -> build -> solve -> lower.

Every caller goes this way: the API's partitioner (``api.Partitioner``), ``opt-remat run`` and
``solve`` (``runs.workload``, ``runs.execute``) and verification (``runs.verification``).

* ``prepare`` turns AOTAutograd's joint graph and a ``SolveRequest`` into a ``PreparedGraph``: the
  cleaned-up graph, torch's ``NodeInfo``, the ``Problem``, and what is computed only when asked
  (the top anchor of fractional budgets, canonical values).
* ``plan_for`` turns a prepared graph and a request into a ``Plan``: a plan file's plan, torch's
  baseline, or a solve (``solve_problem``, the pure part, which a run's worker processes call on a
  pickled ``Problem``: MUST_SAVE steering, the options of the budget's mode, the default path).
* ``lower`` makes the forward and backward graphs of a plan.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp
from torch._subclasses.fake_tensor import unset_fake_temporarily

from solvers import Plan, Problem, catalog
from solvers import progress as solver_progress
from solvers.budget import Fraction, format_bytes, parse_budget
from solvers.device_budget import device_budget
from solvers.rank_memory import with_rank_memory
from solvers.offload import HostLink
from solvers.mip_offload import offload_program
from solvers.offload_plan import choose_offload

from . import plan_memory
from .build import build_problem
from .canonical import canonical_values, graph_id
from .errors import PeakBudgetError
from .lower import lower_plan
from .offload import host_link, must_offload_values, with_offloads
from .options import default_solver_options, mode_of, options_in_mode
from .plans import match_plan
from .prepare import classify, prepare_joint
from .report import format_seconds, search_text
from .request import SolveRequest, auto_lam
from .solve import choose_default_plan, choose_peak_plan, choose_plan, resolve_budget
from .tags import must_save_values, realized_plan, require_must_saves
from .torch_budget import (
    GLOBAL_SETTING,
    REGION_SETTING,
    torch_budget,
    torch_budget_is_set,
)
from .torch_reference import torch_plan, torch_runtime_optimized_saved

log = logging.getLogger("opt_remat")
# the offload program's time limit where the request sets none (a time_limit_s given is kept: a user's
# limit is never raised): on a 7B graph its first plan took HiGHS ~60 s of a loaded 2-core machine
PROGRAM_TIME_S = 120.0

Canonical = tuple[list[dict[str, Any]], str]


@dataclass(eq=False)
class PreparedGraph:
    """A joint graph after ``prepare_joint`` with what is read off it. ``problem`` is None when the
    graph has no backward to partition (torch's save-all handles it)."""
    module: fx.GraphModule
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int] | None
    info: tp.NodeInfo
    problem_or_none: Problem | None
    input_roles: list[str] | None = None  # per primal: "param NAME", "buffer NAME" or "input NAME"
    must_save: frozenset[str] = frozenset()  # MUST_SAVE-tagged values and must_offload (the solve's steering)
    must_offload: frozenset[str] = frozenset()  # MUST_CPU_OFFLOAD / should_offload values (opt_remat.offload)
    _top: int | None = field(default=None, repr=False)
    _canonical: Canonical | None = field(default=None, repr=False)

    @property
    def problem(self) -> Problem:
        if self.problem_or_none is None:
            raise ValueError("opt-remat internal error: a graph without a backward has no problem to solve")
        return self.problem_or_none

    @property
    def has_backward(self) -> bool:
        return self.problem_or_none is not None

    def top_anchor(self) -> int:
        """Saved bytes of torch's default min-cut on this graph: the top of fractional budgets
        (computed on first use; it annotates the graph, as torch's partitioner does)."""
        if self._top is None:
            self._top = self.problem.saved_bytes(torch_runtime_optimized_saved(self.module, self.info))
        return self._top

    def canonical(self) -> Canonical:
        """The graph's canonical values and id (``opt_remat.canonical``), computed on first use."""
        if self._canonical is None:
            self._canonical = _canonical_of(self.module, self.input_roles)
        return self._canonical

    def canonical_later(self) -> Canonical | Callable[[], Canonical]:
        """The canonical values and id if computed, else how to compute them (a partial over the
        graph alone, which deep-copies as inductor's config copies the partitioner)."""
        if self._canonical is not None:
            return self._canonical
        return functools.partial(_canonical_of, self.module, self.input_roles)

    def copy(self) -> PreparedGraph:
        """A deep copy of the graph (lowering and torch's partitioner edit the graph they get),
        sharing the problem and what was computed."""
        with unset_fake_temporarily():  # a real constant tensor cannot be copied under a fake mode
            module = copy.deepcopy(self.module)
        static = list(self.static_lifetime_input_indices or [])
        return PreparedGraph(module, self.num_fwd_outputs, static, classify(module, self.num_fwd_outputs, static),
                             self.problem_or_none, self.input_roles, self.must_save, self.must_offload, self._top,
                             self._canonical)


def _canonical_of(module: fx.GraphModule, roles: list[str] | None) -> Canonical:
    values = canonical_values(module, roles)
    return values, graph_id(module, values)


def prepare(joint_module: fx.GraphModule, num_fwd_outputs: int, static_lifetime_input_indices: list[int] | None,
            request: SolveRequest, *, input_roles: list[str] | None = None) -> PreparedGraph:
    """``joint_module`` (edited in place) prepared as torch's partitioner prepares it, classified,
    and its problem built with the request's device, costs and input-bytes rule."""
    module = prepare_joint(joint_module, rng_replay=request.replays_rng)
    info = classify(module, num_fwd_outputs, static_lifetime_input_indices)
    problem = None
    if len(info.required_bw_nodes) > 0:
        problem = build_problem(module, num_fwd_outputs=num_fwd_outputs, device=request.profile,
                                costs=request.costs, count_input_bytes=request.count_input_bytes, node_info=info,
                                input_roles=input_roles, backward_costs=request.offload)
    must_offload = frozenset(must_offload_values(module))
    return PreparedGraph(module, num_fwd_outputs, static_lifetime_input_indices, info, problem, input_roles,
                         frozenset(must_save_values(module)) | must_offload, must_offload)


def budget_in_force(prepared: PreparedGraph, request: SolveRequest) -> tuple[int | float | str | None, str]:
    """The request's budget if it has one, else torch's settings' (``torch_budget``); with a note
    when the request's budget overrides torch's settings (else "")."""
    if request.budget is not None:
        note = ""
        if torch_budget_is_set(prepared.module):
            note = (f"opt-remat: budget={request.budget!r} was given, so torch's memory budget settings "
                    f"({GLOBAL_SETTING}, {REGION_SETTING}) are ignored")
        return request.budget, note
    found = torch_budget(prepared.module, prepared.info)
    return (None if found is None else found.fraction), ""


def steered(problem: Problem, must_save: frozenset[str]) -> Problem:
    """The problem solvers get: MUST_SAVE values are spent bytes to them (``tags.require_must_saves``)."""
    return require_must_saves(problem, must_save) if must_save else problem


def budget_bytes(prepared: PreparedGraph, request: SolveRequest, requested: Any) -> int | None:
    """The saved bytes ``requested`` allows on this graph (a fraction between the inputs-only plan
    and torch's default min-cut), on the problem the request is solved on."""
    problem = prepared.problem
    if not (request.torch_baseline or request.plan_data is not None):
        problem = steered(problem, prepared.must_save)
    return resolve_budget(problem, requested, top_anchor=prepared.top_anchor)


@dataclass(frozen=True)
class Solved:
    plan: Plan
    budget_bytes: int | None


def plan_for(prepared: PreparedGraph, request: SolveRequest, requested: Any = None, *,
             settings: Mapping[str, Any] | None = None, verbose: bool = False) -> Solved:
    """The plan for a prepared graph: the request's plan file matched to it, torch's baseline, or
    a solve. ``requested``: the budget in force (``budget_in_force``; default the request's)."""
    requested = request.budget if requested is None else requested
    budget = budget_bytes(prepared, request, requested)
    if request.plan_data is not None:
        plan = match_plan(request.plan_data, prepared.module, prepared.input_roles, prepared.problem,
                          settings=settings, source=f"plan file {request.plan_path}")
        return Solved(offloads_of(prepared, request, plan), budget)
    if request.torch_baseline:
        parsed = parse_budget(requested)
        fraction = float(parsed) if isinstance(parsed, Fraction) else None
        prepared.canonical()  # before torch's partitioner edits the graph
        return Solved(torch_plan(prepared.module, prepared.info, prepared.problem, budget, fraction=fraction),
                      budget)
    memory = None
    if request.peak_limit is not None and plan_memory.enabled():
        memory = plan_memory.graph_key(*prepared.canonical())  # plans of earlier solves of this graph
    with solve_lines(verbose, request, requested) as done:
        plan = done(solve_problem(prepared.problem, request, budget, must_save=prepared.must_save, memory=memory,
                                  must_offload=prepared.must_offload))
    return Solved(offloads_of(prepared, request, plan), budget)


def offloads_of(prepared: PreparedGraph, request: SolveRequest, plan: Plan) -> Plan:
    """``plan`` with the values the graph asks to offload (MUST_CPU_OFFLOAD, ``should_offload``
    marks; PREFER_CPU_OFFLOAD with ``request.offload`` and no peak or device budget, where nothing
    is weighed) and those it chose itself."""
    prefer = request.offload and request.peak_budget is None and request.device_memory is None
    return with_offloads(prepared.problem, plan, prepared.module, offload=prefer, extra=plan.offloaded)


def offload_link(request: SolveRequest) -> HostLink:
    """The host link of the request's device, with its host-memory cap and size threshold."""
    return host_link(request.profile, host_bytes=request.host_memory, min_bytes=request.offload_min_bytes)


def solve_problem(problem: Problem, request: SolveRequest, budget: int | None, *,
                  must_save: frozenset[str] = frozenset(), memory: plan_memory.GraphKey | None = None,
                  must_offload: frozenset[str] = frozenset()) -> Plan:
    """The solve on a problem alone (picklable in and out: a run's workers call it): the options
    of the budget's mode, MUST_SAVE steering, and the peak, default or named solver's plan, read
    back on ``problem``. Options of another mode (allowed where torch's settings decide the
    budget) are left out with a warning. With ``request.offload`` under a peak budget the peak
    plan is handed to the offload chooser (``solvers.offload_plan``; ``must_offload``: the
    MUST_CPU_OFFLOAD values, offloaded whatever)."""
    started = time.perf_counter()
    mode = mode_of(budget, request.peak_limit)
    opts = options_in_mode(request.solver, request.options, mode)
    if request.solver in ("mincut", None) and mode == catalog.FREE:  # the default path is min-cut here
        lam = opts.get("lam", "auto")
        opts["lam"] = auto_lam(request.profile) if lam == "auto" else float(lam)
    steer = steered(problem, must_save)
    if request.device_memory is not None or request.peak_budget is not None:
        plan = _peak_plan(steer, request, budget, opts, memory, must_offload, started)
    elif request.solver is None:
        split = default_solver_options(opts, mode)
        plan = choose_default_plan(steer, budget, split["mincut"], split.get("milp"))
    else:
        plan = choose_plan(steer, request.solver, budget, opts)
    realized = realized_plan(problem, plan)
    return dataclasses.replace(realized, offloaded=plan.offloaded & realized.saved) if plan.offloaded else realized


def _peak_plan(problem: Problem, request: SolveRequest, budget: int | None, opts: dict[str, Any],
               memory: plan_memory.GraphKey | None, must_offload: frozenset[str], started: float) -> Plan:
    """The one peak branch: a peak budget, or a device budget (refused up front where the rank's
    states leave no room for the graph, ``DeviceBudgetError`` with the breakdown, else a peak solve
    on the problem whose simulation counts the rank's whole memory); with ``request.offload`` the
    peak plan goes on to the offload choice on that same problem."""
    peak, device = request.peak_budget, request.device_memory is not None
    if request.device_memory is not None:
        setup = request.rank_setup
        assert setup is not None
        device_budget(problem, setup, request.device_memory)
        problem, peak = with_rank_memory(problem, setup), request.device_memory
    assert peak is not None
    if request.offload:
        return peak_plan_with_offload(problem, request, budget, opts, memory, must_offload, peak=peak, device=device,
                                      started=started)
    return choose_peak_plan(problem, request.solver, peak, budget, opts, default_lam=auto_lam(request.profile),
                            count_gradients=request.count_gradients, memory=memory, device=device, started=started)


# solvers that run the offload program, and its engine: HiGHS for all, as the peak search's
# relaxation (cpsat and milp name the peak search under a peak budget); CP-SAT found no plan in
# 2 x 60 s on the 7B FSDP graph where HiGHS found one (docs/benchmarks.md)
PROGRAM_ENGINES = {"cpsat": "highs", "milp": "highs", "peak-search": "highs"}


def peak_plan_with_offload(problem: Problem, request: SolveRequest, budget: int | None, opts: dict[str, Any],
                           memory: plan_memory.GraphKey | None, must_offload: frozenset[str], *,
                           peak: int | None = None, device: bool = False, started: float | None = None) -> Plan:
    """The peak plan handed to the offload chooser; where no plan fits without offload, the least
    peak one found is, and offload may make it fit. With ``cpsat``, ``milp`` or ``peak-search`` the
    offload program (``solvers.mip_offload``) runs from the chooser's plan too, and its plan is
    taken where the simulator says it adds less time. ``peak``: the budget (default the
    request's peak budget; a device budget's on the rank's problem, ``device``)."""
    peak = request.peak_budget if peak is None else peak
    assert peak is not None
    kw: dict[str, Any] = {"default_lam": auto_lam(request.profile), "count_gradients": request.count_gradients,
                          "device": device, "started": started}
    failure: PeakBudgetError | None = None
    try:
        plan = choose_peak_plan(problem, request.solver, peak, budget, opts, memory=memory, **kw)
    except PeakBudgetError as exc:
        if exc.min_peak is None:
            raise
        failure = exc
        plan = choose_peak_plan(problem, request.solver, exc.min_peak, budget, opts, **kw)
    link = offload_link(request)
    chosen = choose_offload(problem, plan, peak, link, budget=budget, must=must_offload,
                            count_gradients=request.count_gradients)
    engine = PROGRAM_ENGINES.get(request.solver or "")
    if engine is not None:
        found = offload_program(problem, chosen, peak, link, budget=budget, must=must_offload,
                                count_gradients=request.count_gradients, engine=engine,
                                time_limit_s=float(opts.get("time_limit_s", PROGRAM_TIME_S)))
        greedy: Any = chosen.extra.get("offload")
        mine: Any = {} if found is None else found.extra
        if found is not None and (greedy is None or mine["offload"]["added_s"] < greedy["added_s"]):
            chosen = dataclasses.replace(found, extra={**mine, "greedy": greedy})
        else:  # the chooser's plan stays; what the program found is noted beside it
            noted = {"engine": engine, "fitted": False} if found is None else {
                **mine["offload_program"], "fitted": True, "added_s": mine["offload"]["added_s"]}
            chosen = dataclasses.replace(chosen, extra={**chosen.extra, "offload_program": noted})
    if failure is not None and "offload" not in chosen.extra:
        failure.args = (failure.args[0] + " (without offload; with it no plan found fits either)",)
        raise failure
    return chosen


def lower(prepared: PreparedGraph, plan: Plan, request: SolveRequest | None = None,
          joint_inputs: Any = None) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward graphs of ``plan`` (the graph is edited: lower a ``copy()`` to
    keep it). torch's baseline through the API (``request.torch_baseline``) is lowered by torch's
    own partitioner at the fraction it chose."""
    if request is not None and request.torch_baseline:
        with functorch_config.patch(activation_memory_budget=plan.extra["torch_fraction"]):
            return tp.min_cut_rematerialization_partition(
                prepared.module, joint_inputs, num_fwd_outputs=prepared.num_fwd_outputs,
                static_lifetime_input_indices=prepared.static_lifetime_input_indices)
    return lower_plan(prepared.module, plan, num_fwd_outputs=prepared.num_fwd_outputs, problem=prepared.problem,
                      static_lifetime_input_nodes=prepared.info.static_lifetime_input_nodes)


@contextlib.contextmanager
def solve_lines(verbose: bool, request: SolveRequest, budget: Any) -> Iterator[Callable[[Plan], Plan]]:
    """With ``verbose``: a solve's progress (phase, best cost, bound, gap) as lines on stderr, a
    line per change, then the plan found; yields what hands the plan over."""
    if not verbose:
        yield lambda plan: plan
        return
    what = (f"{request.solver or 'default'}" + (f" budget {budget}" if budget is not None else "")
            + (f" peak {format_bytes(request.peak_budget)}" if request.peak_budget is not None else "")
            + (f" device {format_bytes(request.device_memory)}" if request.device_memory is not None else ""))
    print(f"opt-remat: solving {what}", file=sys.stderr, flush=True)
    last = [""]

    def line(progress: solver_progress.Progress) -> None:
        text = search_text(progress)
        if text != last[0]:
            last[0] = text
            print(f"opt-remat: solving {what}: {text}", file=sys.stderr, flush=True)

    def done(plan: Plan) -> Plan:
        print(f"opt-remat: {what}: plan by {plan.solver}, {plan.status.value}, recompute "
              f"{format_seconds(plan.recompute_cost)}, saved {format_bytes(plan.saved_bytes)}, "
              f"{plan.solve_time_s:.1f} s", file=sys.stderr, flush=True)
        return plan

    with solver_progress.reporting(line):
        yield done
