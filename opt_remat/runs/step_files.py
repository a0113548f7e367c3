"""``opt-remat solve`` for a step of several graphs, captured per layer (``capture: {per_layer:
model.layers}``: the root's parts, the layer graph once per layer) or with graph breaks (under peak
or device budgets): the step's graphs planned together under each budget (``solvers.step_solve``),
one plan file per budget holding a plan per distinct graph and the step's peak by kind
(``opt_remat.formats.step_plan``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from solvers.budget import format_bytes
from solvers.step import Step, StepGraph
from solvers.errors import StepBudgetError
from solvers.step_solve import solve_step
from solvers.training import TrainingSetup

from ..formats.step_plan import step_document
from ..plans import versions
from ..request import ONE_DEVICE
from .config import BudgetSpec, Config
from .loop import tightest_first
from .plan_files import apply_hint, made_for, node_details
from .solve_files import budget_path
from .util import SolveRefused, first_line, jsonable, quiet_torch, write_atomic
from .workload import Workload, graph_request, model_and_inputs


def materialize_step(cfg: Config) -> Any:
    """The configured model's step captured per layer (``opt_remat.step_capture``) and built."""
    import torch

    from ..step_capture import build_step, capture_step

    path = cfg.spec.capture.per_layer
    assert path is not None
    dtype = getattr(torch, cfg.dtype)
    _, inputs, source = model_and_inputs(cfg)
    with quiet_torch():
        try:
            captured = capture_step(source, inputs, per_layer=path, compiler=cfg.compiler,
                                    decompositions=cfg.decompositions, meta=cfg.meta,
                                    dtype=dtype if cfg.meta else None, seed=cfg.seed)
        except Exception as exc:
            raise cfg.error(("capture", "per_layer"), first_line(exc)) from None
        return build_step(captured, graph_request(cfg)), inputs


def _budget(cfg: Config, spec: BudgetSpec) -> tuple[int, TrainingSetup | None]:
    """The step's budget in bytes and the set-up its states are counted under."""
    if spec.device is not None:
        return spec.device, graph_request(cfg).training or ONE_DEVICE
    if spec.peak is not None and is_step_budget(spec):
        return spec.peak, None
    raise cfg.error(("budgets", spec.index), f"budget {spec.label}: a step captured per layer is planned under "
                                             "a device budget ({device: 80GiB}) or a peak budget ({peak: 2GiB}) "
                                             "alone")


def is_step_budget(spec: BudgetSpec) -> bool:
    """A budget the step's graphs share: a device's, or a peak alone."""
    return spec.device is not None or (spec.peak is not None and spec.saved_raw is None and spec.count_gradients)


def step_of_works(works: Sequence[Workload]) -> Any:
    """The graphs of a step with graph breaks (in compilation order: the forward's) as a step, each
    graph planned freely; a graph compiled again in a row (same canonical id) counted again."""
    from ..step_capture import StepWork

    graphs: list[StepGraph] = []
    for w in works:
        if graphs and graphs[-1].key == w.graph_id:
            graphs[-1] = StepGraph(w.graph_id, w.problem, graphs[-1].repeat + 1)
        else:
            graphs.append(StepGraph(w.graph_id, w.problem, 1))
    return StepWork(Step(tuple(graphs)), values={w.graph_id: w.values for w in works})


def solve_step_files(cfg: Config, out: Path, written: list[Path], work: Any = None, inputs: tuple = ()) -> None:
    """A plan file per budget of ``cfg`` (``out``, or ``OUT-LABEL`` with several), for the step
    captured per layer (``work`` None) or the graphs of a step with graph breaks (``work``)."""
    if work is None:
        print(f"capturing {cfg.name} per layer ({cfg.spec.capture.per_layer}) ...", flush=True)
        work, inputs = materialize_step(cfg)
    step = work.step
    print("step: " + ", ".join(f"{g.key} x{g.repeat} ({len(g.problem.nodes)} values"
                               + (", eager's plan kept" if g.fixed is not None else "") + ")"
                               for g in step.graphs), flush=True)
    for spec in sorted(cfg.budgets, key=tightest_first):
        path = budget_path(out, cfg.budgets, spec)
        budget, setup = _budget(cfg, spec)
        start = time.perf_counter()
        try:
            solved = solve_step(step, budget, setup)
        except StepBudgetError as exc:
            raise SolveRefused(f"budget {spec.label}: {exc}") from None
        details = {k: {"nodes": node_details(step.graph(k).problem, p)} for k, p in solved.plans.items()}
        shown = Workload(step.graphs[0].problem, "", graph_request(cfg).profile, graph_request(cfg), inputs=inputs)
        doc = step_document(step, solved.plans, work.values, solved.peak, solved.cost,
                            {**made_for(cfg, shown), "per_layer": cfg.spec.capture.per_layer,
                             "apply": "; ".join(filter(None, (work.needs, apply_step_hint(cfg, path)
                                                              if cfg.spec.capture.per_layer else
                                                              apply_hint(cfg, path)))),
                             "versions": versions()},
                            entry_extra=details, budget_spec=spec.raw, device_memory=spec.device,
                            peak_budget=spec.peak, training=None if setup is None else vars(setup),
                            solve_time_s=time.perf_counter() - start)
        write_atomic(path, json.dumps(jsonable(doc), indent=1) + "\n")
        written.append(path)
        print(f"budget {spec.label}: step peak {format_bytes(solved.peak.total)} at {solved.peak.at} "
              f"({', '.join(f'{k.value} {format_bytes(v)}' for k, v in solved.peak.by_kind.items())}); "
              f"plans for {len(solved.plans)} graph(s) written to {path}", flush=True)


def apply_step_hint(cfg: Config, plan_path: str | Path) -> str:
    extra = f', decompositions="{cfg.decompositions}"' if cfg.compiler == "eager" else ""
    return (f'for layer in model.get_submodule("{cfg.spec.capture.per_layer}"): layer.compile('
            f'backend=opt_remat.backend(plan="{plan_path}", compiler="{cfg.compiler}"{extra}))')
