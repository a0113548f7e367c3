"""``opt-remat run``: capture once, solve every (budget, solver) pair, verify, and write reports.

The capture is torch.compile's own (dynamo, then AOTAutograd with the configured decompositions),
so the graph solved here is the graph ``opt_remat.backend(plan=...)`` later sees: the plans written
to ``OUT/plans/`` apply in training. Results are written as each pair completes (``results.json``,
``results.csv``, atomically), so an interrupted run keeps them and a rerun skips the pairs already
done. Solving can run in parallel processes (``jobs``); capture and verification stay in this one.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import csv
import io
import json
import math
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from solvers import Plan, Problem
from solvers.budget import format_bytes
from solvers.plans_io import graph_hash, values_of_problem

from .config import FLOAT_DTYPES, TORCH_SOLVER, BudgetSpec, Config, SolverSpec, resolved_dict

RESULTS_FORMAT = 1
CSV_FIELDS = [
    "budget", "budget_bytes", "solver", "solver_name", "options", "status", "saved_bytes",
    "measured_saved_bytes", "peak_budget", "peak_bytes", "peak_gradient_bytes", "recompute_cost", "objective", "bound", "gap", "solve_time_s",
    "n_saved", "n_recomputed", "verified", "bitwise", "max_rel_error", "loss", "loss_reference",
    "verify_s", "min_feasible_bytes", "plan_file", "message", "error",
]


class RunError(RuntimeError):
    """A run that cannot go on (not a configuration error)."""


class SolveRefused(RunError):
    """A pair with no plan for a reason the user can change: an infeasible budget, a solver
    without the asked mode."""


# ---- small helpers -------------------------------------------------------------------------
def write_atomic(path: Path, data: str | bytes) -> None:
    """Write via a temporary file in the same folder and a rename: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def format_seconds(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


@contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch's deprecation chatter that deep copies of FX graphs print."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else text}"[:300]


# ---- materialize: model, inputs, capture, problem ------------------------------------------
@dataclass
class Workload:
    """What one run solves: the problem, and for torch models the captured graph to verify with."""
    problem: Problem
    graph_hash: str
    profile: Any
    model: Any = None  # torch.nn.Module
    inputs: tuple = ()
    loss_fn: Callable[[Any], Any] | None = None
    prepared: Any = None  # JointGraph with the prepared (DCE/CSE'd) joint module
    top_anchor_bytes: int | None = None
    capture_s: float = 0.0
    reference: Any = None  # the save-all training step, computed on first use
    values: list[dict[str, Any]] = field(default_factory=list)  # canonical values (plan files)
    graph_id: str = ""  # canonical id of the graph: what a plan file is matched by
    notes: list[str] = field(default_factory=list)

    def budget_bytes(self, spec: BudgetSpec) -> int | None:
        from .solve import resolve_budget
        anchor = None if self.top_anchor_bytes is None else (lambda: self.top_anchor_bytes)
        return resolve_budget(self.problem, spec.saved_raw, top_anchor=anchor)


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
    from . import models

    specs = cfg.data["model"].get("inputs")
    gen = torch.Generator().manual_seed(cfg.seed)
    if specs is None:
        torch.manual_seed(cfg.seed)
        name = cfg.data["model"]["factory"].partition(":")[2]
        try:
            inputs = models.example_inputs(name, model)
        except ValueError as exc:
            raise cfg.error(("model",), f"missing key 'inputs' ({exc})") from None
        return tuple(i.to(getattr(torch, cfg.dtype)) if i.is_floating_point() else i for i in inputs)
    out = []
    for spec in specs:
        dtype_name = spec.get("dtype", cfg.dtype)
        dtype = getattr(torch, dtype_name)
        shape = tuple(spec["shape"])
        low, high = spec.get("low"), spec.get("high")
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
            out.append(torch.randint(int(low or 0), int(high), shape, generator=gen, dtype=dtype))
    return tuple(out)


def materialize(cfg: Config) -> Workload:
    """The one graph of the configured step (``opt-remat run`` solves a single graph)."""
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
    from .costs import get_profile

    profile = get_profile(cfg.device)
    if cfg.is_graph:
        import importlib
        checkmate = importlib.import_module("solvers.checkmate")
        try:
            problem = checkmate.load_graph(cfg.graph_path)
        except Exception as exc:
            raise cfg.error(("model", "graph"), f"cannot load the graph: {_first_line(exc)}") from None
        return [Workload(problem, graph_hash(problem), profile, values=values_of_problem(problem),
                         graph_id=graph_hash(problem))]

    import torch

    from .canonical import canonical_values, graph_id
    from .capture import capture_graphs

    factory = cfg.factory()
    kwargs = dict(cfg.data["model"].get("kwargs", {}))
    torch.manual_seed(cfg.seed)
    loss_fn = make_loss(cfg.loss)
    dtype = getattr(torch, cfg.dtype)
    if cfg.meta:
        with torch.device("meta"):  # for the built-in inputs' sizes only: allocates nothing
            shell = _build_model(cfg, factory, kwargs)
        model, inputs = None, make_inputs(cfg, shell)
        what, where = "tracing the training step with fake tensors", ("model", "inputs")
        source: Any = lambda: factory(**kwargs).train()  # noqa: E731
    else:
        model = _build_model(cfg, factory, kwargs).to(dtype).train()
        inputs = make_inputs(cfg, model)
        _dry_run(cfg, model, inputs, loss_fn)
        what, where, source = "capturing the training step with torch.compile", ("model", "factory"), model
    start = time.perf_counter()
    with quiet_torch():
        try:
            graphs = capture_graphs(source, inputs, compiler=cfg.compiler, decompositions=cfg.decompositions,
                                    meta=cfg.meta, dtype=dtype if cfg.meta else None, seed=cfg.seed)
        except Exception as exc:
            raise cfg.error(where, f"{what} failed{' (do the inputs fit the model?)' if cfg.meta else ''}: "
                                   f"{_first_line(exc)}") from None
        if not graphs:
            raise cfg.error(("model", "factory"), "torch.compile produced no joint graph: nothing of the "
                                                  "step needs a backward")
        works = []
        for joint in graphs:
            prepared, problem, top = _problem_of(joint, profile, cfg.costs)
            works.append(Workload(problem, graph_hash(problem), profile, model=model, inputs=inputs,
                                  loss_fn=loss_fn, prepared=prepared, top_anchor_bytes=top,
                                  values=canonical_values(prepared.module, prepared.input_roles),
                                  graph_id=""))
            works[-1].graph_id = graph_id(prepared.module, works[-1].values)
    capture_s = time.perf_counter() - start
    for w in works:
        w.capture_s = capture_s
    return works


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
                                                 f"{_first_line(exc)}") from None
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
        raise cfg.error(("model", "kwargs"), f"the factory failed: {_first_line(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise cfg.error(("model", "factory"), f"expected a factory returning a torch.nn.Module, got "
                                              f"{type(model).__name__}")
    return model


