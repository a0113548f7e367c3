"""``opt-remat solve``'s plan files: a file per budget of a config, each holding a plan per captured
graph, solved by the road a run's pairs take (``runs.execute.solve_one``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from solvers import Plan
from solvers import progress as solver_progress

from ..report import describe_plan
from ..solve import SolveInterrupted
from .config import BudgetSpec, Config
from .execute import solve_one
from .loop import curve_setup, tightest_first
from .plan_files import write_plan
from .progress import Display, terminal_mode
from .util import SolveRefused
from .workload import Workload


def solve_to_files(cfg: Config, works: Sequence[Workload], name: str, label: str, options: dict[str, Any],
                   out: Path, written: list[Path]) -> None:
    """A plan file per budget of ``cfg`` (``out``, or ``OUT-LABEL`` with several), each appended to
    ``written`` once on disk; peak budgets last, tightest first, so that each plan is a candidate at
    the looser ones (``opt_remat.plan_memory``). Ctrl-C keeps what finished: the best plan of the
    solve it stops (``SolveInterrupted.plan``) completes its budget's file when it is the last
    graph's. A budget with no plan raises ``SolveRefused`` naming it."""
    budgets = cfg.budgets
    with Display(terminal_mode(sys.stdout)) as display:  # live on a terminal, a line per change piped
        display.start(len(budgets) * len(works))
        for spec in sorted(budgets, key=tightest_first):
            path = budget_path(out, budgets, spec)
            plans: list[Plan] = []
            for i, work in enumerate(works):
                which = f"budget {spec.label}" + (f", graph {i + 1} of {len(works)}" if len(works) > 1 else "")
                display.doing(f"solving {which} with {label}")
                try:
                    with solver_progress.reporting(display.search):
                        plan, _ = solve_one(work, name, spec, options=options, warn=display.warning)
                except SolveRefused as exc:
                    raise SolveRefused(f"{which}: {exc}") from None
                except SolveInterrupted as exc:
                    if exc.plan is not None and len(plans) == len(works) - 1:
                        write_plan(path, cfg, works, [*plans, exc.plan], setup=curve_setup(cfg, works[0]),
                                   budget_spec=spec.raw, peak_budget=spec.peak, device_memory=spec.device)
                        written.append(path)
                    raise
                plans.append(plan)
                display.finished(f"== {which}\n{describe_plan(work.problem, plan)}")
            write_plan(path, cfg, works, plans, setup=curve_setup(cfg, works[0]), budget_spec=spec.raw,
                       peak_budget=spec.peak, device_memory=spec.device)
            written.append(path)
            graphs = ", ".join(f"{w.graph_id}: {len(w.problem.nodes)} nodes" for w in works)
            display.message(f"plan for {len(works)} graph(s) ({graphs}) written to {path}")


def budget_path(out: Path, budgets: Sequence[BudgetSpec], spec: BudgetSpec) -> Path:
    """The plan file of ``spec``: ``out`` for a config's one budget, else ``OUT-LABEL``."""
    return out if len(budgets) == 1 else out.with_name(f"{out.stem}-{safe_label(spec.label)}{out.suffix}")


def safe_label(label: str) -> str:
    """A budget's label as part of a file name."""
    return "".join(c if c.isalnum() or c in "._" else "_" for c in label).strip("_") or "budget"
