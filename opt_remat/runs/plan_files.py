"""Plan files of a run (``OUT/plans/``, ``opt-remat solve -o``): each plan with what ``opt-remat
show`` prints about its values, and what the plans were made for. The format is ``opt_remat.formats.plan_file``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from solvers import Plan, Problem
from solvers.offload import offloaded_curve
from solvers.training import TrainingSetup

from .. import road
from ..formats.plan_file import graph_entry, plan_document, read_plan_file
from ..plans import versions
from ..report import clean_module
from .config import Config, FactoryModel
from .curves import step_curve
from .offload_view import offload_figures
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


def plan_entry(work: Workload, plan: Plan, peaks: tuple[int, int] | None = None,
               setup: TrainingSetup | None = None, **extra: Any) -> dict[str, Any]:
    """One graph's plan as a plan-file entry, with the details ``opt-remat show`` prints. ``peaks``:
    the step's peak and its gradient bytes, as the run simulated them (else simulated here, the
    rank's whole memory under ``setup``, with the peak by kind)."""
    entry = graph_entry(work.problem, plan, work.values, work.graph_id)
    simulated = peaks is None
    if peaks is None:
        curve = step_curve(work.problem, plan.saved, setup)
        peaks = (curve.peak, curve.peak_gradients)
        entry["peak_by_kind"] = curve.peak_by_kind()
    entry["peak_bytes"], entry["peak_gradient_bytes"] = peaks
    if simulated and (work.request.offload or plan.offloaded):  # the offload-aware peak and figures
        link = road.offload_link(work.request)
        offloaded, _ = offloaded_curve(work.problem, plan.saved, plan.offloaded, link)
        entry["peak_bytes"], entry["peak_gradient_bytes"] = offloaded.peak, offloaded.peak_gradients
        entry["offload"] = offload_figures(work.problem, plan, link)[0]
    entry["nodes"] = node_details(work.problem, plan)
    entry.update({k: v for k, v in extra.items() if v is not None})
    return entry


def read_plan_values(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What the (first) plan of a run's plan file saves and recomputes; a ValueError if it cannot be read."""
    try:
        graph = read_plan_file(path)["graphs"][0]
        return tuple(graph["saved"]), tuple(graph.get("recomputed", []))
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
               peaks: Sequence[tuple[int, int]] | None = None, setup: TrainingSetup | None = None,
               **extra: Any) -> None:
    """A plan file holding one plan per captured graph (``extra`` goes into each entry; ``peaks``
    and ``setup`` as ``plan_entry`` takes them, one peak per plan)."""
    entries = [plan_entry(w, p, peaks[i] if peaks else None, setup, **extra)
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