def _problem_of(joint: Any, profile: Any, costs: str = "roofline") -> tuple[Any, Problem, int]:
    """The prepared joint graph, its problem, and the saved bytes of torch's default min-cut on it
    (the top anchor of fractional budgets)."""
    from .build import classify, problem_from_joint
    from .torch_reference import torch_runtime_optimized_saved

    prepared, problem = problem_from_joint(joint, device=profile, costs=costs)
    anchor = prepared.copy()  # torch's partitioner annotates the graph it is given
    anchor_info = classify(anchor.module, anchor.num_fwd_outputs, anchor.static_lifetime_input_indices)
    top = problem.saved_bytes(torch_runtime_optimized_saved(anchor.module, anchor_info))
    return prepared, problem, top


# ---- solving (pure Python: runs in worker processes) ----------------------------------------
@contextmanager
def _keep_sigint() -> Iterator[None]:
    """Put Python's Ctrl-C handler back after a solve: OR-Tools' CP-SAT installs its own C handler
    (which ends the process without Python's clean-up) and leaves it installed."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGINT, previous)


PEAK_SOLVERS = ("cpsat", "milp", "mincut")  # the solvers with a peak-budget mode


def _default_lam(work: Any) -> float | None:
    """The drop-in path's ``lam="auto"`` on this workload's device."""
    from .api import auto_lam
    return None if getattr(work.profile, "bandwidth", None) is None else auto_lam(work.profile)


def solve_pair(problem: Problem, solver: str, budget_bytes: int | None, options: dict[str, Any],
               peak_budget: int | None = None, *, count_gradients: bool = True,
               default_lam: float | None = None) -> dict[str, Any]:
    """One (budget, solver) pair: a plan, or why there is none. Picklable in and out.
    ``default_lam``: the default path's min-cut plan joins a peak solve's candidates."""
    from .solve import choose_peak_plan, choose_plan

    if peak_budget is not None:
        if solver not in PEAK_SOLVERS:
            return {"status": "skipped", "error": f"{solver} has no peak-budget mode (use one of "
                                                  f"{', '.join(PEAK_SOLVERS)})", "wall_s": None, "warnings": []}
        with _keep_sigint():
            return _solve_recorded(lambda: choose_peak_plan(
                problem, solver, peak_budget, budget_bytes, options, default_lam=default_lam,
                count_gradients=count_gradients))
    with _keep_sigint():
        return _solve_recorded(lambda: choose_plan(problem, solver, budget_bytes, options))


def _solve_recorded(make_plan: Callable[[], Plan]) -> dict[str, Any]:
    """Run one solve: its plan, or why there is none, with its wall time and warnings."""
    from .solve import BudgetError, PeakBudgetError

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out: dict[str, Any] = {"plan": make_plan()}
        except BudgetError as exc:
            out = {"status": "infeasible", "error": str(exc), "min_feasible_bytes": exc.min_feasible_bytes}
        except PeakBudgetError as exc:
            out = {"status": "infeasible", "error": str(exc), "min_peak_bytes": exc.min_peak}
        except Exception as exc:
            out = {"status": "error", "error": _first_line(exc), "traceback": traceback.format_exc(limit=5)}
    out["wall_s"] = time.perf_counter() - start
    out["warnings"] = [str(w.message) for w in caught if not issubclass(w.category, (FutureWarning, DeprecationWarning))]
    return out


def solve_torch_pair(work: Workload, budget_bytes: int | None, peak_budget: int | None = None) -> dict[str, Any]:
    """torch's own partitioner's choice on the captured graph (needs the FX graph: runs here)."""
    if peak_budget is not None:
        return {"status": "skipped", "error": "torch's partitioner has no peak budget (its "
                                              "activation_memory_budget bounds saved bytes)"}
    from . import torch_reference
    from .build import classify

    fn = getattr(torch_reference, "torch_plan", None)
    if fn is None:
        return {"status": "skipped", "error": "the torch baseline is not available in this install "
                                              "(opt_remat.torch_reference.torch_plan)"}
    if work.prepared is None:
        return {"status": "skipped", "error": "the torch baseline needs a captured torch model, not a graph file"}

    def make_plan() -> Plan:
        joint = work.prepared.copy()
        info = classify(joint.module, joint.num_fwd_outputs, joint.static_lifetime_input_indices)
        return fn(joint.module, info, work.problem, budget_bytes)

    with quiet_torch():
        return _solve_recorded(make_plan)


# ---- verification (in this process) ---------------------------------------------------------
def measure_plan(work: Workload, plan: Plan) -> int:
    """Bytes the forward really hands to the backward when the plan is lowered."""
    from .build import classify
    from .lower import lower_plan
    from .verify import measured_saved_bytes

    with quiet_torch():
        joint = work.prepared.copy()
        info = classify(joint.module, joint.num_fwd_outputs, joint.static_lifetime_input_indices)
        fw, _ = lower_plan(joint.module, plan, num_fwd_outputs=joint.num_fwd_outputs,
                           static_lifetime_input_nodes=info.static_lifetime_input_nodes)
        return measured_saved_bytes(fw, joint.num_fwd_outputs)


class _PlanPartition:
    """A partition_fn that lowers one given plan (as it is, even one that breaks opt-remat's bans,
    like torch's baseline recomputing random ops) on the graph it was solved for."""

    def __init__(self, plan: Plan, expected_hash: str, profile: Any) -> None:
        self.plan, self.expected_hash, self.profile = plan, expected_hash, profile
        self.calls = 0

    def __call__(self, joint_module: Any, joint_inputs: Any, *args: Any, num_fwd_outputs: int,
                 static_lifetime_input_indices: list[int] | None = None, **kwargs: Any) -> Any:
        from .build import build_problem, classify, prepare_joint
        from .lower import lower_plan

        self.calls += 1
        joint_module = prepare_joint(joint_module)
        info = classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
        problem = build_problem(joint_module, num_fwd_outputs=num_fwd_outputs, device=self.profile, node_info=info)
        if graph_hash(problem) != self.expected_hash:
            raise RunError(f"the training step's graph (hash {graph_hash(problem)}) is not the captured one "
                           f"({self.expected_hash})")
        return lower_plan(joint_module, self.plan, num_fwd_outputs=num_fwd_outputs,
                          static_lifetime_input_nodes=info.static_lifetime_input_nodes)


def verify_gradients(cfg: Config, work: Workload, plan: Plan) -> dict[str, Any]:
    """A training step of the model compiled with the plan (lowered on torch.compile's own joint
    graph, with the configured compiler), against torch's save-all partition: loss and gradients."""
    import torch

    import opt_remat
    from .verify import compare_steps, save_all_backend, training_step

    with quiet_torch():
        if work.reference is None:
            torch._dynamo.reset()
            # inductor's random ops and fusions differ from eager's: compare like with like
            ref_be = (save_all_backend(cfg.decompositions) if cfg.compiler == "eager"
                      else opt_remat.backend("save-all", compiler="inductor"))
            work.reference = training_step(work.model, work.inputs, ref_be, seed=cfg.seed, loss_fn=work.loss_fn)
        torch._dynamo.reset()
        pfn = _PlanPartition(plan, work.graph_hash, work.profile)
        be = opt_remat.backend(compiler=cfg.compiler, decompositions=cfg.decompositions, partition_fn=pfn)  # type: ignore[arg-type]
        try:
            step = training_step(work.model, work.inputs, be, seed=cfg.seed, loss_fn=work.loss_fn)
        finally:
            torch._dynamo.reset()
    check = compare_steps(step, work.reference)
    notes = []
    if pfn.calls != 1:
        notes.append(f"the step compiled to {pfn.calls} graphs")
    banned = list((plan.extra or {}).get("recomputes_banned") or [])
    if banned:
        notes.append(f"recomputes {len(banned)} value(s) opt-remat never recomputes (e.g. {', '.join(banned[:2])})")
    ok = check.ok and check.max_rel_error <= cfg.tolerance and pfn.calls == 1
    return {"verified": ok, "bitwise": check.bitwise, "max_rel_error": check.max_rel_error,
            "loss": check.loss_a, "loss_reference": check.loss_b, "verify_note": "; ".join(notes)}


# ---- plan files -------------------------------------------------------------------------------
def clean_module(path: str) -> str:
    """dynamo's ``L['self'].layers[0].fc`` -> ``layers.0.fc``."""
    m = re.sub(r"^L\['self'\]\.?", "", path or "")
    m = re.sub(r"\['([^']*)'\]", r".\1", m)
    m = re.sub(r"\[(\d+)\]", r".\1", m)
    return m.lstrip(".")


def short_op(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] in ("aten", "prims") else op


def node_details(problem: Problem, plan: Plan) -> dict[str, dict[str, Any]]:
    """Per saved or recomputed value: its op, module, bytes and cost (what ``opt-remat show`` prints)."""
    nodes = {}
    for name in sorted(plan.saved | plan.recomputed, key=problem.index.__getitem__):
        node = problem.by_name[name]
        counted = problem.counts_memory(node.storage_id)
        nodes[name] = {"op": node.op, "module": clean_module(node.module), "role": node.role.value,
                       "bytes": node.bytes, "storage": node.storage_id,
                       "storage_bytes": problem.storage_size[node.storage_id] if counted else 0,
                       "cost": problem.recompute_cost_of(name)}
    return nodes


def plan_entry(work: Workload, plan: Plan, **extra: Any) -> dict[str, Any]:
    """One graph's plan as a plan-file entry, with the details ``opt-remat show`` prints."""
    from solvers.liveness import simulate_plan
    from solvers.plans_io import graph_entry

    entry = graph_entry(work.problem, plan, work.values, work.graph_id)
    curve = simulate_plan(work.problem, plan.saved)
    entry["peak_bytes"] = curve.peak
    entry["peak_gradient_bytes"] = curve.peak_gradients
    entry["nodes"] = node_details(work.problem, plan)
    entry.update({k: v for k, v in extra.items() if v is not None})
    return entry


def made_for(cfg: Config, work: Workload) -> dict[str, Any]:
    """What a plan file's plans were made for: model, inputs, capture settings, device profile."""
    desc = _model_desc(cfg)
    inputs = [f"{str(i.dtype).removeprefix('torch.')}{list(i.shape)}" for i in work.inputs
              if hasattr(i, "shape")]
    out = {"config": str(cfg.path.resolve()), "model": desc, "device": fingerprint(work, cfg)["device"]}
    if not cfg.is_graph:
        out.update({"dtype": cfg.dtype, "inputs": inputs,
                    "capture": {"compiler": cfg.compiler, "decompositions": cfg.decompositions if cfg.compiler == "eager"
                                else "inductor", "meta": cfg.meta}})
    return out


def write_plan(path: Path, cfg: Config, works: Sequence[Workload], plans: Sequence[Plan], **extra: Any) -> None:
    """A plan file holding one plan per captured graph (``extra`` goes into each entry)."""
    from solvers.plans_io import plan_document

    from .plans import versions

    entries = [plan_entry(w, p, **extra) for w, p in zip(works, plans)]
    doc = plan_document(entries, {**made_for(cfg, works[0]), "apply": apply_hint(cfg, path),
                                  "versions": versions()})
    write_atomic(path, json.dumps(_jsonable(doc), indent=1) + "\n")


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "value") and isinstance(getattr(x, "value"), (str, int)):
        return x.value
    return str(x)


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


