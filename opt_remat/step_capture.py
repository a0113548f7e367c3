"""Capture a training step as the parts per-layer compile runs, and build the step of them
(``solvers.step``): the root's part before the layers, the layer graph once per layer, the root's
part after them.

Per-layer compile (torchtitan's, and what FSDP2 users write): each module of a module list
(``model.layers``) is compiled on its own, ``torch.compile(layer, backend=...)``, the rest runs
eagerly. Each layer compiles to one joint graph, its parameters graph inputs, so the layers of one
class and shape give graphs with one canonical id: one plan, counted once per layer. The root's
parts are read off the step captured as one graph (``solvers.step_parts.root_parts``) and keep
eager's plan (every forward value their backward reads saved: what autograd saves).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from solvers.step import Step, StepGraph
from solvers.step_parts import eager_saved, root_parts

from . import road
from .capture import JointGraph, built_module, capture_graphs, recording_backend
from .errors import CaptureError
from .request import SolveRequest

BEFORE, AFTER = "root:before", "root:after"  # the root's parts' keys (plan-file ids)


@dataclass
class StepCapture:
    whole: JointGraph  # the step as one graph: the root's parts are read off it
    layers: list[JointGraph]  # one per compiled layer call, in call order
    count: int  # the modules in the list: the layers the step runs
    path: str


def capture_step(model: torch.nn.Module | Callable[[], torch.nn.Module], example_inputs: Sequence[Any], *,
                 per_layer: str, compiler: str = "eager", decompositions: Any = "inductor", meta: bool = False,
                 dtype: torch.dtype | None = None, seed: int = 0) -> StepCapture:
    """Each module of the list at ``per_layer`` compiled on its own as training compiles it
    (``torch.compile(layer, backend=opt_remat.backend(...))``), the rest eager; and the step as
    one graph. Arguments as ``capture.capture_graphs`` takes them."""
    seen, be = recording_backend(compiler, decompositions)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if meta else None
    torch._dynamo.reset()
    try:
        module = built_module(model, fake_mode, dtype)
        if module is model:
            module = copy.deepcopy(module)  # the compiled layers stay off the caller's model
        layers = _layer_list(module, per_layer)
        for layer in layers:
            layer.compile(backend=be)
        # layers that recompile per layer (a guard on Hugging Face's KV-cache slot) each compile
        # here; training needs the same limit (``recompile_limit_hint``)
        limit = max(torch._dynamo.config.recompile_limit, len(layers))
        with torch._dynamo.config.patch(recompile_limit=limit), \
                fake_mode if fake_mode is not None else contextlib.nullcontext():
            inputs = list(example_inputs)
            if fake_mode is not None:
                inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]
            torch.manual_seed(seed)
            module(*inputs)
    finally:
        torch._dynamo.reset()
    whole = capture_graphs(model, example_inputs, compiler=compiler, decompositions=decompositions, meta=meta,
                           dtype=dtype, seed=seed)
    if len(whole) != 1:
        raise CaptureError(f"capture.per_layer needs the step to compile to one graph without it (to read the "
                           f"root's parts off), got {len(whole)} (graph breaks)")
    if not seen:
        raise CaptureError(f"capture.per_layer {per_layer!r}: compiling its modules gave no joint graph (does "
                           "the step call them with inputs that need gradients?)")
    return StepCapture(whole[0], seen, len(layers), per_layer)


def _layer_list(module: torch.nn.Module, path: str) -> list[torch.nn.Module]:
    try:
        found = module.get_submodule(path)
    except AttributeError:
        lists = [name for name, m in module.named_modules() if isinstance(m, torch.nn.ModuleList)]
        raise CaptureError(f"capture.per_layer: the model has no module {path!r}; its module lists: "
                           f"{', '.join(lists[:6]) or 'none'}") from None
    if not isinstance(found, (torch.nn.ModuleList, torch.nn.Sequential)) or len(found) == 0:
        raise CaptureError(f"capture.per_layer: {path!r} is a {type(found).__name__}, not a list of layers "
                           "(torch.nn.ModuleList); give the path of the module list holding them")
    return list(found)


@dataclass
class StepWork:
    """A step of graphs (``solvers.step.Step``) with, per key, its prepared graph (compiled
    layers) and canonical values and id, what plan files need; ``needs``: a line training needs
    besides the backends (``recompile_limit_hint``)."""
    step: Step
    needs: str | None = None
    prepared: dict[str, road.PreparedGraph] = field(default_factory=dict)
    values: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def build_step(captured: StepCapture, request: SolveRequest) -> StepWork:
    """The step's problems: the root's parts (eager's plan kept) around the layer graphs, each
    distinct layer graph one entry with its run of layers as its repeat."""
    whole = road.prepare(*_args(captured.whole.copy()), request, input_roles=captured.whole.input_roles)
    before, after = root_parts(whole.problem, captured.path)
    work = StepWork(Step(()))
    runs: list[tuple[str, int]] = []
    for joint in captured.layers:
        prepared = road.prepare(*_args(joint.copy()), request, input_roles=joint.input_roles)
        if not prepared.has_backward:
            raise CaptureError(f"capture.per_layer: a layer under {captured.path!r} has no backward to partition")
        values, gid = prepared.canonical()
        work.prepared.setdefault(gid, prepared)
        work.values.setdefault(gid, values)
        if runs and runs[-1][0] == gid:
            runs[-1] = (gid, runs[-1][1] + 1)
        else:
            runs.append((gid, 1))
    if len(captured.layers) != captured.count:
        if len(captured.layers) != 1:
            raise CaptureError(f"capture.per_layer: {captured.count} layers under {captured.path!r} compiled "
                               f"{len(captured.layers)} graphs; expected one per layer or one for all")
        runs = [(runs[0][0], captured.count)]  # one compiled graph reused by every layer
    graphs = [StepGraph(BEFORE, before, 1, fixed=eager_saved(before))]
    graphs += [StepGraph(gid, work.prepared[gid].problem, n) for gid, n in runs]
    graphs.append(StepGraph(AFTER, after, 1, fixed=eager_saved(after)))
    work.step = Step(tuple(graphs))
    work.needs = recompile_limit_hint(captured)
    return work


def recompile_limit_hint(captured: StepCapture) -> str | None:
    """The line training needs where every layer compiled on its own beyond dynamo's default
    recompile limit (each layer recompiles: Hugging Face's KV cache), else None."""
    if len(captured.layers) > 1 and len(captured.layers) > torch._dynamo.config.recompile_limit:
        return f"torch._dynamo.config.recompile_limit = {len(captured.layers)}"
    return None


def _args(joint: JointGraph) -> tuple[fx.GraphModule, int, list[int] | None]:
    return joint.module, joint.num_fwd_outputs, joint.static_lifetime_input_indices
