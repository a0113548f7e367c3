"""Run configurations: YAML files validated with JSON Schema, with errors that name the field and line.

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
    budgets: [1.0, 0.5, "2MiB"]
    solvers: [mincut, {name: cpsat, time_limit_s: 60, threads: 2}, greedy]
    verify: {gradients: true, measure_memory: true}
    output: {dir: runs/gpt2, formats: [table, json, csv, plot]}

Every error is a ``ConfigError`` whose message is one line: ``FILE:LINE: FIELD: what was expected``.
Relative paths (``model.graph``, ``output.dir``) are relative to the configuration file; values
given with ``--set`` are relative to the working directory.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import jsonschema
import yaml

from solvers.budget import Fraction, parse_budget

from .options import TORCH_SOLVER, known_solvers, option_error, solver_parameters
from .options import describe as _describe

FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
INT_DTYPES = ["int64", "int32", "int16", "int8", "uint8", "bool"]
FORMATS = ["table", "json", "csv", "plot"]
BUILTIN_FACTORIES = {"mlp", "gpt2", "llama", "resnet"}
_INPUT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["shape"],
    "properties": {
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "dtype": {"enum": FLOAT_DTYPES + INT_DTYPES},
        "low": {"type": "number"},
        "high": {"type": "number"},
    },
}

_FACTORY_MODEL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["factory"],
    "properties": {
        "factory": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"},
        "kwargs": {"type": "object"},
        "inputs": {"type": "array", "minItems": 1, "items": _INPUT_SCHEMA},
        "loss": {"enum": ["sum", "mean"]},
        "name": {"type": "string"},
    },
}

_GRAPH_MODEL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["graph"],
    "properties": {"graph": {"type": "string", "minLength": 1}, "name": {"type": "string"}},
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["model", "budgets", "solvers"],
    "properties": {
        "name": {"type": "string"},
        "seed": {"type": "integer"},
        "model": {
            "type": "object",
            "if": {"required": ["graph"]},
            "then": _GRAPH_MODEL,
            "else": _FACTORY_MODEL,
        },
        "capture": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "compiler": {"enum": ["eager", "inductor"]},
                "decompositions": {"enum": ["inductor", "none"]},
                "dtype": {"enum": FLOAT_DTYPES},
                "meta": {"type": "boolean"},
            },
        },
        # recompute costs: the device profile's roofline estimate, or timed on this machine
        "costs": {"enum": ["roofline", "profile"]},
        "device": {
            "type": ["string", "object"],
            "if": {"type": "string"},
            "then": {"enum": ["h100", "a100", "v100", "cpu"]},
            "else": {
                "additionalProperties": False,
                "required": ["peak_flops", "bandwidth"],
                "properties": {
                    "name": {"type": "string"},
                    "peak_flops": {"type": "number", "exclusiveMinimum": 0},
                    "bandwidth": {"type": "number", "exclusiveMinimum": 0},
                },
            },
        },
        "budgets": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": ["number", "string", "object"],
                "if": {"type": "object"},
                # a peak budget: bytes of the whole step's live peak, optionally with saved bytes
                "then": {"additionalProperties": False, "required": ["peak"],
                         "properties": {"peak": {"type": ["number", "string"]},
                                        "saved": {"type": ["number", "string"]},
                                        # false: the peak without gradients (kept between steps)
                                        "count_gradients": {"type": "boolean"}}},
            },
        },
        "solvers": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": ["string", "object"],
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "label": {"type": "string"}},
            },
        },
        "verify": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "gradients": {"type": "boolean"},
                "measure_memory": {"type": "boolean"},
                "tolerance": {"type": "number", "minimum": 0},
            },
        },
        "output": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "dir": {"type": "string", "minLength": 1},
                "formats": {"type": "array", "uniqueItems": True, "items": {"enum": FORMATS}},
            },
        },
    },
}

_TYPE_NAMES = {"object": "a mapping", "array": "a list", "string": "a string", "number": "a number",
               "integer": "an integer", "boolean": "true or false", "null": "null"}


class ConfigError(ValueError):
    """Bad configuration input; ``str()`` is one line naming the place, the field and what was expected."""

    def __init__(self, where: str, field_name: str, message: str) -> None:
        self.where = where
        self.field = field_name
        self.detail = message
        text = f"{where}: {field_name}: {message}" if field_name else f"{where}: {message}"
        super().__init__(" ".join(text.split()))


def field_name(path: Sequence[Any]) -> str:
    """``("solvers", 1, "time_limit_s")`` -> ``solvers[1].time_limit_s``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