# ---- the mincut hull ----------------------------------------------------------------------------
def mincut_hull(problem: Problem, max_cuts: int = 48) -> list[tuple[int, float]]:
    """The (saved bytes, recompute cost) points of the parametric min-cut: every plan that is
    optimal for ``saved + lam * cost`` for some ``lam``, found by bisecting on the breakpoints."""
    from solvers.mincut import cut_objective, lam_range, solve_mincut

    lo, hi = lam_range(problem)
    cuts = 0

    def cut(lam: float) -> Plan:
        nonlocal cuts
        cuts += 1
        return solve_mincut(problem, lam)

    try:
        a, b = cut(lo), cut(hi)
    except Exception:
        return []
    found = {(a.saved_bytes, a.recompute_cost), (b.saved_bytes, b.recompute_cost)}
    stack = [(a, b)]
    while stack and cuts < max_cuts:
        pa, pb = stack.pop()
        dc = pa.recompute_cost - pb.recompute_cost
        if dc <= 1e-15 * max(1.0, abs(pa.recompute_cost)):
            continue
        wa, wb = cut_objective(problem, pa, 0.0), cut_objective(problem, pb, 0.0)
        lam = (wb - wa) / dc
        if not (lam > 0 and math.isfinite(lam)):
            continue
        pm = cut(lam)
        if cut_objective(problem, pm, lam) >= wa + lam * pa.recompute_cost - 1e-9 * max(1.0, abs(wa)):
            continue  # pa and pb are adjacent vertices of the hull
        found.add((pm.saved_bytes, pm.recompute_cost))
        stack += [(pa, pm), (pm, pb)]
    return sorted(found)


