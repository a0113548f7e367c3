"""The public entry points: a drop-in ``partition_fn`` and a ``torch.compile`` backend."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import time
import warnings
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from solvers import Plan, Problem, catalog
from solvers.budget import Fraction, format_bytes, parse_budget
from solvers.plans_io import read_plan_file

from . import plan_memory
from .build import build_problem, classify, prepare_joint
from .canonical import canonical_values, graph_id, input_roles
from .costs import DeviceProfile, get_profile
from .errors import catchable
from .lower import lower_plan
from .offload import must_offload_values, with_offloads
from .options import (TORCH_SOLVER, check_solver_options, default_solver_options, mode_of, options_in_mode,
                      possible_modes)
from .report import format_seconds
from .solve import choose_default_plan, choose_peak_plan, choose_plan, resolve_budget
from .tags import must_save_values, realized_plan, require_must_saves
from .torch_budget import GLOBAL_SETTING, REGION_SETTING, torch_budget, torch_budget_is_set
from .torch_reference import torch_plan, torch_runtime_optimized_saved

# lam="auto": a second of recompute is worth 10% of the bytes the device moves in a second, so that
# bandwidth-bound ops (pointwise, views) are recomputed and compute-bound ones (matmuls) are saved
AUTO_LAM_FRACTION_OF_BANDWIDTH = 0.1


def auto_lam(profile: DeviceProfile) -> float:
    """``lam="auto"`` on a device: the min-cut weight the default path uses."""
    return AUTO_LAM_FRACTION_OF_BANDWIDTH * profile.bandwidth


@dataclass(repr=False)
class PartitionRecord:
    """What one call of the partitioner decided, kept for reports and tests. ``str()``/``repr()``
    give a one-line summary; the fields (``problem``, ``plan``, the two graph modules) hold the rest."""
    problem: Problem
    plan: Plan
    budget_bytes: int | None
    fw_module: fx.GraphModule
    bw_module: fx.GraphModule
    num_fwd_outputs: int
    seconds: float
    # the joint graph's canonical values (opt_remat.canonical) and id, or how to compute them: on
    # first use, as reports and plan files need them and a partition does not
    canonical: tuple[list[dict[str, Any]], str] | Callable[[], tuple[list[dict[str, Any]], str]] = \
        field(default=([], ""), repr=False)

    def __repr__(self) -> str:
        plan = self.plan
        budget = "" if self.budget_bytes is None else f" (budget {format_bytes(self.budget_bytes)})"
        gap = "" if plan.gap is None else f", gap {plan.gap:.2%}"
        return (f"PartitionRecord({plan.solver}, {plan.status.value}{gap}: saves {len(plan.saved)} values, "
                f"{format_bytes(plan.saved_bytes)}{budget}; recomputes {len(plan.recomputed)}, "
                f"{format_seconds(plan.recompute_cost)}; {len(self.problem.nodes)} nodes; "
                f"partitioned in {format_seconds(self.seconds)})")

    __str__ = __repr__

    @property
    def values(self) -> list[dict[str, Any]]:
        return self._canonical()[0]

    @property
    def graph_id(self) -> str:
        return self._canonical()[1]

    def _canonical(self) -> tuple[list[dict[str, Any]], str]:
        if callable(self.canonical):
            self.canonical = self.canonical()  # computed once; the joint graph is let go
        return self.canonical


def _canonical(joint_module: fx.GraphModule, roles: list[str] | None) -> tuple[list[dict[str, Any]], str]:
    values = canonical_values(joint_module, roles)
    return values, graph_id(joint_module, values)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cycle collector off for a partition: building graphs allocates many objects, and
    with a large heap (the model, its graphs, their fake tensors) the collections this triggers
    cost as much as the partition itself; it makes few cycles. Restored on the way out."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class Partitioner:
    """A ``partition_fn`` for AOTAutograd (same signature as torch's min-cut partitioner)."""
    solver: str | None = None  # None: mincut, or under a budget mincut then a short CP-SAT search
    budget: int | float | str | None = None
    device: str | DeviceProfile | Mapping[str, Any] = "h100"
    options: dict[str, Any] = field(default_factory=dict)
    count_input_bytes: bool = False
    plan: str | Path | None = None  # a plan saved by ``opt-remat solve``: applied instead of solving
    peak_budget: int | str | None = None  # bytes of the step's peak live memory
    count_gradients: bool = True  # False: the peak budget is for activations alone (no .grad)
    rng_replay: bool = True  # random ops recomputable by replaying their RNG state (opt_remat.rng_replay)
    costs: str = "roofline"  # or "profile": recompute costs timed on the device (opt_remat.profile_costs)
    verbose: bool = False  # each solve's phase, best cost, bound and gap as lines on stderr
    offload: bool = False  # PREFER_CPU_OFFLOAD values offloaded too (opt_remat.offload)
    history: list[PartitionRecord] = field(default_factory=list)
    # set by ``backend()`` while it compiles: the dynamo graph's input roles, and its settings
    input_roles: list[str] | None = None
    settings: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.costs not in ("roofline", "profile"):
            raise ValueError(f"costs must be 'roofline' or 'profile', got {self.costs!r}")
        parse_budget(self.budget)  # fail early on a budget that does not parse
        peak = parse_budget(self.peak_budget)
        if isinstance(peak, Fraction):
            raise ValueError(f"peak_budget is bytes (an int or a string such as '200MiB'), got {self.peak_budget!r}")
        self._peak_bytes = peak
        self.profile = get_profile(self.device)
        self._noted_override = False  # the explicit-budget note is given once per partitioner
        self._plan_data = read_plan_file(self.plan) if self.plan is not None else None
        # the check YAML configs get: a misspelled option fails here, not at compile time
        checked = {k: 0.0 if (k, v) == ("lam", "auto") else v for k, v in self.options.items()}
        check_solver_options(self.solver, checked, possible_modes(self.budget, self._peak_bytes))
        if peak is not None and self.plan is None and self.solver not in (None, *catalog.supporting(catalog.PEAK)):
            raise ValueError(f"solver {self.solver!r} has no peak-budget mode: peak_budget works with solver "
                             f"{', '.join(map(repr, catalog.supporting(catalog.PEAK)))} or none (the default)")

    def uuid(self) -> str:
        """A key for everything that decides this partitioner's plans: solver, budgets, options,
        device profile, plan-file content, capture settings, and opt-remat's own code (its
        version and a hash of its sources, so an edited checkout misses too). Inductor's FX graph
        cache and AOTAutograd's cache add it to their keys (with the graph and torch's settings)."""
        plan_text = b"" if self.plan is None else Path(self.plan).read_bytes()
        settings = {
            "solver": self.solver, "budget": self.budget, "peak_budget": self.peak_budget,
            "options": sorted((k, repr(v)) for k, v in self.options.items()),
            "device": dataclasses.asdict(self.profile), "count_input_bytes": self.count_input_bytes,
            "plan": hashlib.sha256(plan_text).hexdigest(), "settings": self.settings,
            "count_gradients": self.count_gradients, "rng_replay": self.rng_replay, "costs": self.costs,
            "offload": self.offload,
            "code": code_fingerprint(),
        }
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=repr).encode()).hexdigest()

    def solver_options(self, budget: int | float | str | None = None) -> dict[str, Any]:
        """Options for the solver; ``budget`` is the one in force (``budget=`` or torch's). Options
        of another mode (allowed when torch's settings decide the budget) are left out, with a
        warning."""
        mode = mode_of(budget, self._peak_bytes)
        opts = options_in_mode(self.solver, self.options, mode)
        if self.solver in ("mincut", None) and mode == "free":
            lam = opts.get("lam", "auto")
            opts["lam"] = auto_lam(self.profile) if lam == "auto" else float(lam)
        return opts

    def __call__(self, joint_module: fx.GraphModule, joint_inputs: Any, *args: Any,
                 num_fwd_outputs: int, static_lifetime_input_indices: list[int] | None = None,
                 **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        with gc_paused():
            return self._partition(joint_module, joint_inputs, num_fwd_outputs, static_lifetime_input_indices)

    def _partition(self, joint_module: fx.GraphModule, joint_inputs: Any, num_fwd_outputs: int,
                   static_lifetime_input_indices: list[int] | None) -> tuple[fx.GraphModule, fx.GraphModule]:
        start = time.perf_counter()
        # torch's baseline runs torch's partitioner, which knows nothing of opt-remat's state nodes
        replay = self.rng_replay and not (self.solver == TORCH_SOLVER and self._plan_data is None)
        joint_module = prepare_joint(joint_module, rng_replay=replay)
        info = classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
        if len(info.required_bw_nodes) == 0:  # nothing to partition: torch's save-all does it
            return tp.default_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                        static_lifetime_input_indices=static_lifetime_input_indices)
        problem = build_problem(joint_module, num_fwd_outputs=num_fwd_outputs, device=self.profile,
                                costs=self.costs, backward_costs=self.offload,
                                count_input_bytes=self.count_input_bytes, node_info=info)
        requested = self._budget_in_force(joint_module, info)
        if self.solver == TORCH_SOLVER and self._plan_data is None:
            budget = resolve_budget(problem, requested, top_anchor=lambda: problem.saved_bytes(
                torch_runtime_optimized_saved(joint_module, info)))
            return self._torch_partition(joint_module, joint_inputs, info, problem, budget, requested,
                                         num_fwd_outputs, static_lifetime_input_indices, start)
        # the joint graph is not changed after this: its canonical values can wait for a reader
        canonical: Any = functools.partial(_canonical, joint_module, self.input_roles)
        if self._plan_data is not None:
            from .plans import match_plan
            budget = resolve_budget(problem, requested, top_anchor=lambda: problem.saved_bytes(
                torch_runtime_optimized_saved(joint_module, info)))
            plan = match_plan(self._plan_data, joint_module, self.input_roles, problem, settings=self.settings,
                              source=f"plan file {self.plan}")
        else:
            # MUST_SAVE values are spent bytes to the solver; the plan is then read on the problem
            steer = require_must_saves(problem, must_save_values(joint_module) + must_offload_values(joint_module))
            budget = resolve_budget(steer, requested, top_anchor=lambda: steer.saved_bytes(
                torch_runtime_optimized_saved(joint_module, info)))
            memory = None
            if self._peak_bytes is not None and plan_memory.enabled():
                # plans of earlier solves of this graph are reused (opt_remat.plan_memory): its ids now
                canonical = _canonical(joint_module, self.input_roles)
                memory = plan_memory.graph_key(*canonical)
            with _solve_lines(self.verbose, self.solver, requested, self._peak_bytes) as done:
                plan = done(self._solve(steer, budget, requested, memory))
            plan = realized_plan(problem, plan)
        plan = with_offloads(problem, plan, joint_module, offload=self.offload, extra=plan.offloaded)
        fw_module, bw_module = lower_plan(joint_module, plan, num_fwd_outputs=num_fwd_outputs, problem=problem,
                                          static_lifetime_input_nodes=info.static_lifetime_input_nodes)
        self.history.append(PartitionRecord(problem, plan, budget, fw_module, bw_module, num_fwd_outputs,
                                            time.perf_counter() - start, canonical))
        return fw_module, bw_module


    def _solve(self, steer: Problem, budget: int | None, requested: int | float | str | None,
               memory: plan_memory.GraphKey | None = None) -> Plan:
        opts = self.solver_options(requested)
        if self._peak_bytes is not None:
            return choose_peak_plan(steer, self.solver or "mincut", self._peak_bytes, budget, opts,
                                    default_lam=auto_lam(self.profile), count_gradients=self.count_gradients,
                                    memory=memory)
        if self.solver is None:
            split = default_solver_options(opts, mode_of(requested, None))
            return choose_default_plan(steer, budget, split["mincut"], split.get("milp"))
        return choose_plan(steer, self.solver, budget, opts)

    def _budget_in_force(self, joint_module: fx.GraphModule, info: tp.NodeInfo) -> int | float | str | None:
        """``budget=`` if given (noting once that it overrides torch's settings), else torch's."""
        if self.budget is not None:
            if not self._noted_override and torch_budget_is_set(joint_module):
                self._noted_override = True
                warnings.warn(f"opt-remat: budget={self.budget!r} was given, so torch's memory budget "
                              f"settings ({GLOBAL_SETTING}, {REGION_SETTING}) are ignored",
                              stacklevel=3)
            return self.budget
        found = torch_budget(joint_module, info)
        return None if found is None else found.fraction

    def _torch_partition(self, joint_module: fx.GraphModule, joint_inputs: Any, info: tp.NodeInfo,
                         problem: Problem, budget: int | None, requested: int | float | str | None,
                         num_fwd_outputs: int, static_lifetime_input_indices: list[int] | None,
                         start: float) -> tuple[fx.GraphModule, fx.GraphModule]:
        """torch's own partitioner at the requested fraction (or the one that fits the bytes)."""
        values = canonical_values(joint_module, self.input_roles)  # before torch's partitioner edits the graph
        gid = graph_id(joint_module, values)
        parsed = parse_budget(requested)
        fraction = float(parsed) if isinstance(parsed, Fraction) else None
        plan = torch_plan(joint_module, info, problem, budget, fraction=fraction)
        with functorch_config.patch(activation_memory_budget=plan.extra["torch_fraction"]):
            fw_module, bw_module = tp.min_cut_rematerialization_partition(
                joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                static_lifetime_input_indices=static_lifetime_input_indices)
        self.history.append(PartitionRecord(problem, plan, budget, fw_module, bw_module, num_fwd_outputs,
                                            time.perf_counter() - start, (values, gid)))
        return fw_module, bw_module

