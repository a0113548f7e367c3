"""What a run says about its records: the progress line of each pair, the summary table, the
comparison of two runs, the min-cut hull, and the report files (``summary.txt``, ``pareto.png``,
``memory.png``, ``report.html``), all from one ``LoadedRun``."""

from __future__ import annotations

import math
from typing import Sequence

from solvers import Plan, Problem
from solvers.budget import column_unit, format_bytes, format_seconds

from .config import TORCH_SOLVER, Config
from .curves import Curve
from .results import Record, budget_bytes_text, verified_text
from .run_data import LoadedRun
from .offload_view import offload_columns
from .util import write_atomic
from .workload import Workload


def progress_line(i: int, n: int, rec: Record) -> str:
    """``[i/n] budget B (bytes) SOLVER: status, saved ..., ...``: one finished pair."""
    head = f"[{i}/{n}] budget {rec.budget} ({budget_bytes_text(rec)}) {rec.solver}:"
    if rec.saved_bytes is None:
        return f"{head} {rec.status}: {rec.error or ''}"
    parts = [rec.status, f"saved {format_bytes(rec.saved_bytes)}", f"step peak {format_bytes(rec.peak_bytes)}",
             f"recompute {format_seconds(rec.recompute_cost)}", f"solved in {format_seconds(rec.solve_time_s)}"]
    if rec.offload.get("offloaded"):
        parts.append(f"offloaded {format_bytes(rec.offload['host_bytes'])}, added time "
                     f"{format_seconds(rec.offload['added_time_s'])}")
    if rec.gap is not None:
        parts.append(f"gap {rec.gap:.2%}")
    if rec.measured_saved_bytes is not None:
        parts.append(f"measured {format_bytes(rec.measured_saved_bytes)}")
    if rec.verified is not None:
        parts.append(f"grads {verified_text(rec)}")
    return f"{head} " + ", ".join(parts)


def summary_table(records: Sequence[Record]) -> str:
    """One row per pair, the budget written once per group; notes (errors, checks) below. Each
    column of bytes is in one unit (saved and measured share theirs)."""
    from ..report import table
    units = {"bytes": column_unit([r.budget_bytes for r in records] + [r.peak_budget for r in records]
                                  + [r.device_memory for r in records]),
             "saved": column_unit([r.saved_bytes for r in records] + [r.measured_saved_bytes for r in records]),
             "peak": column_unit(r.peak_bytes for r in records),
             "grads": column_unit(r.peak_gradient_bytes for r in records),
             "host": column_unit(r.offload.get("host_bytes") for r in records)}
    offload = any(r.offload for r in records)
    rows = []
    last = None
    for rec in records:
        first = rec.budget != last
        last = rec.budget
        measured = rec.measured_saved_bytes
        rows.append({
            "budget": rec.budget if first else "",
            "bytes": budget_bytes_text(rec, units["bytes"]) if first else "",
            "solver": rec.solver,
            "status": rec.status,
            "saved": format_bytes(rec.saved_bytes, units["saved"]),
            "measured": "-" if measured is None else (
                format_bytes(measured, units["saved"]) + ("" if measured == rec.saved_bytes else " (!)")),
            "step peak": format_bytes(rec.peak_bytes, units["peak"]),
            "of it grads": format_bytes(rec.peak_gradient_bytes, units["grads"]),
            "recompute": format_seconds(rec.recompute_cost),
            **(offload_columns(rec, units["host"]) if offload else {}),
            "solve": format_seconds(rec.solve_time_s),
            "gap": "-" if rec.gap is None else f"{rec.gap:.2%}",
            "verified": verified_text(rec, notes=False) + (" *" if rec.note else ""),
        })
    if not rows:
        return "(no results)"
    notes = [f"  * budget {r.budget} {r.solver}: {r.note}" for r in records if r.note]
    return table(rows, list(rows[0])) + ("\n" + "\n".join(notes) if notes else "")


def kinds_table(records: Sequence[Record]) -> str:
    """Each plan's step peak split by kind (``Record.peak_by_kind``), a column per kind any plan
    has, in one unit; "" when no record has a split."""
    from solvers.memory_kinds import MemoryKind

    from ..report import table
    with_kinds = [r for r in records if r.peak_by_kind]
    kinds = [k.value for k in MemoryKind if any(r.peak_by_kind.get(k.value) for r in with_kinds)]
    if not kinds:
        return ""
    unit = column_unit(v for r in with_kinds for v in [r.peak_bytes, *r.peak_by_kind.values()])
    rows = [{"budget": r.budget, "solver": r.solver, "step peak": format_bytes(r.peak_bytes, unit),
             **{k: format_bytes(r.peak_by_kind.get(k, 0), unit) for k in kinds}} for r in with_kinds]
    return "step peak by kind\n" + table(rows, list(rows[0]))


