"""Every solver on the published Checkmate/Moccasin training graphs, under saved-byte budgets.

    python benchmarks/bench_checkmate.py [--graphs VGG16_256 ResNet50] [--fractions 0.9 0.5]
                                         [--solvers cpsat mincut] [--time-limit 60] [--threads 2]

Budgets are ``m x`` the saved bytes of the save-all (no-recomputation) plan. Per graph and budget,
each solver's status, compute overhead (its recompute cost as a percentage of the step's forward +
backward cost), saved bytes, solve time and optimality gap. Every plan is re-checked with
``check_plan``. At the end the published reference points (Checkmate/Moccasin, from the data
folder's README) are printed next to this project's numbers at the same ``m`` -- note that their
budget limits *peak* memory of a schedule, ours the saved bytes, so these are different problems.
The peak-budget table (``--peak-only`` for it alone) is the papers' problem: a budget of m x the
no-recompute step's peak, ``cpsat``'s peak search and the drop-in default (``fast_peak_plan``)
beside it, the default's overhead as a multiple of the search's.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from opt_remat.formats.checkmate_graph import (compute_overhead_percent, graph_files, graph_name, load_graph,
                                               no_recompute_saved_bytes)
from opt_remat.report import table
from solvers import catalog
from solvers.budget import format_bytes
from solvers.liveness import simulate_plan
from solvers.mincut import InfeasibleError, solve_mincut
from solvers.fast_peak import fast_peak_plan
from solvers.options import CpsatOptions, MilpOptions, PeakSearchOptions
from solvers.peak import PeakInfeasibleError, peak_search
from solvers.problem import Plan, Problem, Status, check_plan

GRAPH_DIR = Path(__file__).resolve().parents[1] / "configs" / "data" / "checkmate"  # shipped with the project
FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5)
SOLVERS = ("cpsat", "milp-cbc", "milp-highs", "mincut", "greedy", "dp", "uniform", "sqrt",
           "inputs-only")
EXTRA_SOLVERS = ("save-all",)

# Published points (the data folder's README): graph, m, who, outcome. Their m is a fraction of the
# peak memory of the schedule without recomputation, and they may recompute anywhere in the schedule.
PUBLISHED = (
    ("fcn_8_vgg_32_416x608", 0.8, "Moccasin CP-SAT (2 workers)", "optimal in 5.3 s, +0.14% compute"),
    ("fcn_8_vgg_32_416x608", 0.8, "Checkmate MILP (CBC)", "optimal in 15.7 s"),
    ("ResNet50_256", 0.9, "Moccasin CP-SAT (2 workers)", "optimal in 168 s, +0.11% compute"),
    ("ResNet50_256", 0.9, "Checkmate MILP (CBC)", "no solution in 300 s"),
    ("ResNet50_256", 0.8, "Moccasin CP-SAT (2 workers)", "feasible +6.89% after 201 s"),
)


def _mip_available() -> bool:
    if importlib.util.find_spec("ortools") is None:
        return False
    try:
        import solvers.mip  # noqa: F401  (registers "cpsat" and "milp")
    except ImportError:
        return False
    return True


def available_solvers(wanted: list[str] | tuple[str, ...] = SOLVERS) -> list[str]:
    """The solvers of ``wanted`` whose engines are installed (only those are probed)."""
    out = []
    mip = _mip_available() if any(w in ("cpsat", "milp-cbc", "milp-highs") for w in wanted) else False
    for name in wanted:
        if name == "cpsat" and not mip:
            continue
        if name == "milp-cbc":
            if not mip or importlib.util.find_spec("pulp") is None:
                continue
            import pulp
            with warnings.catch_warnings():  # PuLP 3 deprecates the bundled-CBC class name
                warnings.simplefilter("ignore", DeprecationWarning)
                if not pulp.PULP_CBC_CMD().available():
                    continue
        if name == "milp-highs" and (not mip or importlib.util.find_spec("highspy") is None):
            continue
        if name in SOLVERS + EXTRA_SOLVERS:
            out.append(name)
    return out


def call(problem: Problem, solver: str, budget: int, *, time_limit: float, threads: int) -> Plan:
    if solver == "cpsat":
        return catalog.solve(problem, "cpsat", budget, CpsatOptions(time_limit_s=time_limit, threads=threads))
    if solver.startswith("milp-"):
        return catalog.solve(problem, "milp", budget,
                             MilpOptions(backend=solver[5:], time_limit_s=time_limit, threads=threads))
    return catalog.solve(problem, solver, budget)


def resolve_graphs(names: list[str] | None, directory: Path) -> list[Path]:
    """Graph files by short name: exact (case-insensitive) or a unique prefix, e.g. ``resnet``."""
    files = graph_files(directory)
    if not names:
        return files
    by_name = {graph_name(f).lower(): f for f in files}
    chosen = []
    for n in names:
        key = n.lower().removesuffix("_train_nx.json").removesuffix("_train_nx")
        hits = [by_name[key]] if key in by_name else [f for k, f in by_name.items() if k.startswith(key)]
        if len(hits) != 1:
            what = "matches several graphs" if hits else "matches no graph"
            sys.exit(f"--graphs {n!r} {what}; choose from: {', '.join(graph_name(f) for f in files)}")
        chosen.append(hits[0])
    return chosen


def run_one(problem: Problem, solver: str, m: float, budget: int, reference: int, least: int, *,
            time_limit: float, threads: int) -> dict[str, Any]:
    """One solve as a table row; ``least`` is the graph's smallest feasible saved bytes."""
    row: dict[str, Any] = {"m": f"{m:g}", "budget": format_bytes(budget), "solver": solver}
    start = time.perf_counter()
    try:
        plan = call(problem, solver, budget, time_limit=time_limit, threads=threads)
    except InfeasibleError as exc:  # includes the MIP's BudgetInfeasibleError
        mfb = getattr(exc, "min_feasible_bytes", None)
        row.update(status="infeasible", time=f"{time.perf_counter() - start:.2f}",
                   note=f"smallest feasible {format_bytes(least if mfb is None else mfb)}")
        return row
    except Exception as exc:  # a benchmark reports a failing solver; it does not stop
        row.update(status="error", time=f"{time.perf_counter() - start:.2f}",
                   note=f"{type(exc).__name__}: {exc}"[:80])
        return row
    res = check_plan(problem, plan)
    status = plan.status.value
    if not res.valid:
        status = "INVALID"
    elif plan.saved_bytes > budget:
        status = "infeasible"  # a baseline that cannot reach the budget still returns its plan
    gap = plan.gap
    row.update(
        status=status,
        **{"overhead %": f"{compute_overhead_percent(problem, plan.recompute_cost):.3f}",
           "saved": format_bytes(plan.saved_bytes),
           "saved/ref": f"{plan.saved_bytes / reference:.3f}" if reference else "-",
           "time": f"{plan.solve_time_s:.2f}",
           "gap": "-" if gap is None else f"{100 * gap:.2f}%"},
        note=(f"over budget; smallest feasible {format_bytes(least)}" if status == "infeasible" else
              res.errors[0][:60] if not res.valid else
              plan.message[:60] if plan.status is Status.TIME_LIMIT else ""),
    )
    row["_overhead"] = compute_overhead_percent(problem, plan.recompute_cost)
    return row