# ---- results -------------------------------------------------------------------------------
def fingerprint(work: Workload, cfg: Config) -> dict[str, Any]:
    """What results depend on besides the pair: a rerun resumes only when these agree."""
    return {"graph_hash": work.graph_hash, "graph_nodes": len(work.problem.nodes),
            "compiler": None if cfg.is_graph else cfg.compiler,
            "device": {"name": work.profile.name, "peak_flops": work.profile.peak_flops,
                       "bandwidth": work.profile.bandwidth}}


def load_results(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("results"), list) else None


def record_key(rec: dict[str, Any]) -> tuple[str, str]:
    return (str(rec["budget"]), str(rec["solver"]))


def is_done(rec: dict[str, Any]) -> bool:
    return rec.get("status") not in ("error", "skipped", None)


def _options_key(options: dict[str, Any]) -> str:
    return json.dumps(_jsonable(options), sort_keys=True)


def csv_text(records: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for rec in records:
        row = dict(rec)
        row["options"] = json.dumps(rec.get("options", {}), sort_keys=True)
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS})
    return buf.getvalue()


def verified_text(rec: dict[str, Any], *, notes: bool = True) -> str:
    v = rec.get("verified")
    if v is None:
        return "-"
    if v:
        text = "bitwise" if rec.get("bitwise") else f"ok ({rec.get('max_rel_error', 0):.1e})"
    else:
        err = rec.get("max_rel_error")
        text = "FAIL" + (f" ({err:.1e})" if isinstance(err, float) else "")
    return text + (f": {rec['verify_note']}" if notes and rec.get("verify_note") else "")