# ---- YAML with line numbers ---------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """Safe YAML, with YAML 1.2 floats: ``1e12`` is a number (YAML 1.1 reads it as a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _load_yaml(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """The document and, for every key and list item, the 1-based line it starts on."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(f"{source}:1", "", "the file is empty: expected a mapping with model, budgets and solvers")
        lines: dict[tuple, int] = {(): node.start_mark.line + 1}
        _walk(loader, node, (), lines, source)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError(f"{source}:{line}", "", f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}:1", "", f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    return data, lines


def _walk(loader: yaml.SafeLoader, node: yaml.Node, path: tuple, lines: dict[tuple, int], source: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{source}:{line}", field_name(path + (key,)), "duplicate key")
            seen.add(key)
            lines[path + (key,)] = line
            _walk(loader, value_node, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(loader, item, path + (i,), lines, source)


# ---- overrides ------------------------------------------------------------------------------
def parse_override(text: str) -> tuple[tuple, Any]:
    """``"solvers.1.time_limit_s=5"`` -> (("solvers", 1, "time_limit_s"), 5); the value is YAML."""
    if "=" not in text:
        raise ConfigError("--set", text, "expected key=value (e.g. verify.gradients=false or budgets=[0.5])")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError("--set", key or text, "expected a dotted key such as output.dir or solvers.1.time_limit_s")
    path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
    try:
        parsed = yaml.load(value, Loader=_Loader) if value.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError("--set", key, f"value {value!r} is not valid YAML: {exc}") from None
    return path, parsed


def apply_override(data: Any, path: tuple, value: Any) -> Any:
    if not isinstance(data, dict):
        raise ConfigError("--set", field_name(path), "the configuration is not a mapping")
    target = data
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(target, dict):
            if part not in target or not isinstance(target[part], (dict, list)):
                target[part] = [] if isinstance(nxt, int) else {}
            target = target[part]
        elif isinstance(target, list) and isinstance(part, int) and part < len(target):
            if not isinstance(target[part], (dict, list)):
                if isinstance(target[part], str) and not isinstance(nxt, int):  # solvers: "mincut" -> {name: mincut}
                    target[part] = {"name": target[part]}
                else:
                    raise ConfigError("--set", field_name(path[:i + 1]), "is not a mapping or list")
            target = target[part]
        else:
            raise ConfigError("--set", field_name(path[:i + 1]), "no such item")
    last = path[-1]
    if isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list) and isinstance(last, int) and last <= len(target):
        if last == len(target):
            target.append(value)
        else:
            target[last] = value
    else:
        raise ConfigError("--set", field_name(path), "no such item")
    return data


# ---- the validated configuration --------------------------------------------------------------
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

    @property
    def count_gradients(self) -> bool:
        return not isinstance(self.raw, dict) or bool(self.raw.get("count_gradients", True))

    @property
    def saved_raw(self) -> int | float | str | None:
        return self.raw.get("saved") if isinstance(self.raw, dict) else self.raw


@dataclass
class Config:
    path: Path
    data: dict[str, Any]  # the validated document with defaults filled in
    lines: dict[tuple, int]
    overridden: list[tuple] = field(default_factory=list)

    # ---- locations and errors ----
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

    # ---- views ----
    @property
    def name(self) -> str:
        return self.data.get("name") or self.data["model"].get("name") or self.path.stem

    @property
    def is_graph(self) -> bool:
        return "graph" in self.data["model"]

    @property
    def graph_path(self) -> Path:
        return self.resolve_path(("model", "graph"), self.data["model"]["graph"])

    @property
    def seed(self) -> int:
        return int(self.data.get("seed", 0))

    @property
    def device(self) -> Any:
        return self.data.get("device", "h100")

    @property
    def costs(self) -> str:
        return self.data.get("costs", "roofline")

    @property
    def decompositions(self) -> str:
        return self.data.get("capture", {}).get("decompositions", "inductor")

    @property
    def compiler(self) -> str:
        """The compiler the plans are made for: its joint graph is the one captured and solved."""
        return self.data.get("capture", {}).get("compiler", "eager")

    @property
    def dtype(self) -> str:
        return self.data.get("capture", {}).get("dtype", "float32")

    @property
    def meta(self) -> bool:
        """Capture with fake tensors: no weight or activation memory (big models, planning only)."""
        return bool(self.data.get("capture", {}).get("meta", False))

    @property
    def loss(self) -> str:
        return self.data["model"].get("loss", "sum")

    @property
    def verify_gradients(self) -> bool:
        return (not self.is_graph and not self.meta
                and bool(self.data.get("verify", {}).get("gradients", True)))

    @property
    def measure_memory(self) -> bool:
        return (not self.is_graph) and bool(self.data.get("verify", {}).get("measure_memory", True))

    @property
    def tolerance(self) -> float:
        return float(self.data.get("verify", {}).get("tolerance", 1e-5))

    @property
    def output_dir(self) -> Path:
        out = self.data.get("output", {})
        if "dir" in out:
            return self.resolve_path(("output", "dir"), out["dir"])
        return (self.path.parent / "runs" / self.path.stem).resolve()

    @property
    def formats(self) -> list[str]:
        return list(self.data.get("output", {}).get("formats", FORMATS))

    @property
    def budgets(self) -> list[BudgetSpec]:
        return [BudgetSpec(raw, parse_budget(raw.get("saved") if isinstance(raw, dict) else raw),
                           budget_label(raw), i, _peak_bytes(raw))
                for i, raw in enumerate(self.data["budgets"])]

    @property
    def solvers(self) -> list[SolverSpec]:
        return _solver_specs(self.data["solvers"])

    def factory(self) -> Callable[..., Any]:
        return import_factory(self, ("model", "factory"))


def budget_label(raw: Any) -> str:
    if isinstance(raw, dict):
        return (f"peak {raw['peak']}" + (" (no grads)" if raw.get("count_gradients") is False else "")
                + (f" + {raw['saved']}" if raw.get("saved") is not None else ""))
    return str(raw)


def _peak_bytes(raw: Any) -> int | None:
    if not isinstance(raw, dict):
        return None
    parsed = parse_budget(raw["peak"])
    return None if isinstance(parsed, Fraction) else parsed


def _solver_specs(entries: list[Any]) -> list[SolverSpec]:
    specs = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            name, options, label = entry, {}, None
        else:
            options = {k: v for k, v in entry.items() if k not in ("name", "label")}
            name, label = entry["name"], entry.get("label")
        if label is None:
            label = name
            if sum(1 for e in entries if (e if isinstance(e, str) else e["name"]) == name) > 1 and options:
                label = name + "[" + ",".join(f"{k}={v}" for k, v in sorted(options.items())) + "]"
        specs.append(SolverSpec(name, options, label, i))
    return specs


def import_factory(cfg: Config, path: tuple) -> Callable[..., Any]:
    """The callable named by ``module:attr`` (the config file's folder is importable too)."""
    spec = cfg.data
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


# ---- loading -----------------------------------------------------------------------------------
def load_config(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read, override and validate a configuration (schema, budgets, solvers and their options,
    device, graph file, factory import). Building the model and capturing it is the runner's
    ``materialize``, which reports errors the same way."""
    cfg_path = Path(path)
    source = str(cfg_path)
    try:
        text = cfg_path.read_text()
    except FileNotFoundError:
        raise ConfigError(source, "", "configuration file not found") from None
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read the configuration: {exc}") from None
    data, lines = _load_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1", "", f"expected a mapping with model, budgets and solvers, got {_describe(data)}")
    overridden = []
    for item in overrides:
        key, value = parse_override(item)
        data = apply_override(data, key, value)
        overridden.append(key)
    cfg = Config(cfg_path, data, lines, overridden)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    data = cfg.data
    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = list(validator.iter_errors(data))
    if errors:
        raise _schema_error(cfg, errors)

    for i, entry in enumerate(data["budgets"]):
        parts = [(("budgets", i, "peak"), entry["peak"]), (("budgets", i, "saved"), entry.get("saved"))] \
            if isinstance(entry, dict) else [(("budgets", i), entry)]
        for where, raw in parts:
            if raw is None:
                continue
            try:
                parsed = parse_budget(raw)
            except ValueError as exc:
                raise cfg.error(where, str(exc)) from None
            if where[-1] == "peak" and isinstance(parsed, Fraction):
                raise cfg.error(where, f"a peak budget is bytes (e.g. '700KiB' or 716800), not a "
                                       f"fraction: got {raw}")
            if isinstance(raw, int) and not isinstance(raw, bool) and raw < 1024:
                raise cfg.error(where, f"{raw} would be {raw} bytes: write a fraction as a float "
                                       f"(e.g. {float(raw)}) or bytes with a unit (e.g. '{raw}MiB')")
    labels = [budget_label(b) for b in data["budgets"]]
    for i, lab in enumerate(labels):
        if labels.index(lab) != i:
            raise cfg.error(("budgets", i), f"budget {lab} is listed twice")

    names = known_solvers()  # solvers and their options
    for i, entry in enumerate(data["solvers"]):
        name = entry if isinstance(entry, str) else entry["name"]
        where = ("solvers", i) if isinstance(entry, str) else ("solvers", i, "name")
        if name not in names:
            raise cfg.error(where, f"unknown solver {name!r}; expected one of: {', '.join(names)}")
        if isinstance(entry, dict):
            params = solver_parameters(name)
            for key, value in entry.items():
                if key in ("name", "label"):
                    continue
                if key not in params:
                    opts = ", ".join(params) or "none"
                    raise cfg.error(("solvers", i, key), f"unknown option for solver {name!r}; "
                                                         f"expected one of: {opts}")
                _check_option(cfg, ("solvers", i, key), name, key, value, params[key])
    specs = _solver_specs(data["solvers"])
    seen_labels: dict[str, int] = {}
    for spec in specs:
        if spec.label in seen_labels:
            raise cfg.error(("solvers", spec.index), f"solver {spec.label!r} is listed twice; give one "
                                                     "of them a distinct 'label'")
        seen_labels[spec.label] = spec.index

    from .costs import get_profile  # device
    try:
        get_profile(cfg.device)
    except (ValueError, TypeError) as exc:
        raise cfg.error(("device",), str(exc)) from None

    capture = data.get("capture", {})
    if capture.get("compiler") == "inductor" and capture.get("decompositions") == "none":
        raise cfg.error(("capture", "decompositions"), "expected inductor (or no key) with compiler: inductor, "
                                                       "which always applies its own decompositions")
    if capture.get("meta"):
        if data.get("verify", {}).get("gradients"):
            raise cfg.error(("verify", "gradients"), "a meta capture has no real weights to run a step "
                                                     "with: set verify.gradients: false or capture.meta: false")
    model = data["model"]
    if "graph" in model:
        gpath = cfg.graph_path
        if not gpath.is_file():
            raise cfg.error(("model", "graph"), f"graph file {str(gpath)!r} not found; expected a "
                                                "Checkmate graph JSON (relative paths start at the config's folder)")
        try:
            importlib.import_module("solvers.checkmate")
        except ImportError:
            raise cfg.error(("model", "graph"), "loading Checkmate graphs needs solvers.checkmate, "
                                                "which this install does not have") from None
        return
    cfg.factory()
    inputs = model.get("inputs")
    if inputs is None:
        factory_name = model["factory"].partition(":")[2]
        if not (model["factory"].startswith("opt_remat.models:") and factory_name in BUILTIN_FACTORIES):
            raise cfg.error(("model",), "missing key 'inputs': expected a list of {shape, dtype, low, high} "
                                        "(only the built-in factories have default inputs)")
    for i, spec in enumerate(inputs or []):
        dtype = spec.get("dtype", cfg.dtype)
        low, high = spec.get("low"), spec.get("high")
        if dtype in INT_DTYPES and dtype != "bool":
            if high is None:
                raise cfg.error(("model", "inputs", i), f"missing key 'high': an {dtype} input needs "
                                                        "'high' (exclusive upper bound of random ints)")
            if float(low or 0) >= float(high):
                raise cfg.error(("model", "inputs", i, "high"), f"expected high > low ({low or 0}), got {high}")
            for k in ("low", "high"):
                v = spec.get(k)
                if v is not None and float(v) != int(v):
                    raise cfg.error(("model", "inputs", i, k), f"expected an integer for an {dtype} input, got {v}")


def _check_option(cfg: Config, path: tuple, solver: str, key: str, value: Any, param: inspect.Parameter) -> None:
    why = option_error(solver, key, value, param)
    if why is not None:
        raise cfg.error(path, why)


def _schema_error(cfg: Config, errors: list[jsonschema.ValidationError]) -> ConfigError:
    def flat(errs):
        for e in errs:
            if e.validator in ("if", "then", "else") and e.context:
                yield from flat(e.context)
            else:
                yield e

    errs = list(flat(errors))

    def key(e: jsonschema.ValidationError) -> tuple:
        where = cfg.where(_error_path(e))
        line = int(where.rsplit(":", 1)[1]) if ":" in where and where.rsplit(":", 1)[1].isdigit() else 0
        return (line, -len(_error_path(e)))

    e = min(errs, key=key)
    return cfg.error(_error_path(e), _error_message(e))


def _error_path(e: jsonschema.ValidationError) -> tuple:
    path = tuple(e.absolute_path)
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        extra = _extra_keys(e)
        if extra:
            return path + (extra[0],)
    return path


def _extra_keys(e: jsonschema.ValidationError) -> list[str]:
    allowed = set(e.schema.get("properties", {}))
    return [k for k in e.instance if k not in allowed]


def _error_message(e: jsonschema.ValidationError) -> str:
    v = e.validator
    if v == "additionalProperties":
        allowed = ", ".join(e.schema.get("properties", {}))
        return f"unknown key; expected one of: {allowed}"
    if v == "type":
        types = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
        want = " or ".join(_TYPE_NAMES.get(t, t) for t in types)
        return f"expected {want}, got {_describe(e.instance)}"
    if v == "enum":
        return f"expected one of {list(e.validator_value)}, got {_describe(e.instance)}"
    if v == "required":
        missing = [k for k in e.validator_value if k not in e.instance]
        return f"missing key {missing[0]!r}" + _required_hint(missing[0])
    if v == "pattern":
        return f"expected 'module:callable' (e.g. opt_remat.models:gpt2), got {e.instance!r}"
    if v == "minItems":
        return f"expected at least {e.validator_value} item(s), got none"
    if v == "uniqueItems":
        return "expected distinct items, got repeats"
    if v in ("minimum", "exclusiveMinimum"):
        op = ">=" if v == "minimum" else ">"
        return f"expected a number {op} {e.validator_value}, got {e.instance!r}"
    if v == "minLength":
        return "expected a non-empty string"
    return e.message


def _required_hint(key: str) -> str:
    return {
        "model": ": expected model: {factory: 'module:callable', kwargs: {...}, inputs: [...]} or {graph: PATH}",
        "budgets": ": expected a list of fractions (0.5) or bytes ('2MiB')",
        "solvers": ": expected a list of solver names or {name: ..., options}",
        "factory": ": expected 'module:callable' (e.g. opt_remat.models:gpt2) or graph: PATH",
        "name": ": expected the solver's name",
        "shape": ": expected a list of sizes, e.g. [2, 32]",
        "peak_flops": ": expected FLOP/s, e.g. 9.9e14",
        "bandwidth": ": expected bytes/s, e.g. 3.35e12",
    }.get(key, "")


def resolved_dict(cfg: Config) -> dict[str, Any]:
    """The configuration as run, with paths resolved (stored in results.json)."""
    data = copy.deepcopy(cfg.data)
    if cfg.is_graph:
        data["model"]["graph"] = str(cfg.graph_path)
    data.setdefault("output", {})["dir"] = str(cfg.output_dir)
    return data
