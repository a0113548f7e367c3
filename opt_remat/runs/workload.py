"""The workload of a run, made once: the model built from its factory, its inputs, the training step
captured by torch.compile's own path (Dynamo, then AOTAutograd with the configured decompositions)
and the problem built from its joint graph. The graph solved here is the graph
``opt_remat.backend(plan=...)`` later sees, so the plans written from it apply in training.
A published graph file (``model: {graph: PATH}``) is a workload without a torch model.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from solvers import Problem

from ..formats.plan_file import graph_hash, values_of_problem
from .. import road
from ..request import SolveRequest
from ..solve import resolve_budget
from .config import FLOAT_DTYPES, BudgetSpec, Config
from .config_rules import graph_request
from .util import first_line, quiet_torch


@dataclass
class Workload:
    """What one run solves: the problem, and for torch models the prepared graph
    (``opt_remat.road.PreparedGraph``) to lower and verify plans on; ``request`` holds the run's
    graph-level settings (device, costs, rng_replay, count_input_bytes), which each pair's request
    extends with its budget, solver and options (``runs.execute.pair_request``)."""
    problem: Problem
    graph_hash: str
    profile: Any
    request: SolveRequest
    model: Any = None  # torch.nn.Module
    inputs: tuple = ()
    loss_fn: Callable[[Any], Any] | None = None
    prepared: Any = None  # opt_remat.road.PreparedGraph (None for a graph file)
    top_anchor_bytes: int | None = None
    capture_s: float = 0.0
    reference: Any = None  # the save-all training step, computed on first use
    values: list[dict[str, Any]] = field(default_factory=list)  # canonical values (plan files)
    graph_id: str = ""  # canonical id of the graph: what a plan file is matched by
    notes: list[str] = field(default_factory=list)

    @property
    def must_save(self) -> frozenset[str]:
        """The MUST_SAVE values solves are steered by (``opt_remat.road.steered``)."""
        return frozenset() if self.prepared is None else self.prepared.must_save

    @property
    def must_offload(self) -> frozenset[str]:
        """The values the graph asks to offload whatever the plan (``opt_remat.road.PreparedGraph``)."""
        return frozenset() if self.prepared is None else self.prepared.must_offload

    def budget_bytes(self, spec: BudgetSpec) -> int | None:
        """The saved bytes the budget allows on this graph, as the API resolves it."""
        if self.prepared is None:
            return resolve_budget(self.problem, spec.saved_raw)
        return road.budget_bytes(self.prepared, self.request, spec.saved_raw)


def make_loss(kind: str) -> Callable[[Any], Any]:
    import torch

    def loss(out: Any) -> Any:
        leaves = [o for o in torch.utils._pytree.tree_leaves(out)
                  if isinstance(o, torch.Tensor) and o.is_floating_point()]
        if not leaves:
            raise ValueError("the model returns no floating-point tensor to take a loss of")
        return sum((o.float().sum() if kind == "sum" else o.float().mean()) for o in leaves)

    loss.__name__ = f"loss_{kind}"
    return loss


def make_inputs(cfg: Config, model: Any) -> tuple:
    import torch
    from .. import models

    specs = cfg.spec.model.inputs  # type: ignore[union-attr]
    gen = torch.Generator().manual_seed(cfg.seed)
    if specs is None:
        torch.manual_seed(cfg.seed)
        name = cfg.spec.model.factory.partition(":")[2]  # type: ignore[union-attr]
        try:
            inputs = models.example_inputs(name, model)
        except ValueError as exc:
            raise cfg.error(("model",), f"missing key 'inputs' ({exc})") from None
        return tuple(i.to(getattr(torch, cfg.dtype)) if i.is_floating_point() else i for i in inputs)
    out = []
    for spec in specs:
        dtype_name = spec.dtype or cfg.dtype
        dtype = getattr(torch, dtype_name)
        shape = tuple(spec.shape)
        low, high = spec.low, spec.high
        if dtype_name in FLOAT_DTYPES:
            if low is not None or high is not None:
                lo, hi = float(low if low is not None else 0.0), float(high if high is not None else 1.0)
                t = torch.rand(shape, generator=gen) * (hi - lo) + lo
            else:
                t = torch.randn(shape, generator=gen)
            out.append(t.to(dtype))
        elif dtype_name == "bool":
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            assert high is not None  # an int input needs high (config_rules)
            out.append(torch.randint(int(low or 0), int(high), shape, generator=gen, dtype=dtype))
    return tuple(out)


def materialize(cfg: Config) -> Workload:
    """The one graph of the configured step (``opt-remat run`` solves a single graph)."""
    if not cfg.is_graph and cfg.spec.capture.per_layer is not None:
        raise cfg.error(("capture", "per_layer"), "opt-remat run solves one graph; a step captured per layer is "
                                                  "planned by opt-remat solve")
    works = materialize_all(cfg)
    if len(works) != 1:
        raise cfg.error(("model", "factory"), f"the training step compiled to {len(works)} joint graphs "
                                              "(graph breaks); opt-remat run needs exactly one (opt-remat "
                                              "solve writes a plan per graph)")
    return works[0]


def materialize_all(cfg: Config) -> list[Workload]:
    """Build the model and inputs, check they fit, capture the training step (one graph per compiled
    region) and build each problem. Every failure that the configuration can fix is a ConfigError
    naming the field."""
    request = graph_request(cfg)
    profile = request.profile
    if cfg.is_graph:
        import importlib
        checkmate = importlib.import_module("opt_remat.formats.checkmate_graph")
        try:
            problem = checkmate.load_graph(cfg.graph_path)
        except Exception as exc:
            raise cfg.error(("model", "graph"), f"cannot load the graph: {first_line(exc)}") from None
        return [Workload(problem, graph_hash(problem), profile, request, values=values_of_problem(problem),
                         graph_id=graph_hash(problem))]

    import torch

    from ..capture import capture_graphs

    loss_fn = make_loss(cfg.spec.model.loss)  # type: ignore[union-attr]
    dtype = getattr(torch, cfg.dtype)
    model, inputs, source = model_and_inputs(cfg)
    if cfg.meta:
        what, where = "tracing the training step with fake tensors", ("model", "inputs")
    else:
        _dry_run(cfg, model, inputs, loss_fn)
        what, where = "capturing the training step with torch.compile", ("model", "factory")
    start = time.perf_counter()
    with quiet_torch():
        try:
            graphs = capture_graphs(source, inputs, compiler=cfg.compiler, decompositions=cfg.decompositions,
                                    meta=cfg.meta, dtype=dtype if cfg.meta else None, seed=cfg.seed)
        except Exception as exc:
            raise cfg.error(where, f"{what} failed{' (do the inputs fit the model?)' if cfg.meta else ''}: "
                                   f"{first_line(exc)}") from None
        if not graphs:
            raise cfg.error(("model", "factory"), "torch.compile produced no joint graph: nothing of the "
                                                  "step needs a backward")
        works = []
        for joint in graphs:
            prepared = prepare_captured(joint, request)
            if not prepared.has_backward:
                raise cfg.error(("model", "factory"), "a compiled region of the step has no backward to partition")
            values, gid = prepared.canonical()
            works.append(Workload(prepared.problem, graph_hash(prepared.problem), profile, request, model=model,
                                  inputs=inputs, loss_fn=loss_fn, prepared=prepared,
                                  top_anchor_bytes=prepared.top_anchor(), values=values, graph_id=gid))
    capture_s = time.perf_counter() - start
    for w in works:
        w.capture_s = capture_s
    return works


def model_and_inputs(cfg: Config) -> tuple[Any, tuple, Any]:
    """The configured model (None with fake tensors), its inputs, and what a capture takes: the
    model, or with fake tensors a factory it calls under them. Failures the configuration can fix
    are ConfigErrors naming the field."""
    import torch

    factory = cfg.factory()
    kwargs = dict(cfg.spec.model.kwargs)  # type: ignore[union-attr]
    torch.manual_seed(cfg.seed)
    if cfg.meta:
        with torch.device("meta"):  # for the built-in inputs' sizes only: allocates nothing
            shell = _build_model(cfg, factory, kwargs)
        return None, make_inputs(cfg, shell), lambda: factory(**kwargs).train()
    model = _build_model(cfg, factory, kwargs).to(getattr(torch, cfg.dtype)).train()
    return model, make_inputs(cfg, model), model


def _dry_run(cfg: Config, model: Any, inputs: tuple, loss_fn: Callable[[Any], Any]) -> None:
    """Do the inputs fit the model, and is there a backward? A ConfigError naming the field if not."""
    import torch

    with quiet_torch():
        try:
            with torch.no_grad():
                out = copy.deepcopy(model)(*inputs)
        except Exception as exc:
            shapes = ", ".join(f"{list(i.shape)} {str(i.dtype).replace('torch.', '')}" for i in inputs)
            raise cfg.error(("model", "inputs"), f"inputs ({shapes}) do not fit the model: "
                                                 f"{first_line(exc)}") from None
        try:
            loss_fn(out)
        except Exception as exc:
            raise cfg.error(("model", "loss"), f"cannot take the loss of the model's output: {exc}") from None
    if not any(p.requires_grad for p in model.parameters()) and not any(
            i.requires_grad for i in inputs if isinstance(i, torch.Tensor)):
        raise cfg.error(("model", "factory"), "the model has no parameters that require grad: "
                                              "there is no backward to partition")


def _build_model(cfg: Config, factory: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """The factory's module, or a ConfigError naming the field to fix."""
    import torch

    try:
        model = factory(**kwargs)
    except TypeError as exc:
        raise cfg.error(("model", "kwargs"), f"the factory does not take these arguments ({exc})") from None
    except Exception as exc:
        raise cfg.error(("model", "kwargs"), f"the factory failed: {first_line(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise cfg.error(("model", "factory"), f"expected a factory returning a torch.nn.Module, got "
                                              f"{type(model).__name__}")
    return model


def prepare_captured(joint: Any, request: SolveRequest) -> Any:
    """A captured ``JointGraph`` prepared on a copy (the capture stays as it was), its problem
    built: ``opt_remat.road.prepare``."""
    graph = joint.copy()
    return road.prepare(graph.module, graph.num_fwd_outputs, graph.static_lifetime_input_indices, request,
                        input_roles=graph.input_roles)