def _budget_bytes_text(rec: dict[str, Any]) -> str:
    saved = format_bytes(rec.get("budget_bytes")) if rec.get("budget_bytes") is not None else ""
    if rec.get("peak_budget") is None:
        return saved or "-"
    return f"peak {format_bytes(rec['peak_budget'])}" + (f", saved {saved}" if saved else "")


def summary_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    rows = []
    last = None
    for rec in records:
        first = rec["budget"] != last
        last = rec["budget"]
        measured = rec.get("measured_saved_bytes")
        rows.append({
            "budget": str(rec["budget"]) if first else "",
            "bytes": _budget_bytes_text(rec) if first else "",
            "solver": rec["solver"],
            "status": rec.get("status", ""),
            "saved": format_bytes(rec.get("saved_bytes")),
            "measured": "-" if measured is None else (
                format_bytes(measured) + ("" if measured == rec.get("saved_bytes") else " (!)")),
            "step peak": format_bytes(rec.get("peak_bytes")),
            "of it grads": format_bytes(rec.get("peak_gradient_bytes")),
            "recompute": format_seconds(rec.get("recompute_cost")),
            "solve": format_seconds(rec.get("solve_time_s")),
            "gap": "-" if rec.get("gap") is None else f"{rec['gap']:.2%}",
            "verified": verified_text(rec, notes=False) + (" *" if _note(rec) else ""),
        })
    return rows


def _note(rec: dict[str, Any]) -> str:
    if rec.get("status") in ("error", "skipped", "infeasible"):
        return str(rec.get("error") or rec["status"])
    return str(rec.get("verify_note") or "")


def summary_table(records: Sequence[dict[str, Any]]) -> str:
    from .report import table
    rows = summary_rows(records)
    if not rows:
        return "(no results)"
    text = table(rows, list(rows[0]))
    notes = [f"  * budget {r['budget']} {r['solver']}: {_note(r)}" for r in records if _note(r)]
    return text + ("\n" + "\n".join(notes) if notes else "")


