"""The rematerialization problem and its plans: a torch-free data model plus a checker.

A problem is a DAG of values in topological order. Every value is one of:

* ``input``    – a graph input (primal, RNG seed); never recomputed, saving it is free by default
                 (its memory is owned by the caller) unless ``count_input_bytes`` is set;
* ``forward``  – computed in the forward pass; in the backward it is available only if it was
                 saved, or recomputed (paying ``cost``) from values that are available;
* ``either``   – depends only on inputs and is needed only by the backward, so it can run in either
                 pass: computing it in the backward costs nothing extra (it has to run once anyway);
* ``backward`` – depends on the tangents: always computed in the backward, never a decision.

The backward *reads* every non-backward input of a backward value, plus ``required`` (values the
backward returns directly). A plan is the set of saved values and the set recomputed in the
backward; it is valid when everything read is saved or recomputed, every recomputed value's inputs
are too, banned values are never recomputed and ``must_recompute`` / unsaveable values never saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, cast

from .errors import PlanError, ProblemError

T = TypeVar("T")


class Role(str, Enum):
    INPUT = "input"
    FORWARD = "forward"
    EITHER = "either"
    BACKWARD = "backward"


class Status(str, Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    TIME_LIMIT = "time-limit"
    INFEASIBLE = "infeasible"
    HEURISTIC = "heuristic"  # a plan from a method that proves nothing about optimality


@dataclass(frozen=True)
class Node:
    name: str
    role: Role
    inputs: tuple[str, ...] = ()
    bytes: int = 0
    storage: str | None = None  # values that alias (views) share a storage id; None: its own
    cost: float = 0.0  # seconds to recompute this value once
    banned: bool = False  # must never be recomputed (random, side effects, MUST_SAVE tags, ...)
    must_recompute: bool = False  # must never be saved (MUST_RECOMPUTE tags)
    saveable: bool = True  # False for values that cannot be saved (tuples, SymFloats)
    allocated_by: str | None = None  # a multi-output op whose call creates this value's memory
    op: str = ""  # a label for reports, e.g. "aten.mm"
    # the module path that made it (``model.layers.3.mlp``; a backward value: its forward value's),
    # for reports and for finding repeated blocks (``solvers.blocks``); "" when unknown
    module: str = ""
    # why this value cannot be offloaded to host memory ("" if it can, when saved): torch's pass
    # refuses views, getitems, non-contiguous tensors and outputs (``opt_remat.offload``)
    offload_ban: str = ""

    @property
    def storage_id(self) -> str:
        return self.storage if self.storage is not None else self.name


@dataclass(frozen=True)
class Parameter:
    """A trained parameter the step reads: a graph input (``node``), for the rank's memory
    (``solvers.rank_memory``): its size, where it lives in the model and its gradient's value."""
    node: str  # the input value
    path: str  # its name in the model: ``model.layers.0.mlp.up_proj.weight``
    numel: int
    dim0: int  # its first dimension (FSDP shards along it, padded to a multiple of the ranks)
    grad: str | None = None  # the backward output that is its gradient, if any


