"""Plan files of a run (``OUT/plans/``, ``opt-remat solve -o``): each plan with what ``opt-remat
show`` prints about its values, and what the plans were made for. The format is ``opt_remat.formats.plan_file``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from solvers import Plan, Problem
from solvers.training import TrainingSetup

from .. import road
from ..formats.plan_file import graph_entry, plan_document, read_plan_file
from ..plans import versions
from ..report import clean_module
from .config import Config, FactoryModel
from .curves import Curve, step_curve
from .offload_view import offload_figures, with_transfers
from .util import jsonable, write_atomic
from .workload import Workload


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


def plan_curve(work: Workload, plan: Plan, setup: TrainingSetup | None,
               cache: dict[frozenset[str], Curve] | None = None) -> tuple[Curve, dict[str, Any]]:
    """A plan's step as the run's records and plan files show it, from one simulation: the rank's
    memory under ``setup`` and, with offload, the offloaded values away and the transfers in flight;
    with the offload figures (``offload_view.FIELDS``; {} without offload). ``cache``: curves
    without offload by saved values, shared by the plans that save the same."""
    key = frozenset(plan.saved)
    curve = None if cache is None else cache.get(key)
    if curve is None:
        curve = step_curve(work.problem, plan.saved, setup)
        if cache is not None:
            cache[key] = curve
    if not (work.request.offload or plan.offloaded):
        return curve, {}
    figures, timeline = offload_figures(work.problem, plan, road.offload_link(work.request), curve)
    return with_transfers(curve, timeline), figures


def plan_entry(work: Workload, plan: Plan, shown: tuple[Curve, dict[str, Any]] | None = None,
               setup: TrainingSetup | None = None, **extra: Any) -> dict[str, Any]:
    """One graph's plan as a plan-file entry, with the details ``opt-remat show`` prints. ``shown``:
    the plan's curve and offload figures as the run made them (``plan_curve``; else made here,
    the rank's whole memory under ``setup``)."""
    entry = graph_entry(work.problem, plan, work.values, work.graph_id)
    curve, offload = shown if shown is not None else plan_curve(work, plan, setup)
    entry["peak_bytes"], entry["peak_gradient_bytes"] = curve.peak, curve.peak_gradients
    entry["peak_by_kind"] = curve.peak_by_kind()
    if offload:
        entry["offload"] = offload
    entry["nodes"] = node_details(work.problem, plan)
    entry.update({k: v for k, v in extra.items() if v is not None})
    return entry


def read_plan_values(path: Path) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """What the (first) plan of a run's plan file saves, recomputes and offloads; a ValueError if it
    cannot be read."""
    try:
        graph = read_plan_file(path)["graphs"][0]
        return tuple(graph["saved"]), tuple(graph.get("recomputed", [])), tuple(graph.get("offloaded", []))
    except (IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a plan file of a run ({exc!r})") from None


def made_for(cfg: Config, work: Workload) -> dict[str, Any]:
    """What a plan file's plans were made for: model, inputs, capture settings, device profile."""
    desc = _model_desc(cfg)
    inputs = [f"{str(i.dtype).removeprefix('torch.')}{list(i.shape)}" for i in work.inputs
              if hasattr(i, "shape")]
    profile = work.profile
    out = {"config": str(cfg.path.resolve()), "model": desc,
           "device": {"name": profile.name, "peak_flops": profile.peak_flops, "bandwidth": profile.bandwidth}}
    if not cfg.is_graph:
        out.update({"dtype": cfg.dtype, "inputs": inputs,
                    "capture": {"compiler": cfg.compiler,
                                "decompositions": cfg.decompositions if cfg.compiler == "eager" else "inductor",
                                "meta": cfg.meta}})
    return out


def write_plan(path: Path, cfg: Config, works: Sequence[Workload], plans: Sequence[Plan],
               shown: Sequence[tuple[Curve, dict[str, Any]]] | None = None, setup: TrainingSetup | None = None,
               **extra: Any) -> None:
    """A plan file holding one plan per captured graph (``extra`` goes into each entry; ``shown``
    and ``setup`` as ``plan_entry`` takes them, one per plan)."""
    entries = [plan_entry(w, p, shown[i] if shown else None, setup, **extra)
               for i, (w, p) in enumerate(zip(works, plans))]
    doc = plan_document(entries, {**made_for(cfg, works[0]), "apply": apply_hint(cfg, path),
                                  "versions": versions()})
    write_atomic(path, json.dumps(jsonable(doc), indent=1) + "\n")


def _model_desc(cfg: Config) -> dict[str, Any]:
    if cfg.is_graph:
        return {"graph": str(cfg.graph_path)}
    model = cfg.spec.model
    assert isinstance(model, FactoryModel)  # not cfg.is_graph
    inputs = None if model.inputs is None else [i.model_dump(exclude_unset=True) for i in model.inputs]
    return {"factory": model.factory, "kwargs": dict(model.kwargs), "inputs": inputs,
            "compiler": cfg.compiler, "decompositions": cfg.decompositions, "dtype": cfg.dtype}


def apply_hint(cfg: Config, plan_path: str | Path) -> str | None:
    """The line that applies a saved plan in training."""
    if cfg.is_graph:
        return None
    extra = f', decompositions="{cfg.decompositions}"' if cfg.compiler == "eager" else ""
    return (f'torch.compile(model, backend=opt_remat.backend(plan="{plan_path}", '
            f'compiler="{cfg.compiler}"{extra}))')