def progress_line(i: int, n: int, rec: dict[str, Any]) -> str:
    head = f"[{i}/{n}] budget {rec['budget']} ({_budget_bytes_text(rec)}) {rec['solver']}:"
    status = rec.get("status")
    if "saved_bytes" not in rec or rec.get("saved_bytes") is None:
        return f"{head} {status}: {rec.get('error', '')}"
    parts = [f"{status}", f"saved {format_bytes(rec['saved_bytes'])}", f"step peak {format_bytes(rec.get('peak_bytes'))}",
             f"recompute {format_seconds(rec.get('recompute_cost'))}",
             f"solved in {format_seconds(rec.get('solve_time_s'))}"]
    if rec.get("gap") is not None:
        parts.append(f"gap {rec['gap']:.2%}")
    if rec.get("measured_saved_bytes") is not None:
        parts.append(f"measured {format_bytes(rec['measured_saved_bytes'])}")
    if rec.get("verified") is not None:
        parts.append(f"grads {verified_text(rec)}")
    return f"{head} " + ", ".join(parts)


# ---- the run ----------------------------------------------------------------------------------
@dataclass
class RunSummary:
    out_dir: Path
    records: list[dict[str, Any]]
    ran: int
    skipped: int
    failed_verification: int


def _executor(kind: str, jobs: int):
    if kind == "ray":
        import ray  # checked by the caller
        return _RayPool(ray, jobs)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)


class _RayPool:
    """The parts of an Executor the runner uses, on Ray tasks."""

    def __init__(self, ray: Any, jobs: int) -> None:
        self.ray = ray
        if not ray.is_initialized():
            ray.init(num_cpus=jobs, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
        self.remote = ray.remote(solve_pair)
        self.futures: dict[Any, cf.Future] = {}

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        self.futures[self.remote.remote(*args, **kwargs)] = fut
        return fut

    def drain(self) -> Iterator[cf.Future]:
        pending = list(self.futures)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for ref in done:
                fut = self.futures[ref]
                try:
                    fut.set_result(self.ray.get(ref))
                except Exception as exc:  # a task that died
                    fut.set_exception(exc)
                yield fut

    def __enter__(self) -> "_RayPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def run(cfg: Config, *, jobs: int = 1, executor: str = "process", echo: Callable[[str], None] = print,
        work: Workload | None = None) -> RunSummary:
    """Solve every (budget, solver) pair of ``cfg`` that the output folder does not already hold."""
    if work is None:
        echo(f"capturing {cfg.name} ...")
        work = materialize(cfg)
    out_dir = cfg.output_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise cfg.error(("output", "dir"), f"{out_dir} exists and is not a folder")
    results_path = out_dir / "results.json"
    fp = fingerprint(work, cfg)
    previous = load_results(results_path)
    if previous is not None and previous.get("fingerprint") != fp:
        raise cfg.error(("output", "dir"), f"{out_dir} holds results for another graph or device "
                                           f"(graph {previous.get('fingerprint', {}).get('graph_hash')}, this one "
                                           f"{work.graph_hash}); choose another output.dir or remove that folder")
    budgets = cfg.budgets
    solvers = cfg.solvers
    budget_bytes = {b.label: work.budget_bytes(b) for b in budgets}
    old = {record_key(r): r for r in (previous or {}).get("results", [])}

    records: dict[tuple[str, str], dict[str, Any]] = {}
    pending: list[tuple[BudgetSpec, SolverSpec]] = []
    for b in budgets:
        for s in solvers:
            rec = old.get((b.label, s.label))
            if (rec is not None and is_done(rec) and rec.get("budget_bytes") == budget_bytes[b.label]
                    and _options_key(rec.get("options", {})) == _options_key(s.options)
                    and rec.get("solver_name") == s.name):
                records[(b.label, s.label)] = rec
            else:
                pending.append((b, s))
    order = {(b.label, s.label): (b.index, s.index) for b in budgets for s in solvers}
    kept_old = [r for k, r in old.items() if k not in order]  # pairs no longer in the config stay

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plans").mkdir(exist_ok=True)
    for stale in list(out_dir.glob(".*.tmp")) + list((out_dir / "plans").glob(".*.tmp")):
        stale.unlink(missing_ok=True)  # left by a run killed mid-write
    hull = mincut_hull(work.problem)
    header = {
        "format": RESULTS_FORMAT, "name": cfg.name, "config_file": str(cfg.path.resolve()),
        "config": _jsonable(resolved_dict(cfg)), "fingerprint": fp,
        "problem": {"nodes": len(work.problem.nodes), "candidates": len(work.problem.candidates),
                    "capture_s": work.capture_s, "top_anchor_bytes": work.top_anchor_bytes},
        "mincut_hull": [list(p) for p in hull],
    }

    def flush() -> list[dict[str, Any]]:
        ordered = sorted(records.values(), key=lambda r: order.get(record_key(r), (1 << 30, 0)))
        doc = dict(header, results=_jsonable(ordered + kept_old))
        write_atomic(results_path, json.dumps(doc, indent=1) + "\n")
        if "csv" in cfg.formats:
            write_atomic(out_dir / "results.csv", csv_text(ordered + kept_old))
        return ordered

    skipped = len(records)
    if skipped:
        echo(f"resuming: {skipped} of {len(order)} pairs already in {results_path}")
    echo(f"{cfg.name}: {len(work.problem.nodes)} nodes, {len(pending)} pairs to solve"
         + (f" with {jobs} {executor} workers" if jobs > 1 else ""))
    flush()
    done = 0
    total = len(pending)

    def finish(b: BudgetSpec, s: SolverSpec, result: dict[str, Any]) -> None:
        nonlocal done
        rec = _record(cfg, work, b, s, budget_bytes[b.label], result, out_dir)
        records[(b.label, s.label)] = rec
        done += 1
        flush()
        echo(progress_line(done, total, rec))

    torch_pairs = [(b, s) for b, s in pending if s.name == TORCH_SOLVER]
    pool_pairs = [(b, s) for b, s in pending if s.name != TORCH_SOLVER]
    if jobs > 1 and len(pool_pairs) > 1:
        pool = _executor(executor, jobs)
        try:
            futures = {pool.submit(solve_pair, work.problem, s.name, budget_bytes[b.label], dict(s.options),
                                   b.peak, count_gradients=b.count_gradients,
                                   default_lam=_default_lam(work)): (b, s) for b, s in pool_pairs}
            for b, s in torch_pairs:
                finish(b, s, solve_torch_pair(work, budget_bytes[b.label], b.peak))
            stream = pool.drain() if isinstance(pool, _RayPool) else cf.as_completed(futures)
            for fut in stream:
                b, s = futures[fut]
                try:
                    result = fut.result()
                except Exception as exc:  # the worker died
                    result = {"status": "error", "error": _first_line(exc), "wall_s": None, "warnings": []}
                finish(b, s, result)
        except BaseException:  # Ctrl-C: do not wait for the solves still running
            if isinstance(pool, cf.Executor):
                pool.shutdown(wait=False, cancel_futures=True)
            raise
        else:
            if isinstance(pool, cf.Executor):
                pool.shutdown(wait=True)
    else:
        for b, s in pending:
            if s.name == TORCH_SOLVER:
                finish(b, s, solve_torch_pair(work, budget_bytes[b.label], b.peak))
            else:
                finish(b, s, solve_pair(work.problem, s.name, budget_bytes[b.label], dict(s.options), b.peak,
                                        count_gradients=b.count_gradients, default_lam=_default_lam(work)))

    ordered = flush()
    if "plot" in cfg.formats:
        from .plots import memory_plot, pareto_plot
        pareto_plot(ordered, hull, out_dir / "pareto.png", title=f"{cfg.name}: saved memory vs recompute")
        forward_ends: dict[str, dict[str, int]] = {}
        memory_plot(memory_curves(work.problem, ordered, out_dir, forward_ends), out_dir / "memory.png",
                    title=f"{cfg.name}: live memory during the step (simulated)",
                    forward_ends=forward_ends)
    table = summary_table(ordered)
    if cfg.costs == "profile" and work.prepared is not None:  # both estimates, per op kind
        table += "\n\nrecompute costs per op kind (costs: profile)\n" + _cost_comparison(work)
    if "table" in cfg.formats:
        write_atomic(out_dir / "summary.txt", table + "\n")
    echo("")
    echo(table)
    echo(f"\nresults in {out_dir}")
    # the torch baseline is measured, not trusted: its failures are reported, not a failed run
    failed = sum(1 for r in ordered if r.get("verified") is False and r.get("solver_name") != TORCH_SOLVER)
    return RunSummary(out_dir, ordered, total, skipped, failed)


