"""Loading a configuration: the typed models of ``runs.config``, then what they cannot say, with
errors worded for users.

``load_config`` reads, overrides and types the document; ``check`` then runs what types cannot
say: budgets parse, solvers exist and take their options under the run's budgets
(``solvers.catalog``), the device profile, capture settings that contradict each other, the graph
file, the factory and its inputs. ``first_error`` words pydantic's errors as the one-line
``FILE:LINE: FIELD: ...`` messages of ``ConfigError``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any, Collection, Sequence

from pydantic import ValidationError

from solvers import catalog
from solvers.budget import Fraction, parse_budget

from ..options import describe
from ..errors import RequestError
from ..request import DEFAULT_SOLVER, SolveRequest, make_request, request_for
from .config import BUILTIN_FACTORIES, INT_DTYPES, Config, ConfigError, PeakBudget, RunSpec
from .yaml_lines import apply_override, load_yaml, parse_override

_TAGS = {"graph", "factory", "mapping", "name", "value"}  # union tags that pydantic puts in locations
_KINDS = {"bool_type": "true or false", "int_type": "an integer", "float_type": "a number",
          "string_type": "a string", "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
          "model_attributes_type": "a mapping"}
_TAG_KINDS = {"mapping": "a mapping", "name": "a string", "value": "a number or a string"}
_HINTS = {
    "model": ": expected model: {factory: 'module:callable', kwargs: {...}, inputs: [...]} or {graph: PATH}",
    "budgets": ": expected a list of fractions (0.5), bytes ('2MiB'), {peak: BYTES} or {device: BYTES}",
    "solvers": ": expected a list of solver names or {name: ..., options}",
    "factory": ": expected 'module:callable' (e.g. opt_remat.models:gpt2) or graph: PATH",
    "name": ": expected the solver's name",
    "shape": ": expected a list of sizes, e.g. [2, 32]",
    "peak_flops": ": expected FLOP/s, e.g. 9.9e14",
    "bandwidth": ": expected bytes/s, e.g. 3.35e12",
}


def load_config(path: str | Path, overrides: Sequence[str] = (), *, any_budget: bool = False) -> Config:
    """Read, override and check a configuration (types, budgets, solvers and their options, device,
    graph file, factory import). Building the model and capturing it is ``runs.workload``'s
    ``materialize``, which reports errors the same way. ``any_budget``: a solver's options may be
    those of any mode, not only of the config's budgets (``opt-remat solve`` picks one solver and
    says which options its budget leaves out)."""
    cfg_path = Path(path)
    source = str(cfg_path)
    try:
        text = cfg_path.read_text()
    except FileNotFoundError:
        raise ConfigError(source, "", "configuration file not found") from None
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read the configuration: {exc}") from None
    data, lines = load_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1", "",
                          f"expected a mapping with model, budgets and solvers, got {describe(data)}")
    overridden = []
    for item in overrides:
        key, value = parse_override(item)
        data = apply_override(data, key, value)
        overridden.append(key)
    cfg = Config(cfg_path, data, lines, overridden)
    try:
        cfg.spec = RunSpec.model_validate(data)
    except ValidationError as exc:
        raise first_error(cfg, exc) from None
    check(cfg, catalog.MODES if any_budget else None)
    return cfg


# ---- pydantic's errors, worded ------------------------------------------------------------------
def first_error(cfg: Config, exc: ValidationError) -> ConfigError:
    """The error written first in the file (the deepest field on a line), in the words users read."""
    def order(item: tuple[tuple, str]) -> tuple[int, int]:
        where = cfg.where(item[0])
        line = where.rsplit(":", 1)[1] if ":" in where else ""
        return (int(line) if line.isdigit() else 0, -len(item[0]))

    path, message = min((_message(_field_path(e["loc"]), e) for e in exc.errors()), key=order)
    return cfg.error(path, message)


def _field_path(loc: tuple) -> tuple:
    # a union's tag follows the field holding the union (``model``, ``device``, a list item)
    return tuple(p for i, p in enumerate(loc)
                 if not (p in _TAGS and i > 0 and (loc[i - 1] in ("model", "device") or isinstance(loc[i - 1], int))))


def _message(path: tuple, e: Any) -> tuple[tuple, str]:
    """(field path, message) of one pydantic error."""
    kind, ctx, got = e["type"], e.get("ctx") or {}, e.get("input")
    if kind == "unknown_key":
        return path + (ctx["key"],), e["msg"]
    if kind == "missing":
        return path[:-1], f"missing key {path[-1]!r}" + _HINTS.get(str(path[-1]), "")
    if kind in _KINDS:
        return path, f"expected {_KINDS[kind]}, got {describe(got)}"
    if kind == "union_tag_invalid":  # neither of a union's kinds
        kinds = [_TAG_KINDS.get(t, t) for t in re.findall(r"'([^']*)'", ctx.get("expected_tags", ""))]
        return path, f"expected {' or '.join(sorted(kinds, reverse=True))}, got {describe(got)}"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", ctx.get("expected", ""))
        return path, f"expected one of {choices}, got {describe(got)}"
    if kind in ("greater_than", "greater_than_equal"):
        op, bound = (">", ctx.get("gt")) if kind == "greater_than" else (">=", ctx.get("ge"))
        return path, f"expected a number {op} {bound:g}, got {got!r}"
    if kind == "too_short":
        return path, f"expected at least {ctx.get('min_length')} item(s), got none"
    if kind == "string_too_short":
        return path, "expected a non-empty string"
    if kind == "value_error":
        return path, str(ctx.get("error", e["msg"]))
    return path, e["msg"]


# ---- what types cannot say --------------------------------------------------------------------------
def check(cfg: Config, modes: Collection[str] | None = None) -> None:
    """Raise the first ConfigError of a typed configuration, naming its field and line. A solver's
    options must apply under one of ``modes`` (default: the modes of the config's budgets)."""
    _check_budgets(cfg)
    _check_training(cfg)
    _check_solvers(cfg, run_modes(cfg) if modes is None else modes)
    capture = cfg.data.get("capture", {})  # as written: an explicit key contradicts, a default does not
    if capture.get("compiler") == "inductor" and capture.get("decompositions") == "none":
        raise cfg.error(("capture", "decompositions"), "expected inductor (or no key) with compiler: inductor, "
                                                       "which always applies its own decompositions")
    if cfg.spec.capture.meta and cfg.data.get("verify", {}).get("gradients"):
        raise cfg.error(("verify", "gradients"), "a meta capture has no real weights to run a step "
                                                 "with: set verify.gradients: false or capture.meta: false")
    if cfg.is_graph:
        _check_graph(cfg)
    else:
        _check_factory(cfg)


def _check_training(cfg: Config) -> None:
    """The ``training:`` section as ``make_request`` reads it; the error names its key."""
    try:
        make_request(training=cfg.spec.training)
    except RequestError as exc:
        raise cfg.error(tuple(exc.field.split(".")), str(exc).split(": ", 1)[-1]) from None


def _check_budgets(cfg: Config) -> None:
    for i, entry in enumerate(cfg.spec.budgets):
        parts = [(("budgets", i, "peak"), entry.peak), (("budgets", i, "device"), entry.device),
                 (("budgets", i, "saved"), entry.saved)] if isinstance(entry, PeakBudget) else [(("budgets", i), entry)]
        if isinstance(entry, PeakBudget) and (entry.peak is None) == (entry.device is None):
            raise cfg.error(("budgets", i), "expected one of 'peak' (the graph's step peak) or 'device' (the "
                                            "device's memory, e.g. {device: 80GiB}) in a budget mapping")
        for where, raw in parts:
            if raw is None:
                continue
            try:
                parsed = parse_budget(raw)
            except ValueError as exc:
                raise cfg.error(where, str(exc)) from None
            if where[-1] in ("peak", "device") and isinstance(parsed, Fraction):
                raise cfg.error(where, f"a {where[-1]} budget is bytes (e.g. '700KiB' or 716800), not a "
                                       f"fraction: got {raw}")
            if isinstance(raw, int) and raw < 1024:
                raise cfg.error(where, f"{raw} would be {raw} bytes: write a fraction as a float "
                                       f"(e.g. {float(raw)}) or bytes with a unit (e.g. '{raw}MiB')")
    labels = [b.label for b in cfg.budgets]
    for i, lab in enumerate(labels):
        if labels.index(lab) != i:
            raise cfg.error(("budgets", i), f"budget {lab} is listed twice")


def graph_request(cfg: Config) -> SolveRequest:
    """The run's graph-level settings as a request: what every pair's request extends
    (``request.request_for``)."""
    spec = cfg.spec
    return make_request(device=cfg.device, costs=spec.costs, rng_replay=spec.rng_replay,
                        count_input_bytes=spec.count_input_bytes, offload=spec.offload, training=spec.training)


def run_modes(cfg: Config) -> list[str]:
    """The solve modes of the config's budgets: saved bytes, peak, or both."""
    kinds = {catalog.SAVED if b.peak_limit is None else catalog.PEAK for b in cfg.budgets}
    return [m for m in catalog.MODES if m in kinds]


def _check_solvers(cfg: Config, modes: Collection[str]) -> None:
    """Each solver entry as the API checks a partitioner's settings (``make_request``), its
    options against the run's kinds of budget; the device and graph settings with them."""
    names = catalog.names()
    try:
        base = graph_request(cfg)
    except RequestError as exc:
        raise cfg.error(("device",) if exc.field == "device" else tuple(exc.field.split(".")), str(exc)) from None
    for i, entry in enumerate(cfg.spec.solvers):
        name = entry if isinstance(entry, str) else entry.name
        where = ("solvers", i) if isinstance(entry, str) else ("solvers", i, "name")
        if name not in names:
            raise cfg.error(where, f"unknown solver {name!r}; expected one of: {', '.join(names)}")
        options = {} if isinstance(entry, str) else dict(entry.model_extra or {})
        try:
            request_for(base, None if name == DEFAULT_SOLVER else name, options=options, option_modes=modes)
        except RequestError as exc:
            key = exc.field.removeprefix("options.")
            path = {"device": ("device",), "solver": where}.get(exc.field, ("solvers", i, key) if
                                                               exc.field.startswith("options.") else
                                                               tuple(exc.field.split(".")))
            raise cfg.error(path, str(exc)) from None
    seen: dict[str, int] = {}
    for solver in cfg.solvers:
        if solver.label in seen:
            raise cfg.error(("solvers", solver.index), f"solver {solver.label!r} is listed twice; give one "
                                                       "of them a distinct 'label'")
        seen[solver.label] = solver.index


def _check_graph(cfg: Config) -> None:
    gpath = cfg.graph_path
    if not gpath.is_file():
        raise cfg.error(("model", "graph"), f"graph file {str(gpath)!r} not found; expected a "
                                            "Checkmate graph JSON (relative paths start at the config's folder)")
    try:
        importlib.import_module("opt_remat.formats.checkmate_graph")
    except ImportError:
        raise cfg.error(("model", "graph"), "loading Checkmate graphs needs opt_remat.formats.checkmate_graph, "
                                            "which this install does not have") from None


def _check_factory(cfg: Config) -> None:
    cfg.factory()
    model = cfg.spec.model
    if model.inputs is None:  # type: ignore[union-attr]
        module, _, name = model.factory.partition(":")  # type: ignore[union-attr]
        if not (module == "opt_remat.models" and name in BUILTIN_FACTORIES):
            raise cfg.error(("model",), "missing key 'inputs': expected a list of {shape, dtype, low, high} "
                                        "(only the built-in factories have default inputs)")
    for i, spec in enumerate(model.inputs or []):  # type: ignore[union-attr]
        dtype = spec.dtype or cfg.dtype
        low, high = spec.low, spec.high
        if dtype in INT_DTYPES and dtype != "bool":
            if high is None:
                raise cfg.error(("model", "inputs", i), f"missing key 'high': an {dtype} input needs "
                                                        "'high' (exclusive upper bound of random ints)")
            if float(low or 0) >= float(high):
                raise cfg.error(("model", "inputs", i, "high"), f"expected high > low ({low or 0}), got {high}")
            for k, v in (("low", low), ("high", high)):
                if v is not None and float(v) != int(v):
                    raise cfg.error(("model", "inputs", i, k), f"expected an integer for an {dtype} input, got {v}")