@contextlib.contextmanager
def _solve_lines(verbose: bool, solver: str | None, budget: Any, peak: int | None
                 ) -> Iterator[Callable[[Plan], Plan]]:
    """With ``verbose``: a solve's progress (phase, best cost, bound, gap) as lines on stderr, the
    lines ``opt-remat run`` prints when piped, then the plan found; yields what hands it over."""
    if not verbose:
        yield lambda plan: plan
        return
    import sys

    from solvers import progress

    from .runs.progress import Display

    what = (f"{solver or 'default'}" + (f" budget {budget}" if budget is not None else "")
            + (f" peak {format_bytes(peak)}" if peak is not None else ""))
    display = Display("lines", stream=sys.stderr)
    display.doing(f"opt-remat: solving {what}")

    def done(plan: Plan) -> Plan:
        display.message(f"opt-remat: {what}: plan by {plan.solver}, {plan.status.value}, recompute "
                        f"{format_seconds(plan.recompute_cost)}, saved {format_bytes(plan.saved_bytes)}, "
                        f"{plan.solve_time_s:.1f} s")
        return plan

    with progress.reporting(display.search):
        yield done


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """opt-remat's version and a hash of the sources of ``opt_remat`` and ``solvers``."""
    from .plans import versions

    digest = hashlib.sha256(repr(sorted(versions().items())).encode())
    for package in (Path(__file__).parent, Path(__file__).parent.parent / "solvers"):
        for path in sorted(package.glob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def partitioner(solver: str | None = None, budget: int | float | str | None = None, *,
                device: str | DeviceProfile | Mapping[str, Any] = "h100",
                count_input_bytes: bool = False, plan: str | Path | None = None,
                peak_budget: int | str | None = None, count_gradients: bool = True,
                rng_replay: bool = True, costs: str = "roofline", verbose: bool = False,
                offload: bool = False, **options: Any) -> Partitioner:
    """A drop-in for ``torch._functorch.partitioners.min_cut_rematerialization_partition``.

    ``budget``: saved-activation bytes (int or "512MiB"), or a float in [0, 1] with the meaning of
    torch's ``activation_memory_budget``; without it, torch's own settings apply
    (``torch._functorch.config.activation_memory_budget`` and
    ``torch.autograd.graph.region_activation_memory_budget``; 1.0, torch's default, means none).
    ``solver``: None (default) is min-cut, and under a budget the least-recompute plan proven by
    HiGHS from min-cut warm starts (min-cut's plan where HiGHS proves nothing in its node limit or
    10 s; ``opt_remat.solve.choose_default_plan``); a named solver is used alone
    (``"mincut"``: the pure fast path). ``options`` go to the solver (e.g. ``lam`` for mincut,
    ``time_limit_s``/``threads``/``seed`` for cpsat, ``backend`` for milp; ``symmetry="warm"`` or
    ``"tie"`` for cpsat/milp on models of repeated layers, see ``solvers.mip.solve_mip``). ``plan``: a JSON plan
    saved by ``opt-remat solve``, applied instead of solving; refused if made for another graph.
    ``peak_budget``: bytes of the whole step's peak of live activations, recomputed values and
    gradients (parameters and inputs excluded); can be combined with ``budget``.
    ``count_gradients=False``: the peak budget leaves gradients out (when ``.grad`` buffers live
    between steps anyway, e.g. with gradient accumulation, only activations are the plan's to fit).
    ``rng_replay``: random ops (dropout) may be recomputed by replaying the RNG state the forward
    saves for them (its bytes count like any saved value); False never recomputes them.
    ``costs="profile"``: recompute costs timed on the device the graph runs on (cached on disk)
    instead of the roofline estimate of ``device``. ``verbose``: each solve's phase, best cost,
    bound and gap on stderr as they change, then the plan found. Offload (``opt_remat.offload``):
    MUST_CPU_OFFLOAD values are saved and offloaded, ``should_offload`` marks too with torch's
    ``enable_activation_offloading``; ``offload=True`` offloads PREFER_CPU_OFFLOAD values as well.
    Which solvers exist, the budgets each meets and the options each takes: ``solvers.catalog``;
    an option the solver does not take (under the budgets given) is an error naming those it does.
    """
    return Partitioner(solver=solver, budget=budget, device=device, options=options,
                       count_input_bytes=count_input_bytes, plan=plan, peak_budget=peak_budget,
                       count_gradients=count_gradients, rng_replay=rng_replay, costs=costs,
                       verbose=verbose, offload=offload)


def _decompositions(name: str | Mapping | None) -> Mapping:
    if name is None or name == "none":
        return {}
    if name == "inductor":
        from torch._inductor.decomposition import select_decomp_table
        return select_decomp_table()
    if isinstance(name, Mapping):
        return name
    raise ValueError(f"decompositions must be 'inductor', 'none' or a table, got {name!r}")


def backend(solver: str | None = None, budget: int | float | str | None = None, *,
            compiler: str | Callable[..., Any] = "inductor", decompositions: str | Mapping | None = None,
            partition_fn: Partitioner | None = None, **options: Any) -> Callable[..., Any]:
    """A ``torch.compile`` backend that partitions with opt-remat.

    ``compiler="inductor"`` (default) runs inductor with opt-remat as its partitioner;
    ``compiler="eager"`` runs the partitioned FX graphs as they are (with ``decompositions``,
    "inductor" or none); a callable is used as AOTAutograd's forward and backward compiler. The partitioner is reachable as ``backend_fn.partitioner``.
    """
    pfn = partition_fn or partitioner(solver, budget, **options)
    if isinstance(pfn, Partitioner):
        pfn.settings = {"compiler": compiler if isinstance(compiler, str) else "custom",
                        "decompositions": "inductor" if compiler == "inductor" else decompositions}
    if compiler == "inductor":
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        custom = _OptRematPartitionFn(pfn)
        # the caches key on the partitioner's uuid(); a partition_fn without one must not be cached
        caches = {} if isinstance(pfn, Partitioner) else {"fx_graph_cache": False}
        autograd_caches = {} if isinstance(pfn, Partitioner) else {"enable_autograd_cache": False}

        def inductor_backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            with inductor_config.patch(custom_partitioner_fn=custom, **caches), \
                    functorch_config.patch(**autograd_caches), _roles_of(pfn, gm), catchable():
                return compile_fx(gm, example_inputs)

        inductor_backend.partitioner = pfn  # type: ignore[attr-defined]
        return inductor_backend
    if compiler == "eager" or callable(compiler):
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        # boxed calls let the graphs free saved values after their last use, as inductor does
        graph_compiler = boxed_nop if compiler == "eager" else compiler
        eager = aot_autograd(fw_compiler=graph_compiler, bw_compiler=graph_compiler, partition_fn=pfn,
                             decompositions=_decompositions(decompositions), keep_inference_input_mutations=True)

        def eager_backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            with _roles_of(pfn, gm), catchable():
                return eager(gm, example_inputs)

        eager_backend.partitioner = pfn  # type: ignore[attr-defined]
        return eager_backend
    raise ValueError(f"compiler must be 'inductor', 'eager' or a graph compiler, got {compiler!r}")


@contextlib.contextmanager
def _roles_of(pfn: Any, gm: fx.GraphModule) -> Iterator[None]:
    """Tell the partitioner what each input of the graph being compiled is (parameter, buffer, user
    input), so plans can be matched by canonical ids; AOTAutograd keeps the inputs' order."""
    if not isinstance(pfn, Partitioner):
        yield
        return
    pfn.input_roles = input_roles(gm)
    try:
        yield
    finally:
        pfn.input_roles = None


class _OptRematPartitionFn(CustomPartitionerFn):
    """opt-remat as inductor's ``custom_partitioner_fn`` (module level, so it pickles)."""

    def __init__(self, partition_fn: Partitioner) -> None:
        self.partition_fn = partition_fn

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kw: Any
                 ) -> tuple[fx.GraphModule, fx.GraphModule]:
        kw.pop("compiler", None)
        return self.partition_fn(gm, joint_inputs, **kw)

    def uuid(self) -> str | None:
        uuid = getattr(self.partition_fn, "uuid", None)
        return uuid() if callable(uuid) else None  # None: backend() turns the caches off