def _cost_comparison(work: Workload) -> str:
    """The measured costs of a ``costs: profile`` run beside the roofline estimate, per op kind."""
    from .build import build_problem
    from .report import cost_table

    prepared = work.prepared
    roofline = build_problem(prepared.module, num_fwd_outputs=prepared.num_fwd_outputs,
                             static_lifetime_input_indices=prepared.static_lifetime_input_indices,
                             device=work.profile)
    return cost_table(roofline, work.problem)


def memory_curves(problem: Problem, records: Sequence[dict[str, Any]], out_dir: Path,
                  forward_ends: dict[str, dict[str, int]] | None = None) -> dict[str, dict[str, list[int]]]:
    """Per budget, per solver: the simulated live bytes at every step of the training step (plans
    read back from their files, so resumed results are plotted too). ``forward_ends`` (if given)
    gets each curve's number of forward steps."""
    from solvers.liveness import simulate_plan
    from solvers.plans_io import read_plan_file

    curves: dict[str, dict[str, list[int]]] = {}
    for rec in records:
        if not rec.get("plan_file") or rec.get("saved_bytes") is None:
            continue
        try:
            saved = read_plan_file(out_dir / rec["plan_file"])["graphs"][0]["saved"]
        except (OSError, ValueError):
            continue  # a plan file removed by hand: its curve is left out
        curve = simulate_plan(problem, saved)
        curves.setdefault(str(rec["budget"]), {})[str(rec["solver"])] = [b for _, _, b in curve.steps]
        if forward_ends is not None:
            forward_ends.setdefault(str(rec["budget"]), {})[str(rec["solver"])] = sum(
                1 for phase, _, _ in curve.steps if phase == "forward")
    return curves