def compare_table(a: Sequence[Record], b: Sequence[Record], name_a: str, name_b: str, *,
                  width: int | None = None) -> str:
    """Two runs' records side by side, pair by pair, with relative changes (``d``: B against A).
    Wider than ``width``: cut into blocks of columns, each repeating budget and solver."""
    from ..report import table
    ra, rb = {r.key: r for r in a}, {r.key: r for r in b}
    unit = column_unit([r.saved_bytes for r in [*a, *b]])
    rows = []
    for key in list(ra) + [k for k in rb if k not in ra]:
        x, y = ra.get(key), rb.get(key)

        def delta(field: str, x: object = x, y: object = y) -> str:
            u, v = getattr(x, field, None), getattr(y, field, None)
            if not isinstance(u, (int, float)) or not isinstance(v, (int, float)):
                return "-"
            if u == v:
                return "="
            return f"{(v - u) / abs(u):+.1%}" if u else "new"

        rows.append({
            "budget": key[0], "solver": key[1],
            f"saved {name_a}": format_bytes(x.saved_bytes, unit) if x else "(none)",
            f"saved {name_b}": format_bytes(y.saved_bytes, unit) if y else "(none)",
            "saved d": delta("saved_bytes"),
            f"recompute {name_a}": format_seconds(x.recompute_cost if x else None),
            f"recompute {name_b}": format_seconds(y.recompute_cost if y else None),
            "recompute d": delta("recompute_cost"),
            f"solve {name_a}": format_seconds(x.solve_time_s if x else None),
            f"solve {name_b}": format_seconds(y.solve_time_s if y else None),
            f"status {name_a}/{name_b}": f"{x.status if x else '-'}/{y.status if y else '-'}",
            f"verified {name_a}/{name_b}": (f"{verified_text(x, notes=False) if x else '-'}/"
                                            f"{verified_text(y, notes=False) if y else '-'}"),
        })
    return table(rows, list(rows[0]), width=width, keep=2) if rows else "(no results)"


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


def memory_curves(records: Sequence[Record]) -> dict[str, dict[str, Curve]]:
    """Per budget, per solver: the simulated step of its plan, as its record holds it."""
    curves: dict[str, dict[str, Curve]] = {}
    for rec in records:
        if rec.curve is not None and rec.saved_bytes is not None:
            curves.setdefault(rec.budget, {})[rec.solver] = rec.curve
    return curves


def write_reports(cfg: Config, work: Workload, run: LoadedRun) -> str:
    """The plots and summary.txt the config asks for, and report.html; returns the summary table
    (of the config's pairs: results.json may keep others from earlier runs)."""
    out_dir = cfg.output_dir
    pairs = {(b.label, s.label) for b in cfg.budgets for s in cfg.solvers}
    records = [r for r in run.records if r.key in pairs]
    if "plot" in cfg.formats:
        from .plots import memory_plot, pareto_plot
        pareto_plot(records, run.hull, out_dir / "pareto.png", title=f"{cfg.title}: saved memory vs recompute")
        memory_plot(memory_curves(records), out_dir / "memory.png",
                    title=f"{cfg.title}: live memory during the step (simulated)")
    if "html" in cfg.formats:
        from .html_report import write_html_report
        write_html_report(run, work.problem)
    table = summary_table(records)
    kinds = kinds_table(records)
    if kinds:
        table += "\n\n" + kinds
    if cfg.spec.costs == "profile" and work.prepared is not None:  # both estimates, per op kind
        table += "\n\nrecompute costs per op kind (costs: profile)\n" + _cost_comparison(work)
    if "table" in cfg.formats:
        title = f"{cfg.title}\n\n" if cfg.spec.output.title else ""
        write_atomic(out_dir / "summary.txt", title + table + "\n")
    return table


def failed_verification(records: Sequence[Record]) -> int:
    """Plans whose gradient check failed; the torch baseline is measured, not trusted: its failures
    are reported, not a failed run."""
    return sum(1 for r in records if r.verified is False and r.solver_name != TORCH_SOLVER)


def _cost_comparison(work: Workload) -> str:
    """The measured costs of a ``costs: profile`` run beside the roofline estimate, per op kind."""
    from ..build import build_problem
    from ..report import cost_table

    prepared = work.prepared
    roofline = build_problem(prepared.module, num_fwd_outputs=prepared.num_fwd_outputs,
                             static_lifetime_input_indices=prepared.static_lifetime_input_indices,
                             device=work.profile)
    return cost_table(roofline, work.problem)