@dataclass(frozen=True)
class Problem:
    nodes: tuple[Node, ...]
    required: frozenset[str] = frozenset()  # values the backward returns or reads besides its inputs
    storage_bytes: Mapping[str, int] = field(default_factory=dict)  # missing: max member bytes
    count_input_bytes: bool = False
    name: str = "problem"
    # for the liveness model: forward values returned to the caller (alive to the end of the
    # forward) and backward values returned as gradients (alive to the end of the step)
    forward_outputs: frozenset[str] = frozenset()
    backward_outputs: frozenset[str] = frozenset()
    # module path -> its class ("pkg.mod.LlamaDecoderLayer"), for every module a node's path runs
    # through: repeated blocks are indexed modules of one class (``solvers.blocks``)
    module_classes: Mapping[str, str] = field(default_factory=dict)
    # the trained parameters among the inputs (empty when unknown: a published graph file)
    parameters: tuple[Parameter, ...] = ()
    # banned value -> why it may not be recomputed ("random op", "custom op ... tagged ..."), for reports
    ban_reasons: Mapping[str, str] = field(default_factory=dict)
    # what other modules derive from the problem, kept with it (``derived``); not an init field, so
    # ``with_nodes`` and ``dataclasses.replace`` start the new problem with none
    _derived: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise ProblemError(f"node {node.name!r} appears twice")
            for inp in node.inputs:
                if inp not in seen:
                    raise ProblemError(
                        f"node {node.name!r} reads {inp!r}, which is not an earlier node "
                        "(nodes must be listed in topological order, with no cycles)"
                    )
            seen.add(node.name)
        for kind, names in (("required", self.required), ("forward output", self.forward_outputs),
                            ("backward output", self.backward_outputs)):
            for name in names:
                if name not in seen:
                    raise ProblemError(f"{kind} value {name!r} is not a node")
        for param in self.parameters:
            for value in (param.node, param.grad):
                if value is not None and value not in seen:
                    raise ProblemError(f"parameter {param.path!r}: value {value!r} is not a node")
        by_name = {n.name: n for n in self.nodes}
        for node in self.nodes:
            if node.role is not Role.BACKWARD:
                for inp in node.inputs:
                    if by_name[inp].role is Role.BACKWARD:
                        raise ProblemError(
                            f"{node.role.value} node {node.name!r} reads backward node {inp!r}"
                        )
            if node.role is Role.INPUT and node.inputs:
                raise ProblemError(f"input node {node.name!r} has inputs {node.inputs}")

    # ---- derived structure -------------------------------------------------------------------
    def derived(self, key: str, make: Callable[["Problem"], T]) -> T:
        """``make(self)``, computed on the first call with ``key`` and kept with this problem object
        (a problem is immutable, so what is derived from it stays true): the simulator, the
        repeated blocks, a solver's budget-free work. ``key``: the maker's module and name
        (``"liveness.simulator"``), so that two modules never share one."""
        try:
            return cast(T, self._derived[key])
        except KeyError:
            value = self._derived[key] = make(self)
            return value

    @cached_property
    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def users(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n.name)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def candidates(self) -> tuple[Node, ...]:
        """Values that a plan decides about (everything but backward values)."""
        return tuple(n for n in self.nodes if n.role is not Role.BACKWARD)

    @cached_property
    def backward_reads(self) -> frozenset[str]:
        reads = set(self.required)
        for n in self.nodes:
            if n.role is Role.BACKWARD:
                reads.update(i for i in n.inputs if self.by_name[i].role is not Role.BACKWARD)
        return frozenset(reads)

    @cached_property
    def input_storages(self) -> frozenset[str]:
        return frozenset(n.storage_id for n in self.nodes if n.role is Role.INPUT)

    @cached_property
    def storage_size(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for n in self.nodes:
            sizes[n.storage_id] = max(sizes.get(n.storage_id, 0), n.bytes)
        for k, v in self.storage_bytes.items():
            if k in sizes:
                sizes[k] = int(v)
        return sizes

    def recompute_cost_of(self, name: str) -> float:
        """What recomputing ``name`` in the backward adds: nothing for values that run there anyway."""
        node = self.by_name[name]
        return node.cost if node.role is Role.FORWARD else 0.0

    def can_recompute(self, name: str) -> bool:
        node = self.by_name[name]
        return node.role in (Role.FORWARD, Role.EITHER) and not node.banned

    def can_save(self, name: str) -> bool:
        node = self.by_name[name]
        return node.role is not Role.BACKWARD and node.saveable and not node.must_recompute

    def counts_memory(self, storage: str) -> bool:
        return self.count_input_bytes or storage not in self.input_storages

    def save_weight(self, name: str) -> float:
        """Bytes charged for saving ``name`` alone: its whole storage; inputs free unless counted.

        Summed over a saved set this never underestimates ``saved_bytes`` (shared storages are
        charged once per saved member), which is what the min-cut minimizes.
        """
        node = self.by_name[name]
        if not self.can_save(name):
            return math.inf
        if not self.counts_memory(node.storage_id):
            return 0.0
        return float(self.storage_size[node.storage_id])

    def saved_bytes(self, saved: Iterable[str]) -> int:
        """Bytes of saved activations: each storage once, graph inputs free unless counted."""
        storages = {self.by_name[s].storage_id for s in saved}
        return sum(self.storage_size[g] for g in storages if self.counts_memory(g))

    def recompute_cost(self, recomputed: Iterable[str]) -> float:
        # fsum: exact, so the total does not depend on set order (string hashing differs per process)
        return math.fsum(self.recompute_cost_of(r) for r in recomputed)

    def with_nodes(self, nodes: Sequence[Node]) -> "Problem":
        return replace(self, nodes=tuple(nodes))


@dataclass(frozen=True)
class Plan:
    saved: frozenset[str]
    recomputed: frozenset[str]
    saved_bytes: int
    recompute_cost: float
    solver: str
    status: Status
    solve_time_s: float = 0.0
    objective: float | None = None  # what the solver minimized (its own units)
    bound: float | None = None  # a proven lower bound on that objective, when the solver has one
    message: str = ""
    budget: int | None = None  # the saved-bytes budget the plan was made for, if any
    extra: Mapping[str, object] = field(default_factory=dict)
    offloaded: frozenset[str] = frozenset()  # saved values sent to host memory (``solvers.offload``)

    @property
    def gap(self) -> float | None:
        """Relative optimality gap (objective - bound) / max(|objective|, tiny); None if unknown."""
        if self.objective is None or self.bound is None:
            return None
        if self.objective - self.bound <= 1e-12 * max(1.0, abs(self.objective)):
            return 0.0
        return (self.objective - self.bound) / max(abs(self.objective), 1e-12)


def recompute_closure(problem: Problem, saved: Iterable[str], *,
                      ignore_bans: bool = False) -> tuple[frozenset[str], list[str]]:
    """The values the backward must recompute given ``saved``, and what makes that impossible.

    Walks back from what the backward reads through values that are not saved. Returns the
    recomputed set and a list of error strings (empty when the saved set is sufficient).
    ``ignore_bans`` walks through banned values too (to read back another partitioner's plan that
    recomputes them); graph inputs stay errors.
    """
    saved_set = frozenset(saved)
    errors: list[str] = []
    recomputed: set[str] = set()
    stack = [r for r in problem.backward_reads if r not in saved_set]
    while stack:
        name = stack.pop()
        if name in recomputed:
            continue
        node = problem.by_name[name]
        if not problem.can_recompute(name) and not (ignore_bans and node.role is not Role.INPUT):
            why = "a graph input" if node.role is Role.INPUT else "banned from recomputation"
            errors.append(f"{name!r} is needed in the backward but is neither saved nor recomputable ({why})")
            continue
        recomputed.add(name)
        stack.extend(i for i in node.inputs if i not in saved_set and i not in recomputed)
    return frozenset(recomputed), errors


def plan_from_saved(
    problem: Problem,
    saved: Iterable[str],
    *,
    solver: str,
    status: Status,
    solve_time_s: float = 0.0,
    objective: float | None = None,
    bound: float | None = None,
    message: str = "",
    budget: int | None = None,
    extra: Mapping[str, object] | None = None,
) -> Plan:
    """Complete a saved set into a plan: keep only saved values the backward uses, derive the rest.

    Raises PlanError if the saved set leaves something the backward needs uncomputable.
    """
    saved_set = frozenset(saved)
    recomputed, errors = recompute_closure(problem, saved_set)
    if errors:
        raise PlanError(f"{solver}: invalid plan: " + "; ".join(sorted(errors)[:5]))
    used = set(problem.backward_reads)
    for r in recomputed:
        used.update(problem.by_name[r].inputs)
    kept = frozenset(s for s in saved_set if s in used)
    return Plan(
        saved=kept,
        recomputed=recomputed,
        saved_bytes=problem.saved_bytes(kept),
        recompute_cost=problem.recompute_cost(recomputed),
        solver=solver,
        status=status,
        solve_time_s=solve_time_s,
        objective=objective,
        bound=bound,
        message=message,
        budget=budget,
        extra=dict(extra or {}),
    )


@dataclass(frozen=True)
class CheckResult:
    valid: bool
    errors: tuple[str, ...]
    saved_bytes: int
    recompute_cost: float


def check_plan(problem: Problem, plan: Plan, *, budget: int | None = None) -> CheckResult:
    """Independently verify a plan: validity, and its true saved bytes and recompute cost."""
    errors: list[str] = []
    by_name = problem.by_name
    for name in plan.saved | plan.recomputed:
        if name not in by_name:
            errors.append(f"{name!r} is not a node")
    if errors:
        return CheckResult(False, tuple(errors), 0, math.inf)
    for s in plan.saved:
        if not problem.can_save(s):
            errors.append(f"{s!r} is saved but cannot be saved")
    for r in plan.recomputed:
        if not problem.can_recompute(r):
            errors.append(f"{r!r} is recomputed but must not be")
        for i in by_name[r].inputs:
            if i not in plan.saved and i not in plan.recomputed:
                errors.append(f"recomputing {r!r} needs {i!r}, which is neither saved nor recomputed")
    for need in problem.backward_reads:
        if need not in plan.saved and need not in plan.recomputed:
            errors.append(f"the backward reads {need!r}, which is neither saved nor recomputed")
    saved_bytes = problem.saved_bytes(plan.saved)
    cost = problem.recompute_cost(plan.recomputed)
    if saved_bytes != plan.saved_bytes:
        errors.append(f"plan reports {plan.saved_bytes} saved bytes, the checker counts {saved_bytes}")
    if not math.isclose(cost, plan.recompute_cost, rel_tol=1e-9, abs_tol=1e-12):
        errors.append(f"plan reports recompute cost {plan.recompute_cost}, the checker counts {cost}")
    if budget is not None and saved_bytes > budget:
        errors.append(f"saved bytes {saved_bytes} exceed the budget {budget}")
    return CheckResult(not errors, tuple(errors), saved_bytes, cost)