def _record(cfg: Config, work: Workload, b: BudgetSpec, s: SolverSpec, budget_bytes: int | None,
            result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "budget": b.label, "budget_raw": b.raw, "budget_bytes": budget_bytes, "peak_budget": b.peak,
        "solver": s.label,
        "solver_name": s.name, "options": dict(s.options),
    }
    plan: Plan | None = result.get("plan")
    if plan is None:
        rec.update({"status": result.get("status", "error"), "error": result.get("error"),
                    "min_feasible_bytes": result.get("min_feasible_bytes"),
                    "min_peak_bytes": result.get("min_peak_bytes"),
                    "solve_time_s": result.get("wall_s")})
        return rec
    plan_file = out_dir / "plans" / f"{_safe_name(b.label)}__{_safe_name(s.label)}.json"
    from solvers.liveness import simulate_plan
    curve = simulate_plan(work.problem, plan.saved)
    rec.update({
        # the whole step's simulated peak of live activations, recomputed values and gradients,
        # and how much of it is gradients
        "peak_bytes": curve.peak, "peak_gradient_bytes": curve.peak_gradients,
        "status": plan.status.value, "saved_bytes": plan.saved_bytes, "recompute_cost": plan.recompute_cost,
        "objective": plan.objective, "bound": plan.bound, "gap": plan.gap, "solve_time_s": plan.solve_time_s,
        "n_saved": len(plan.saved), "n_recomputed": len(plan.recomputed), "message": plan.message,
        "extra": _jsonable(dict(plan.extra or {})),
        "warnings": result.get("warnings") or [], "plan_file": str(plan_file.relative_to(out_dir)),
    })
    write_plan(plan_file, cfg, [work], [plan], budget_spec=b.raw, peak_budget=b.peak)
    start = time.perf_counter()
    if cfg.measure_memory and work.prepared is not None:
        try:
            rec["measured_saved_bytes"] = measure_plan(work, plan)
        except Exception as exc:
            rec["verify_note"] = f"lowering failed: {_first_line(exc)}"
            rec["verified"] = False
    if cfg.verify_gradients and work.model is not None and rec.get("verified") is not False:
        try:
            rec.update(verify_gradients(cfg, work, plan))
        except Exception as exc:
            rec.update({"verified": False, "verify_note": f"training step failed: {_first_line(exc)}"})
    if rec.get("measured_saved_bytes") is not None and rec["measured_saved_bytes"] != plan.saved_bytes:
        rec["verify_note"] = (rec.get("verify_note", "") + " measured saved bytes differ from the prediction").strip()
    if cfg.verify_gradients or cfg.measure_memory:
        rec["verify_s"] = time.perf_counter() - start
    return rec


def _model_desc(cfg: Config) -> dict[str, Any]:
    model = cfg.data["model"]
    if cfg.is_graph:
        return {"graph": str(cfg.graph_path)}
    return {"factory": model["factory"], "kwargs": model.get("kwargs", {}), "inputs": model.get("inputs"),
            "compiler": cfg.compiler, "decompositions": cfg.decompositions, "dtype": cfg.dtype}


def apply_hint(cfg: Config, plan_path: str | Path) -> str | None:
    """The line that applies a saved plan in training."""
    if cfg.is_graph:
        return None
    extra = f', decompositions="{cfg.decompositions}"' if cfg.compiler == "eager" else ""
    return (f'torch.compile(model, backend=opt_remat.backend(plan="{plan_path}", '
            f'compiler="{cfg.compiler}"{extra}))')


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def solve_one(work: Workload, solver: str, spec: BudgetSpec | None,
              options: dict[str, Any] | None = None) -> tuple[Plan, int | None]:
    """``opt-remat solve``: one plan for one graph, solver and budget (saved bytes and/or peak)."""
    bytes_ = work.budget_bytes(spec) if spec is not None else None
    peak = spec.peak if spec is not None else None
    if solver == TORCH_SOLVER:
        result = solve_torch_pair(work, bytes_, peak)
    else:
        result = solve_pair(work.problem, solver, bytes_, dict(options or {}), peak_budget=peak)
    if "plan" not in result:
        kind = SolveRefused if result.get("status") in ("infeasible", "skipped") else RunError
        raise kind(result.get("error") or result.get("status"))
    for w in result.get("warnings") or []:
        print(f"opt-remat: warning: {w}", file=sys.stderr)
    return result["plan"], bytes_
