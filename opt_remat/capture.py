"""Stage 1: capture the joint forward+backward graphs that ``torch.compile`` hands to a partitioner.

The capture follows torch.compile's own path (Dynamo, then AOTAutograd with the backend's
decompositions; for ``compiler="inductor"`` inductor's AOTAutograd and joint-graph passes), so a plan
solved on a captured graph is a plan for the graph training will see. With graph breaks there is one
joint graph per compiled region.

With ``meta=True`` the model is built and run under a FakeTensorMode: sizes, dtypes and flops are
exact, but no weight or activation memory is allocated, so a LLaMA-7B-sized step can be planned on a
laptop. Fake tensors keep the CPU device (not ``meta``) so that ops dispatch as in a real capture:
on the meta device SDPA falls back to its unfused math form and the graph would differ.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx
from torch._functorch.compilers import nop
from torch._functorch.partitioners import default_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                          FakeTensorMode, unset_fake_temporarily)

from .canonical import input_roles
from .errors import CaptureError
from .compile_setup import aot_graphs, inductor_compile


def _deepcopy_unfaked(module: fx.GraphModule) -> fx.GraphModule:
    """A deep copy made with any fake mode unset: the partitioner is called while AOTAutograd's is
    active, and a graph holding a real constant tensor (HF models' rotary tables, causal masks)
    cannot be copied under it."""
    with unset_fake_temporarily():
        return copy.deepcopy(module)


@dataclass
class JointGraph:
    module: fx.GraphModule
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int] | None
    input_roles: list[str] | None = None  # per primal: "param NAME", "buffer NAME" or "input NAME"

    def copy(self) -> "JointGraph":
        """A deep copy: partitioners mutate the graph they are given."""
        return JointGraph(_deepcopy_unfaked(self.module), self.num_fwd_outputs,
                          list(self.static_lifetime_input_indices or []),
                          list(self.input_roles) if self.input_roles is not None else None)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None:
        yield
        return
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _skip_weight_init() -> Iterator[None]:
    """``torch.nn.init``'s in-place initializers as no-ops: under fake tensors the values are not
    real anyway, and some read them (``trunc_normal_`` resamples until ``mask.any()`` is false, a
    data-dependent branch that fake tensors refuse: torchvision's ViT could not be built)."""
    init = torch.nn.init
    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_")
             and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}
    for n in names:
        setattr(init, n, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(init, n, fn)


def _build_fake(factory: Callable[[], torch.nn.Module], fake_mode: FakeTensorMode,
                dtype: torch.dtype | None) -> torch.nn.Module:
    """``factory()`` with fake weights. Built under the fake mode where it can be; a constructor
    that reads a tensor's value (timm's drop-path rates call ``.item()`` on a ``linspace``) is
    built for real instead, its initializers skipped (``torch.empty`` storage the OS has not
    handed out yet), and its weights then swapped for fake ones."""
    try:
        with fake_mode, _default_dtype(dtype), _skip_weight_init():
            return factory()
    except (DataDependentOutputException, DynamicOutputShapeException):
        pass
    with _default_dtype(dtype), _skip_weight_init():
        module = factory()
    fakes: dict[int, torch.nn.Parameter] = {}  # one fake per parameter: tied weights stay tied
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                if id(param) not in fakes:
                    fakes[id(param)] = torch.nn.Parameter(fake_mode.from_tensor(param.detach()),
                                                          requires_grad=param.requires_grad)
                sub._parameters[name] = fakes[id(param)]
        for name, buf in list(sub._buffers.items()):
            if buf is not None:
                sub._buffers[name] = fake_mode.from_tensor(buf)
    return module


class _Captured(Exception):
    """Raised by the capturing partitioner once it has the joint graph: stops inductor's codegen."""


_SINK: Callable[[fx.GraphModule, dict[str, Any]], None] | None = None


class _CatchJoint(CustomPartitionerFn):
    """A stateless (so picklable for inductor's cache key) custom partitioner that hands the joint
    graph to ``_SINK`` and stops the compilation before code generation."""

    def __call__(self, gm: Any, joint_inputs: Any, **kw: Any) -> Any:
        kw.pop("compiler", None)
        if _SINK is not None:
            _SINK(gm, kw)
        raise _Captured()

    def uuid(self) -> None:
        return None


def _inductor_catcher() -> _CatchJoint:
    return _CatchJoint()


def _capturing_backend(compiler: str, decompositions: Any,
                       record: Callable[[fx.GraphModule, dict[str, Any], list[str]], None]) -> Callable:
    """A torch.compile backend set up as ``opt_remat.backend(compiler=...)`` is (``compile_setup``),
    whose partitioner records each joint graph; the regions then run uncompiled (they only need to
    reach the next)."""
    if compiler == "eager":
        def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            roles = input_roles(gm)

            def catch(joint: fx.GraphModule, joint_inputs: Any, **kw: Any) -> Any:
                record(joint, kw, roles)
                return default_partition(joint, joint_inputs, **kw)

            return aot_graphs(catch, decompositions, nop)(gm, example_inputs)
        return backend
    if compiler == "inductor":
        def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            global _SINK
            roles = input_roles(gm)
            _SINK = lambda joint, kw: record(joint, kw, roles)  # noqa: E731
            try:  # a cache hit would skip the partitioner that records the graph
                return inductor_compile(gm, example_inputs, _inductor_catcher(), cache=False)
            except Exception as exc:
                if not _caused_by(exc, _Captured):
                    raise
                return gm.forward
            finally:
                _SINK = None
        return backend
    raise ValueError(f"compiler must be 'eager' or 'inductor', got {compiler!r}")


def _caused_by(exc: BaseException | None, kind: type) -> bool:
    depth = 0
    while exc is not None and depth < 20:
        if isinstance(exc, kind) or isinstance(getattr(exc, "inner_exception", None), kind):
            return True
        exc = exc.__cause__ or exc.__context__
        depth += 1
    return False


def recording_backend(compiler: str, decompositions: Any) -> tuple[list[JointGraph], Callable[..., Any]]:
    """A backend that compiles as opt-remat's does and records each joint graph handed to its
    partitioner (a copy, unfaked) in the list returned beside it."""
    seen: list[JointGraph] = []

    def record(joint: fx.GraphModule, kw: dict[str, Any], roles: list[str]) -> None:
        seen.append(JointGraph(_deepcopy_unfaked(joint), kw["num_fwd_outputs"],
                               kw.get("static_lifetime_input_indices"), roles))

    return seen, _capturing_backend(compiler, decompositions, record)


def built_module(model: torch.nn.Module | Callable[[], torch.nn.Module], fake_mode: FakeTensorMode | None,
                 dtype: torch.dtype | None) -> torch.nn.Module:
    """The model to capture: a factory built (under ``fake_mode`` where given), a module as it is."""
    if fake_mode is not None and not isinstance(model, torch.nn.Module):
        return _build_fake(model, fake_mode, dtype)
    with _default_dtype(dtype):
        return model() if not isinstance(model, torch.nn.Module) else model


def capture_graphs(model: torch.nn.Module | Callable[[], torch.nn.Module], example_inputs: Sequence[Any], *,
                   compiler: str = "eager", decompositions: Any = "inductor", meta: bool = False,
                   dtype: torch.dtype | None = None, seed: int = 0, fullgraph: bool = False) -> list[JointGraph]:
    """The joint graphs of one training step of ``model`` (or of ``model()`` for a factory), as
    ``torch.compile(model, backend=opt_remat.backend(compiler=compiler, decompositions=...))`` hands
    them to its partitioner, in compilation order (several with graph breaks).

    ``meta=True`` builds the factory under a FakeTensorMode (``torch.nn.init`` skipped) and fakes
    the inputs, so nothing is allocated (pass a factory: a module given already built has
    allocated its weights). A constructor that reads tensor values is built for real, without
    initializing, and its weights made fake before the step runs.
    ``dtype`` is the default dtype while the model is built.
    """
    seen, be = recording_backend(compiler, decompositions)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if meta else None
    torch._dynamo.reset()
    try:
        module = built_module(model, fake_mode, dtype)
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            if fake_mode is not None:
                example_inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                  for x in example_inputs]
            else:
                module = copy.deepcopy(module)  # dynamo's guards and hooks stay off the caller's model
            torch.manual_seed(seed)
            torch.compile(module, backend=be, fullgraph=fullgraph)(*example_inputs)
    finally:
        torch._dynamo.reset()
    return seen


def capture(model: torch.nn.Module | Callable[[], torch.nn.Module], example_inputs: Sequence[Any], *,
            compiler: str = "eager", decompositions: Any = "inductor", meta: bool = False,
            dtype: torch.dtype | None = None, seed: int = 0) -> JointGraph:
    """The one joint graph of a training step without graph breaks (see ``capture_graphs``)."""
    graphs = capture_graphs(model, example_inputs, compiler=compiler, decompositions=decompositions,
                            meta=meta, dtype=dtype, seed=seed)
    if len(graphs) != 1:
        raise CaptureError(f"the training step compiled to {len(graphs)} joint graphs (graph breaks); "
                           "use opt_remat.capture.capture_graphs for one graph per compiled region")
    return graphs[0]
