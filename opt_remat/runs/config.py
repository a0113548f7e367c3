"""Run configurations: YAML files read into typed models, with errors that name the field and line.

A configuration says which model to capture (a ``module:callable`` factory with keyword sizes and
input shapes, or a published Checkmate graph file), which device profile prices recomputation,
which budgets and solvers to run, what to verify, and where to write the results::

    model:
      factory: opt_remat.models:gpt2
      kwargs: {layers: 2, d_model: 64, heads: 4, vocab: 256, seq: 32}
      inputs: [{shape: [2, 32], dtype: int64, high: 256}]
      loss: sum
    capture: {compiler: eager, decompositions: inductor, dtype: float32}
    device: h100
    rng_replay: true            # as partitioner(rng_replay=...); count_input_bytes likewise
    offload: {host_memory: 64GiB}  # as partitioner(offload=...): true, or with a host cap / min_bytes
    budgets: [1.0, 0.5, "2MiB"]
    solvers: [default, mincut, {name: cpsat, time_limit_s: 60, threads: 2}, greedy]
    verify: {gradients: true, measure_memory: true}
    output: {dir: runs/gpt2, formats: [table, json, csv, plot, html], title: "GPT-2, 2 layers"}

A key is declared once, in the models below, with its type and default; ``load_config``
(``runs.config_rules``) checks the document against them and then what types cannot say (budgets,
solver options as ``solvers.catalog`` declares them, the device, files, the factory). The solve
settings (budget, solver, options, device, costs, rng_replay, count_input_bytes, offload) are checked by
``opt_remat.request.make_request``, the function the API's ``partitioner()`` checks its own with.
``default`` names the API's default path (no solver named). A solver entry serves every budget of
the run: options of one kind of budget (``symmetry`` under saved bytes, ``gap`` under a peak) are
used by the pairs of that kind and left out of the others. Every error is a ``ConfigError`` whose message is one line:
``FILE:LINE: FIELD: what was expected``. Relative paths (``model.graph``, ``output.dir``) are
relative to the configuration file; values given with ``--set`` are relative to the working directory.
"""

from __future__ import annotations

import copy
import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal, Sequence, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, PlainValidator, Tag,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from solvers.budget import Fraction, parse_budget

from ..options import TORCH_SOLVER
from ..options import describe as _describe
from .yaml_lines import ConfigError, field_name

__all__ = ["TORCH_SOLVER", "ConfigError", "Config", "BudgetSpec", "SolverSpec", "field_name"]

FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
INT_DTYPES = ["int64", "int32", "int16", "int8", "uint8", "bool"]
Format = Literal["table", "json", "csv", "plot", "html"]
FORMATS: list[Format] = ["table", "json", "csv", "plot", "html"]
BUILTIN_FACTORIES = {"mlp", "gpt2", "llama", "resnet"}
FloatDtype = Literal["float32", "float64", "float16", "bfloat16"]


# ---- the document, typed ------------------------------------------------------------------------
class _Section(BaseModel):
    """A mapping with known keys: strict types (YAML's ``"5"`` is not 5), unknown keys refused."""
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # one error naming the key and the keys allowed (pydantic's own names neither)
        if isinstance(data, dict) and cls.model_config.get("extra") == "forbid":
            for key in data:
                if key not in cls.model_fields:
                    raise PydanticCustomError("unknown_key", "unknown key; expected one of: {allowed}",
                                              {"key": key, "allowed": ", ".join(cls.model_fields)})
        return data


def _by_kind(other: str, *kinds: type) -> Discriminator:
    """Pick a union's member by the value's kind (a mapping, or one of ``kinds``), so that errors
    come from that member alone; a value of neither kind is a ``union_tag_invalid`` error."""
    def tag(v: Any) -> str:
        if isinstance(v, dict):
            return "mapping"
        return other if isinstance(v, kinds) and not isinstance(v, bool) else "neither"
    return Discriminator(tag)