def run_peak(problem: Problem, m: float, peak_budget: int, reference: int, *, time_limit: float,
             threads: int, default: bool = False) -> dict[str, Any]:
    """One peak-budget solve (the peak search, or the fast default with ``default``), checked by
    simulation."""
    start = time.perf_counter()
    row: dict[str, Any] = {"m": f"{m:g}", "peak budget": format_bytes(peak_budget),
                           "solver": "default" if default else "peak-search"}
    try:
        plan = (fast_peak_plan(problem, peak_budget) if default else
                peak_search(problem, peak_budget, options=PeakSearchOptions(time_limit_s=time_limit, threads=threads)))
    except PeakInfeasibleError as exc:
        row.update(status="infeasible", time=f"{time.perf_counter() - start:.1f}",
                   note=f"smallest peak found {format_bytes(exc.min_peak)} "
                        f"(m = {exc.min_peak / reference:.3f})" if exc.min_peak else "")
        return row
    peak = simulate_plan(problem, plan.saved).peak
    assert peak <= peak_budget and check_plan(problem, plan).valid
    overhead = compute_overhead_percent(problem, plan.recompute_cost)
    status = "optimal*" if plan.extra.get("model_optimal") else plan.status.value
    row.update(status=status, _overhead=overhead, **{"overhead %": f"{overhead:.3f}",
               "peak/ref": f"{peak / reference:.3f}", "time": f"{time.perf_counter() - start:.2f}",
               "note": "optimal for the stage model" if plan.extra.get("model_optimal") else plan.message})
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="+", metavar="NAME",
                    help="graph short names or unique prefixes (default: all seven)")
    ap.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS), metavar="M",
                    help="budgets as fractions of the save-all saved bytes")
    ap.add_argument("--solvers", nargs="+", choices=SOLVERS + EXTRA_SOLVERS, metavar="SOLVER",
                    help=f"default: every available one of {', '.join(SOLVERS)}")
    ap.add_argument("--time-limit", type=float, default=60.0, help="MIP time limit per solve, s")
    ap.add_argument("--threads", type=int, default=2, help="MIP worker threads")
    ap.add_argument("--dir", type=Path, default=GRAPH_DIR, help="graph directory")
    ap.add_argument("--no-peak", action="store_true", help="skip the peak-budget table")
    ap.add_argument("--peak-only", action="store_true", help="only the peak-budget table (and the default)")
    args = ap.parse_args(argv)
    if any(not (0 <= m) or math.isnan(m) for m in args.fractions):
        ap.error("fractions must be >= 0")

    wanted = list(dict.fromkeys(args.solvers or SOLVERS))
    solvers = available_solvers(wanted)
    missing = [s for s in wanted if s not in solvers]
    if missing:
        print(f"skipping unavailable solvers: {', '.join(missing)}")

    columns = ["m", "budget", "solver", "status", "overhead %", "saved", "saved/ref", "time", "gap",
               "note"]
    results: dict[tuple[str, float, str], dict[str, Any]] = {}
    for path in resolve_graphs(args.graphs, args.dir):
        problem = load_graph(path)
        reference = no_recompute_saved_bytes(problem)
        least = solve_mincut(problem, 0.0).saved_bytes  # exact: no storage is shared here
        n_fwd = sum(n.role.value == "forward" for n in problem.nodes)
        print(f"\n== {problem.name}: {len(problem.nodes)} nodes ({n_fwd} forward), "
              f"save-all saves {format_bytes(reference)} (m = 1), "
              f"smallest feasible {format_bytes(least)} (m = {least / reference:.3f})", flush=True)
        rows = []
        for m in args.fractions:
            budget = int(m * reference)
            for s in ([] if args.peak_only else solvers):
                row = run_one(problem, s, m, budget, reference, least, time_limit=args.time_limit,
                              threads=args.threads)
                results[(problem.name, m, s)] = row
                rows.append(row)
        if rows:
            print(table(rows, columns), flush=True)
        if not args.no_peak:
            peak_rows = []
            top = simulate_plan(problem, catalog.solve(problem, "save-all").saved).peak
            print(f"-- peak budgets: m x the no-recompute step peak ({format_bytes(top)})", flush=True)
            for m in args.fractions:
                row = run_peak(problem, m, int(m * top), top, time_limit=args.time_limit,
                               threads=args.threads)
                results[(problem.name, m, "peak")] = row
                peak_rows.append(row)
                # the drop-in default beside it: its cost as a multiple of the search's overhead
                mine = run_peak(problem, m, int(m * top), top, time_limit=args.time_limit,
                                threads=args.threads, default=True)
                if "_overhead" in mine and "_overhead" in row:
                    mine["note"] = (f"{mine['_overhead'] / row['_overhead']:.2f}x cpsat-peak's overhead"
                                    if row["_overhead"] > 0 else "cpsat-peak: no overhead")
                peak_rows.append(mine)
            print(table(peak_rows, ["m", "peak budget", "solver", "status", "overhead %", "peak/ref",
                                    "time", "note"]), flush=True)

    print("\n== published reference points (budget = m x PEAK memory of the no-recompute schedule; "
          "ours: m x SAVED bytes of save-all -- a different, easier problem)")
    ref_rows = []
    for g, m, who, outcome in PUBLISHED:
        ours = []
        for s in ("cpsat", "milp-cbc"):
            r = results.get((g, m, s))
            if r is not None:
                ours.append(f"{s}: {r['status']}"
                            + (f" +{r['_overhead']:.2f}%" if "_overhead" in r else "")
                            + f" in {r['time']} s")
        r = results.get((g, m, "peak"))
        peak = (f"{r['status']}" + (f" +{r['_overhead']:.2f}%" if "_overhead" in r else "")
                + f" in {r['time']} s") if r is not None else "(not run)"
        ref_rows.append({"graph": g, "m": f"{m:g}", "published": f"{who}: {outcome}",
                         "ours (saved-byte budget)": "; ".join(ours) or "(not run)",
                         "ours (peak budget, peak-search)": peak})
    print(table(ref_rows, ["graph", "m", "published", "ours (saved-byte budget)",
                           "ours (peak budget, peak-search)"]))


if __name__ == "__main__":
    main()
