"""The public entry points: a drop-in ``partition_fn`` and a ``torch.compile`` backend."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch.fx as fx
from torch._functorch import partitioners as tp
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from solvers import Plan, Problem
from solvers.budget import format_bytes
from solvers.offload import host_bytes
from solvers.rank_memory import RankPeak, rank_peak
from solvers.training import TrainingSetup

from . import road
from .canonical import input_roles
from .compile_setup import aot_graphs, inductor_compile
from .costs import DeviceProfile
from .errors import catchable
from .plans import versions
from .report import format_seconds
from .request import auto_lam, make_request

__all__ = ["PartitionRecord", "Partitioner", "auto_lam", "backend", "code_fingerprint", "gc_paused", "partitioner"]

log = logging.getLogger("opt_remat")


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
    # with a device budget or a training set-up: the set-up the rank's memory is counted under,
    # and the device's bytes
    setup: TrainingSetup | None = None
    device_memory: int | None = None

    @functools.cached_property
    def device_peak(self) -> RankPeak | None:
        """The rank's peak under the plan, by kind (simulated on first use: a partition does not
        need it)."""
        return None if self.setup is None else rank_peak(self.problem, self.plan.saved, self.setup)

    def __repr__(self) -> str:
        plan = self.plan
        budget = "" if self.budget_bytes is None else f" (budget {format_bytes(self.budget_bytes)})"
        gap = "" if plan.gap is None else f", gap {plan.gap:.2%}"
        device = ""
        if self.device_peak is not None and self.device_memory is not None:
            device = (f"; device peak {format_bytes(self.device_peak.total)} of "
                      f"{format_bytes(self.device_memory)} ({_top_kinds(self.device_peak)})")
        return (f"PartitionRecord({plan.solver}, {plan.status.value}{gap}: saves {len(plan.saved)} values, "
                f"{format_bytes(plan.saved_bytes)}{budget}; recomputes {len(plan.recomputed)}, "
                f"{format_seconds(plan.recompute_cost)}{device}{_offload_repr(self.problem, plan)}; "
                f"{len(self.problem.nodes)} nodes; "
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


def _top_kinds(peak: RankPeak, count: int = 3) -> str:
    """The largest kinds at a peak, e.g. ``activations 40.00 GiB, optimizer state 9.10 GiB, ...``."""
    kinds = sorted(((v, k.value) for k, v in peak.by_kind.items() if v), reverse=True)
    more = ", ..." if len(kinds) > count else ""
    return ", ".join(f"{name} {format_bytes(v)}" for v, name in kinds[:count]) + more


def _offload_repr(problem: Problem, plan: Plan) -> str:
    """``; offloads N values, BYTES (exposed transfer T, added step time T)`` ("" without offload)."""
    if not plan.offloaded:
        return ""
    chosen: Any = (plan.extra or {}).get("offload") or {}
    times = (f" (exposed transfer {format_seconds(chosen['exposed_s'])}, added step time "
             f"{format_seconds(chosen['added_s'])})" if "added_s" in chosen else "")
    return f"; offloads {len(plan.offloaded)} values, {format_bytes(host_bytes(problem, plan.offloaded))}{times}"


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
    solver: str | None = None  # None: the default path (min-cut; under a budget HiGHS from min-cut starts)
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
    # offload one of the planner's choices; a mapping (host_memory, min_bytes) means True with those
    offload: bool | Mapping[str, Any] = False
    device_memory: int | str | None = None  # bytes of the device: a budget of the rank's whole memory
    training: Mapping[str, Any] | TrainingSetup | None = None  # how the step is trained (solvers.training)
    history: list[PartitionRecord] = field(default_factory=list)
    # set by ``backend()`` while it compiles: the dynamo graph's input roles, and its settings
    input_roles: list[str] | None = None
    settings: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # checked here, once, as a run config's pairs are (opt_remat.request)
        self.request = make_request(self.solver, self.budget, peak_budget=self.peak_budget,
                                    count_gradients=self.count_gradients, options=self.options,
                                    device=self.device, costs=self.costs, rng_replay=self.rng_replay,
                                    count_input_bytes=self.count_input_bytes, plan=self.plan,
                                    offload=self.offload, device_memory=self.device_memory,
                                    training=self.training)
        self.profile = self.request.profile
        self._noted_override = False  # the explicit-budget note is given once per partitioner

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
            "offload": self.offload, "device_memory": self.request.device_memory,
            "training": self.request.training,
            "code": code_fingerprint(),
        }
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=repr).encode()).hexdigest()

    def __call__(self, joint_module: fx.GraphModule, joint_inputs: Any, *args: Any,
                 num_fwd_outputs: int, static_lifetime_input_indices: list[int] | None = None,
                 **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        with gc_paused():
            return self._partition(joint_module, joint_inputs, num_fwd_outputs, static_lifetime_input_indices)

    def _partition(self, joint_module: fx.GraphModule, joint_inputs: Any, num_fwd_outputs: int,
                   static_lifetime_input_indices: list[int] | None) -> tuple[fx.GraphModule, fx.GraphModule]:
        start = time.perf_counter()
        prepared = road.prepare(joint_module, num_fwd_outputs, static_lifetime_input_indices, self.request,
                                input_roles=self.input_roles)
        if not prepared.has_backward:  # nothing to partition: torch's save-all does it
            return tp.default_partition(prepared.module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                        static_lifetime_input_indices=static_lifetime_input_indices)
        requested, note = road.budget_in_force(prepared, self.request)
        if note and not self._noted_override:
            self._noted_override = True
            log.warning(note)
        solved = road.plan_for(prepared, self.request, requested, settings=self.settings, verbose=self.verbose)
        fw_module, bw_module = road.lower(prepared, solved.plan, self.request, joint_inputs)
        self.history.append(PartitionRecord(prepared.problem, solved.plan, solved.budget_bytes, fw_module,
                                            bw_module, num_fwd_outputs, time.perf_counter() - start,
                                            prepared.canonical_later(), self.request.rank_setup,
                                            self.request.device_memory))
        return fw_module, bw_module


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """opt-remat's version and a hash of the sources of ``opt_remat`` and ``solvers``."""
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
                offload: bool | Mapping[str, Any] = False, device_memory: int | str | None = None,
                training: Mapping[str, Any] | TrainingSetup | None = None, **options: Any) -> Partitioner:
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
    ``enable_activation_offloading``; ``offload=True`` makes offload one of the planner's choices:
    under a peak budget it weighs keeping, offloading (PREFER_CPU_OFFLOAD values included) and
    recomputing each value for the least added step time (``solvers.offload_plan``); without one,
    PREFER_CPU_OFFLOAD values are offloaded. ``offload={"host_memory": "64GiB", "min_bytes":
    "1MiB"}``: the same with a host-memory cap and the smallest value offloaded.
    ``device_memory="80GiB"``: a budget of the device's memory, counting what the rank holds besides
    the graph as ``training`` says (a dict: dtypes, optimizer, sharding, ranks; ``solvers.training``;
    without it one device, fp32 parameters and gradients, no optimizer); refused with the breakdown
    and what would fit (``DeviceBudgetError``) where the states alone leave no room.
    Which solvers exist, the budgets each meets and the options each takes: ``solvers.catalog``;
    an option the solver does not take (under the budgets given) is an error naming those it does.
    """
    return Partitioner(solver=solver, budget=budget, device=device, options=options,
                       count_input_bytes=count_input_bytes, plan=plan, peak_budget=peak_budget,
                       count_gradients=count_gradients, rng_replay=rng_replay, costs=costs,
                       verbose=verbose, offload=offload, device_memory=device_memory, training=training)


def backend(solver: str | None = None, budget: int | float | str | None = None, *,
            compiler: str | Callable[..., Any] = "inductor", decompositions: str | Mapping | None = None,
            partition_fn: Partitioner | None = None, **options: Any) -> Callable[..., Any]:
    """A ``torch.compile`` backend that partitions with opt-remat.

    ``compiler="inductor"`` (default) runs inductor with opt-remat as its partitioner;
    ``compiler="eager"`` runs the partitioned FX graphs as they are (with ``decompositions``,
    "inductor" or none); a callable is used as AOTAutograd's forward and backward compiler. The
    partitioner is reachable as ``backend_fn.partitioner``.
    """
    pfn = partition_fn or partitioner(solver, budget, **options)
    if isinstance(pfn, Partitioner):
        pfn.settings = {"compiler": compiler if isinstance(compiler, str) else "custom",
                        "decompositions": "inductor" if compiler == "inductor" else decompositions}
    if compiler == "inductor":
        custom = _OptRematPartitionFn(pfn)

        def inductor_backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            with _roles_of(pfn, gm), catchable():
                # the caches key on the partitioner's uuid(); a partition_fn without one is not cached
                return inductor_compile(gm, example_inputs, custom, cache=isinstance(pfn, Partitioner))

        inductor_backend.partitioner = pfn  # type: ignore[attr-defined]
        return inductor_backend
    if compiler == "eager" or callable(compiler):
        eager = (aot_graphs(pfn, decompositions) if isinstance(compiler, str)
                 else aot_graphs(pfn, decompositions, compiler))

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

    def __reduce__(self) -> tuple[Any, tuple[str | None]]:
        # inductor pickles its whole config into its FX graph cache key, this object included: by
        # its uuid only, or the partitioner's history (every problem and plan so far) would make the
        # key depend on what was compiled before, cost a pickle of it per graph, and, nested deep,
        # fail inside pickle's fast mode (KeyError on an object id)
        return (_pickled_partitioner, (self.uuid(),))


class _PartitionerKey:
    """What an unpickled ``_OptRematPartitionFn`` partitions with: only its key (pickles are for
    inductor's cache keys; partitioning happens in the process that compiles)."""

    def __init__(self, uuid: str | None) -> None:
        self.key = uuid

    def uuid(self) -> str | None:
        return self.key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this opt-remat partitioner was unpickled from a cache key and holds no settings: "
                           "partition in the process that called opt_remat.backend()")


def _pickled_partitioner(uuid: str | None) -> _OptRematPartitionFn:
    return _OptRematPartitionFn(_PartitionerKey(uuid))  # type: ignore[arg-type]