def _of_kinds(*kinds: type, want: str) -> Any:
    """A value of one of ``kinds`` (bool is not a number), as written."""
    def check(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, kinds):
            raise PydanticCustomError("kind", "expected {want}, got {got}", {"want": want, "got": _describe(v)})
        return v
    return Annotated[Any, PlainValidator(check)]


if TYPE_CHECKING:  # what the validator admits
    Scalar = Union[int, float, str]
else:
    Scalar = _of_kinds(int, float, str, want="a number or a string")


class InputSpec(_Section):
    shape: list[Annotated[int, Field(ge=0)]]
    dtype: Literal["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                   "bool"] | None = None  # default: capture.dtype
    low: float | None = None
    high: float | None = None


class FactoryModel(_Section):
    factory: str
    kwargs: dict[str, Any] = {}
    inputs: list[InputSpec] | None = Field(default=None, min_length=1)  # default: the built-in factories' own
    loss: Literal["sum", "mean"] = "sum"
    name: str | None = None

    @field_validator("factory")
    @classmethod
    def _module_callable(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", v):
            raise ValueError(f"expected 'module:callable' (e.g. opt_remat.models:gpt2), got {v!r}")
        return v


class GraphModel(_Section):
    graph: str = Field(min_length=1)  # a published Checkmate graph (JSON)
    name: str | None = None


class CaptureSpec(_Section):
    compiler: Literal["eager", "inductor"] = "eager"  # the compiler the plans are made for
    decompositions: Literal["inductor", "none"] = "inductor"
    dtype: FloatDtype = "float32"
    meta: bool = False  # fake tensors: no weight or activation memory (big models, planning only)
    # per-layer compile: each module of this module list compiled on its own, the rest eager;
    # ``opt-remat solve`` plans the step's graphs together (``runs.step_files``)
    per_layer: str | None = Field(default=None, min_length=1)


class DeviceSpec(_Section):
    name: str | None = None
    peak_flops: float = Field(gt=0)
    bandwidth: float = Field(gt=0)
    host_bandwidth: float | None = Field(default=None, gt=0)  # bytes/s to pinned host memory (offload's link)


class PeakBudget(_Section):
    """Bytes of the whole step's live peak, or of the device (``device``: the rank's whole memory,
    as the ``training`` section says), optionally with saved bytes."""
    peak: Scalar | None = None
    device: Scalar | None = None
    saved: Scalar | None = None
    count_gradients: bool = True  # false: the peak without gradients (kept between steps)


class SolverEntry(_Section):
    """``{name: cpsat, label: ..., OPTION: value ...}``: the options are the solver's keywords."""
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    name: str
    label: str | None = None


class VerifySpec(_Section):
    gradients: bool = True  # against save-all's, with real weights (not with capture.meta)
    measure_memory: bool = True  # saved bytes measured on the lowered graphs
    tolerance: float = Field(default=1e-5, ge=0)


class OutputSpec(_Section):
    dir: str | None = Field(default=None, min_length=1)  # default: runs/CONFIG-NAME beside the config
    formats: list[Format] = list(FORMATS)
    title: str | None = None  # the summary's and plots' title (default: the run's name)

    @field_validator("formats")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise PydanticCustomError("repeats", "expected distinct items, got repeats")
        return v


class RunSpec(_Section):
    """The whole configuration document."""
    name: str | None = None
    seed: int = 0
    model: Annotated[Union[Annotated[GraphModel, Tag("graph")], Annotated[FactoryModel, Tag("factory")]],
                     Discriminator(lambda v: "graph" if isinstance(v, dict) and "graph" in v else "factory")]
    capture: CaptureSpec = CaptureSpec()
    costs: Literal["roofline", "profile"] = "roofline"  # the device profile's estimate, or timed here
    rng_replay: bool = True  # random ops recomputable by replaying their RNG state (as partitioner())
    count_input_bytes: bool = False  # graph inputs count as saved bytes (as partitioner())
    training: dict[str, Any] | None = None  # how the step is trained (solvers.training), for device budgets
    # offload one of the planner's choices (as partitioner(offload=...)): true, or {host_memory, min_bytes}
    offload: Union[bool, dict[str, Any]] = False
    device: Annotated[Union[Annotated[DeviceSpec, Tag("mapping")],
                            Annotated[Literal["h100", "a100", "v100", "cpu"], Tag("name")]],
                      _by_kind("name", str)] = "h100"
    budgets: list[Annotated[Union[Annotated[PeakBudget, Tag("mapping")], Annotated[Scalar, Tag("value")]],
                            _by_kind("value", int, float, str)]] = Field(min_length=1)
    solvers: list[Annotated[Union[Annotated[SolverEntry, Tag("mapping")],
                                  Annotated[str, Tag("name")]],
                            _by_kind("name", str)]] = Field(min_length=1)
    verify: VerifySpec = VerifySpec()
    output: OutputSpec = OutputSpec()




# ---- the loaded configuration ---------------------------------------------------------------------
@dataclass(frozen=True)
class SolverSpec:
    name: str
    options: dict[str, Any]
    label: str
    index: int  # position in the config's solver list


@dataclass(frozen=True)
class BudgetSpec:
    raw: int | float | str | dict  # as written; a dict is a peak budget {peak: ..., saved: ...}
    parsed: int | Fraction | None  # the saved-bytes part (None: none)
    label: str
    index: int
    peak: int | None = None  # bytes of the step's peak, for a peak budget
    count_gradients: bool = True
    device: int | None = None  # bytes of the device, for a device budget

    @property
    def saved_raw(self) -> int | float | str | None:
        return self.raw.get("saved") if isinstance(self.raw, dict) else self.raw

    @property
    def peak_limit(self) -> int | None:
        """The bytes a peak solve must fit: the peak budget's or the device's (None: no peak to fit)."""
        return self.peak if self.peak is not None else self.device


@dataclass
class Config:
    """A checked configuration: ``spec`` (typed, defaults filled in), and where each key was written."""
    path: Path
    data: dict[str, Any]  # the document as written (after overrides): results.json keeps it
    lines: dict[tuple, int]
    overridden: list[tuple] = field(default_factory=list)
    spec: RunSpec = None  # type: ignore[assignment]  # set by load_config

    def where(self, path: Sequence[Any]) -> str:
        path = tuple(path)
        for o in self.overridden:
            if path[:len(o)] == o:
                return "--set"
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return f"{self.path}:{self.lines[path[:cut]]}"
        return str(self.path)

    def error(self, path: Sequence[Any], message: str) -> ConfigError:
        return ConfigError(self.where(path), field_name(path), message)

    def resolve_path(self, path: Sequence[Any], value: str) -> Path:
        p = Path(value).expanduser()
        if p.is_absolute():
            return p
        base = Path.cwd() if self.where(path) == "--set" else self.path.parent
        return (base / p).resolve()

    # what is derived from several keys; single keys are read from ``spec``
    @property
    def name(self) -> str:
        return self.spec.name or self.spec.model.name or self.path.stem

    @property
    def title(self) -> str:
        return self.spec.output.title or self.name

    @property
    def is_graph(self) -> bool:
        return isinstance(self.spec.model, GraphModel)

    @property
    def graph_path(self) -> Path:
        return self.resolve_path(("model", "graph"), self.spec.model.graph)  # type: ignore[union-attr]

    @property
    def device(self) -> str | dict[str, Any]:
        """What ``costs.get_profile`` takes: a profile's name or its figures."""
        d = self.spec.device
        return d if isinstance(d, str) else d.model_dump(exclude_none=True)

    @property
    def verify_gradients(self) -> bool:
        return not self.is_graph and not self.spec.capture.meta and self.spec.verify.gradients

    @property
    def measure_memory(self) -> bool:
        return not self.is_graph and self.spec.verify.measure_memory

    @property
    def output_dir(self) -> Path:
        if self.spec.output.dir is not None:
            return self.resolve_path(("output", "dir"), self.spec.output.dir)
        return (self.path.parent / "runs" / self.path.stem).resolve()

    # shortcuts to single keys that many places read
    seed = property(lambda self: self.spec.seed)
    compiler = property(lambda self: self.spec.capture.compiler)
    decompositions = property(lambda self: self.spec.capture.decompositions)
    dtype = property(lambda self: self.spec.capture.dtype)
    meta = property(lambda self: self.spec.capture.meta)
    formats = property(lambda self: list(self.spec.output.formats))

    @property
    def budgets(self) -> list[BudgetSpec]:
        out = []
        for i, b in enumerate(self.spec.budgets):
            if isinstance(b, PeakBudget):
                raw: Any = b.model_dump(exclude_unset=True)
                out.append(BudgetSpec(raw, parse_budget(b.saved), budget_label(raw), i, _peak_bytes(b.peak),
                                      b.count_gradients, _peak_bytes(b.device)))
            else:
                out.append(BudgetSpec(b, parse_budget(b), budget_label(b), i))
        return out

    @property
    def solvers(self) -> list[SolverSpec]:
        entries = [(e, {}, None) if isinstance(e, str) else (e.name, dict(e.model_extra or {}), e.label)
                   for e in self.spec.solvers]
        specs = []
        for i, (name, options, label) in enumerate(entries):
            if label is None:
                label = name
                if options and sum(1 for e in entries if e[0] == name) > 1:
                    label = name + "[" + ",".join(f"{k}={v}" for k, v in sorted(options.items())) + "]"
            specs.append(SolverSpec(name, options, label, i))
        return specs

    def factory(self) -> Callable[..., Any]:
        return import_factory(self, ("model", "factory"))

    def resolved_dict(self) -> dict[str, Any]:
        """The configuration as run, with paths resolved (stored in results.json)."""
        data = copy.deepcopy(self.data)
        if self.is_graph:
            data["model"]["graph"] = str(self.graph_path)
        data.setdefault("output", {})["dir"] = str(self.output_dir)
        return data


def budget_label(raw: Any) -> str:
    if isinstance(raw, dict):
        if raw.get("device") is not None:
            return f"device {raw['device']}" + (f" + {raw['saved']}" if raw.get("saved") is not None else "")
        return (f"peak {raw['peak']}" + (" (no grads)" if raw.get("count_gradients") is False else "")
                + (f" + {raw['saved']}" if raw.get("saved") is not None else ""))
    return str(raw)


def _peak_bytes(raw: Any) -> int | None:
    if raw is None:
        return None
    parsed = parse_budget(raw)
    return None if isinstance(parsed, Fraction) else parsed


def import_factory(cfg: Config, path: tuple) -> Callable[..., Any]:
    """The callable named by ``module:attr`` (the config file's folder is importable too)."""
    spec: Any = cfg.data
    for part in path:
        spec = spec[part]
    module_name, _, attr = spec.partition(":")
    added = str(cfg.path.parent)
    sys.path.insert(0, added)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or an error raised while importing it
        raise cfg.error(path, f"cannot import module {module_name!r} ({type(exc).__name__}: {exc}); "
                              "expected 'module:callable' naming an importable factory") from None
    finally:
        try:
            sys.path.remove(added)
        except ValueError:
            pass
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise cfg.error(path, f"module {module_name!r} has no attribute {attr!r}; "
                                  "expected 'module:callable' naming a factory")
        obj = getattr(obj, part)
    if not callable(obj):
        raise cfg.error(path, f"{spec!r} is not callable; expected a factory returning an nn.Module")
    return obj
