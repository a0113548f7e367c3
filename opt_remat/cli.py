"""The ``opt-remat`` command line: ``run``, ``solve``, ``show``, ``compare``, ``report``, ``solvers``,
``demo``.

Bad input (configuration, options, files) exits with code 2 and one line naming what is wrong;
Ctrl-C exits with 130. ``--help`` texts are plain text (``opt_remat.cli_text``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from solvers.budget import column_time_unit, column_unit, format_bytes, format_seconds

from .cli_text import BUDGET_HELP, DESCRIPTION, RUN_EPILOG, para as _para
from .errors import OptRematError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


class UsageError(OptRematError, ValueError):
    """Bad command-line input (exit 2)."""


def catalog_reference() -> str:
    from solvers.catalog import reference
    return reference()


def _solver_names() -> str:
    from .options import known_solvers
    return ", ".join(known_solvers())


def _err(message: str) -> None:
    print(f"opt-remat: error: {' '.join(str(message).split())}", file=sys.stderr)


# ---- demo ----------------------------------------------------------------------------------------
def _demo(args: argparse.Namespace) -> int:
    import torch

    import opt_remat
    from opt_remat import models
    from opt_remat.report import describe_plan, table
    from opt_remat.verify import compare_steps, measured_saved_bytes, save_all_backend, training_step

    torch.manual_seed(0)
    factory = getattr(models, args.model)
    model = factory(layers=args.layers) if args.model in ("gpt2", "llama", "mlp") else factory()
    inputs = models.example_inputs(args.model, model, batch=args.batch)
    reference = training_step(model, inputs, save_all_backend("inductor"))
    rows: list[dict[str, Any]] = []
    for solver in args.solvers:
        torch._dynamo.reset()
        be = opt_remat.backend(solver, args.budget, compiler="eager", decompositions="inductor",
                               device=args.device)
        try:
            step = training_step(model, inputs, be)
        except Exception as exc:  # a baseline that cannot meet the budget: say so, go on
            cause: BaseException | None = exc
            while cause is not None and not isinstance(cause, opt_remat.BudgetError):
                cause = cause.__cause__ or getattr(cause, "inner_exception", None)
            if cause is None:
                raise
            print(f"\n== {solver}: {cause}")
            rows.append({"solver": solver, "status": "infeasible"})
            continue
        check = compare_steps(step, reference)
        rec = be.partitioner.history[-1]
        print(f"\n== {args.model} ({len(rec.problem.nodes)} nodes in the joint graph) ==")
        print(describe_plan(rec.problem, rec.plan))
        measured = measured_saved_bytes(rec.fw_module, rec.num_fwd_outputs)
        rows.append({
            "solver": solver, "status": rec.plan.status.value,
            "saved (predicted)": rec.plan.saved_bytes, "saved (measured)": measured,
            "recompute": rec.plan.recompute_cost, "solve": rec.plan.solve_time_s,
            "grads vs save-all": "bitwise" if check.bitwise else f"rel err {check.max_rel_error:.1e}",
        })
    print()
    byte_columns = ("saved (predicted)", "saved (measured)")
    unit = column_unit(r.get(c) for r in rows for c in byte_columns)  # one unit for both columns
    times = {c: column_time_unit(r.get(c) for r in rows) for c in ("recompute", "solve")}  # one per column
    for r in rows:
        r.update({c: format_bytes(r[c], unit) for c in byte_columns if c in r})
        r.update({c: format_seconds(r[c], u) for c, u in times.items() if c in r})
    print(table(rows, list(max(rows, key=len).keys())))
    return 0


def cli_budget(text: str | None) -> int | float | str | None:
    """A budget as typed, read as the config's budgets are (a YAML value, then ``parse_budget``):
    "0.5" is a fraction, "1500000" or "2MiB" bytes, and a float above 1 ("2.0") is refused."""
    import yaml

    from solvers.budget import parse_budget

    if text is None:
        return None
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    if value is None:
        return None
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1] or bytes such as '2MiB', got {text!r}")
    try:
        parse_budget(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


# ---- run -------------------------------------------------------------------------------------------
def _run(args: argparse.Namespace) -> int:
    from .runs import load_config, materialize, run
    from .runs.execute import ray_available
    from .runs.progress import Display, terminal_mode

    if args.jobs < 1:
        raise UsageError(f"--jobs: expected an integer >= 1, got {args.jobs}")
    if args.executor == "ray" and not ray_available():
        raise UsageError("--executor ray: ray is not installed; install it with: pip install 'opt-remat[ray]'")
    cfg = load_config(args.config, args.set or [])
    print(f"capturing {cfg.name} ...", flush=True)
    work = materialize(cfg)  # everything is validated before the output folder is created
    try:  # a live display on a terminal, plain lines when piped
        summary = run(cfg, jobs=args.jobs, executor=args.executor, work=work,
                      display=Display(terminal_mode(sys.stdout)))
    except KeyboardInterrupt:
        _err(f"interrupted; the pairs done so far are in {cfg.output_dir} (rerun to resume)")
        return EXIT_INTERRUPTED
    if summary.failed_verification:
        _err(f"{summary.failed_verification} plan(s) failed verification (see the table above)")
        return 1
    return 0


# ---- solve -----------------------------------------------------------------------------------------
def _solve(args: argparse.Namespace) -> int:
    from .options import known_solvers
    from .runs import ConfigError, SolveRefused, load_config, materialize_all
    from .runs.plan_files import apply_hint
    from .runs.solve_files import solve_to_files
    from .runs.step_files import is_step_budget, solve_step_files, step_of_works

    overrides = list(args.set or [])
    if args.budget is not None:  # the budget as YAML reads it, checked as the config's budgets are
        overrides.append(f"budgets=[{args.budget}]")
    if args.offload is not None:
        overrides.append(f"offload={args.offload}")
    try:
        cfg = load_config(args.config, overrides, any_budget=True)
    except ConfigError as exc:
        if args.budget is not None and exc.field.startswith("budgets"):
            raise UsageError(f"--budget {args.budget}: {exc.detail}") from None
        raise
    options: dict[str, Any] = {}
    asked = args.solver
    name = args.solver or cfg.solvers[0].label  # default: the config's first solver
    args.solver = name
    for spec in cfg.solvers:  # a solver listed in the config brings its options
        if spec.label == args.solver or (spec.name == args.solver and not options):
            name, options = spec.name, dict(spec.options)
            if spec.label == args.solver:
                break
    if name not in known_solvers():
        raise UsageError(f"--solver: unknown solver {args.solver!r}; expected one of: "
                         f"{', '.join(known_solvers())} or a label from the config")
    out = Path(args.output)
    if out.exists() and out.is_dir():
        raise UsageError(f"-o: {out} is a folder; expected a file name such as plan.json")
    if not out.parent.exists():
        raise UsageError(f"-o: folder {out.parent} does not exist")
    budgets = cfg.budgets
    written: list[Path] = []
    try:
        if cfg.spec.capture.per_layer is not None:  # the step's graphs planned together
            if asked is not None:
                print(f"note: --solver {asked} is not used: a step captured per layer is planned by the step "
                      "solve (solvers.step_solve)", flush=True)
            solve_step_files(cfg, out, written)
            return 0
        print(f"capturing {cfg.name} ...", flush=True)
        works = materialize_all(cfg)
        if len(works) > 1 and all(map(is_step_budget, budgets)):  # graph breaks: one budget for the step
            if asked is not None:
                print(f"note: --solver {asked} is not used: the step's {len(works)} graphs share the budget and "
                      "are planned by the step solve (solvers.step_solve)", flush=True)
            solve_step_files(cfg, out, written, step_of_works(works), works[0].inputs)
            return 0
        solve_to_files(cfg, works, name, args.solver, options, out, written)
    except SolveRefused as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        what = f"written: {', '.join(map(str, written))}" if written else "nothing was written"
        raise SolveStopped(f"interrupted; {what}") from None
    hint = apply_hint(cfg, out if len(budgets) == 1 else out.with_name(f"{out.stem}-LABEL{out.suffix}"))
    if hint:
        print(f"apply it in training with: {hint}")
    return 0


class SolveStopped(KeyboardInterrupt):
    """Ctrl-C in ``solve``: the message says which plan files were written."""


# ---- show --------------------------------------------------------------------------------------------
def _show(args: argparse.Namespace) -> int:
    from .errors import PlanMismatchError
    from .formats.plan_file import read_plan_file
    from .runs.show import made_for_lines, show_graph

    try:
        doc = read_plan_file(args.plan)
    except PlanMismatchError as exc:
        raise UsageError(str(exc)) from None
    print(f"plan file {args.plan}: {len(doc['graphs'])} graph(s)")
    for line in made_for_lines(doc.get("made_for") or {}):
        print("  " + line)
    if doc.get("step"):
        from .runs.show import step_lines
        for line in step_lines(doc["step"]):
            print("  " + line)
    for i, graph in enumerate(doc["graphs"]):
        print(f"\n== graph {i + 1} of {len(doc['graphs'])}" if len(doc["graphs"]) > 1 else "")
        show_graph(graph, args.names)
    return 0


# ---- compare -----------------------------------------------------------------------------------------
def _load_run(path: str) -> Any:
    from .runs.results import read_results

    p = Path(path)
    f = p / "results.json" if p.is_dir() else p
    if not f.is_file():
        raise UsageError(f"{path}: no results.json there (expected a folder written by opt-remat run)")
    results = read_results(f)
    if results is None:
        raise UsageError(f"{f}: not an opt-remat results file (or a format this version cannot read)")
    return results


def _compare(args: argparse.Namespace) -> int:
    from .runs.summary import compare_table

    a, b = _load_run(args.a), _load_run(args.b)
    name_a, name_b = args.label or ("A", "B")
    print(f"{name_a}: {args.a} ({a.name}, graph {a.fingerprint.get('graph_hash')})")
    print(f"{name_b}: {args.b} ({b.name}, graph {b.fingerprint.get('graph_hash')})")
    if a.fingerprint.get("graph_hash") != b.fingerprint.get("graph_hash"):
        print("note: the two runs solved different graphs")
    width = args.width or shutil.get_terminal_size((120, 24)).columns
    print(compare_table(a.records, b.records, name_a, name_b, width=max(width, 40)))
    return 0


# ---- report ------------------------------------------------------------------------------------------
def _report(args: argparse.Namespace) -> int:
    from .runs.html_report import ReportError, report_run

    print(f"capturing the graph of {args.run_dir} again ...", flush=True)
    try:
        path = report_run(args.run_dir)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    print(f"report written to {path} (opens in any browser, offline)")
    return 0


# ---- main --------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="opt-remat", description=DESCRIPTION, formatter_class=raw)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    solvers = _solver_names()

    run = sub.add_parser("run", help="solve every (budget, solver) pair of a YAML config, verify, report",
                         description=_para("Capture the config's model once, solve every (budget, solver) pair, "
                                           "check each plan's gradients and memory, and write the results "
                                           "(a rerun resumes: see below)."),
                         epilog=RUN_EPILOG, formatter_class=raw)
    run.add_argument("config", help="a YAML run configuration (see configs/)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a config value (YAML), e.g. --set budgets=[0.5] --set solvers.1.time_limit_s=5")
    run.add_argument("--jobs", type=int, default=1, help="solve pairs in N parallel processes (default 1)")
    run.add_argument("--executor", choices=["process", "ray"], default="process",
                     help="where the --jobs workers run: local processes (default) or a ray cluster "
                          "(pip install 'opt-remat[ray]')")
    run.set_defaults(func=_run)

    solve = sub.add_parser("solve", help="solve one (budget, solver) pair of a config and save the plan",
                           description=_para("Solve a config's model at one budget with one solver and write the "
                                             "plan file that opt_remat.backend(plan=...) applies in training."))
    solve.add_argument("config", help="a YAML run configuration: its model, capture settings, budgets and solvers")
    solve.add_argument("--solver", default=None, metavar="SOLVER",
                       help=f"a solver ({solvers}) or a label from the config; default: the config's first "
                            "solver. Its options come from the config's entry for it")
    solve.add_argument("--budget", default=None,
                       help=f"{BUDGET_HELP}, or a peak ('{{peak: 700KiB}}'), as the config's budgets are written; "
                            "default: every budget of the config, a plan file each")
    solve.add_argument("-o", "--output", required=True,
                       help="the plan file to write (JSON); with several budgets, NAME-BUDGET.json each")
    solve.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (YAML)")
    solve.add_argument("--offload", nargs="?", const="true", default=None, metavar="SETTINGS",
                       help="offload to host memory is one of the planner's choices under a peak budget (as the "
                            "config's 'offload:'); optionally with settings, e.g. '{host_memory: 64GiB}'")
    solve.set_defaults(func=_solve)

    show = sub.add_parser("show", help="what a saved plan saves and recomputes, by op",
                          description=_para("Print what a plan file was made for and what its plans save and "
                                            "recompute, grouped by op, with the modules they come from."))
    show.add_argument("plan", help="a plan file written by 'opt-remat solve' or by 'run' (OUT/plans/*.json)")
    show.add_argument("--names", action="store_true", help="list the values of each op too")
    show.set_defaults(func=_show)

    compare = sub.add_parser("compare", help="two result sets side by side",
                             description=_para("Two runs' results pair by pair: saved bytes, recompute cost and "
                                               "solve time of each, with relative changes (B against A)."))
    compare.add_argument("a", help="the first run: an output folder of 'opt-remat run' (or its results.json)")
    compare.add_argument("b", help="the second run, compared against the first")
    compare.add_argument("--label", nargs=2, metavar=("A", "B"), help="column labels (default A B)")
    compare.add_argument("--width", type=int, default=None,
                         help="wrap the table to this many characters (default: the terminal's width, "
                              "120 when not a terminal)")
    compare.set_defaults(func=_compare)

    report = sub.add_parser("report", help="write a finished run's interactive HTML report (report.html)",
                            description=_para("(Re)write OUT/report.html for a run's output folder: one page that "
                                              "opens offline, with the Pareto plot, the live memory of the step "
                                              "per budget and plan, what each plan saves and recomputes, gradient "
                                              "checks and solve times. 'run' writes it too (output format html). "
                                              "The run's graph is captured again from the configuration stored in "
                                              "results.json, and must be the graph the run solved."))
    report.add_argument("run_dir", help="a run's output folder (the one holding results.json)")
    report.set_defaults(func=_report)

    listing = sub.add_parser("solvers", help="list the solvers, the budgets each meets and their options",
                             description=_para("Every solver with the budgets it meets (none, saved bytes, "
                                               "peak) and its options: default, meaning, and the budgets "
                                               "it applies under. An option given where it does not apply "
                                               "is an error that names the options that do."))
    listing.set_defaults(func=lambda args: print(catalog_reference()) or 0)

    demo = sub.add_parser("demo", help="partition a built-in model's training step and verify it",
                          description=_para("Partition a built-in model's training step with each solver and check "
                                            "its gradients against saving everything."))
    demo.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "resnet", "mlp"],
                      help="the built-in model to partition (default gpt2, with dropout)")
    demo.add_argument("--layers", type=int, default=2, help="blocks of gpt2, llama or mlp (default 2)")
    demo.add_argument("--batch", type=int, default=2, help="batch size of the example inputs (default 2)")
    demo.add_argument("--solvers", nargs="+", default=["mincut"], metavar="SOLVER", choices=solvers.split(", "),
                      help=f"solvers to compare, each checked against save-all's gradients (default mincut); "
                           f"one or more of: {solvers}")
    demo.add_argument("--budget", default=None, type=cli_budget,
                      help=f"the saved-activation budget: {BUDGET_HELP}; default: none (torch's setting)")
    demo.add_argument("--device", default="h100",
                      help="the device profile recompute costs are estimated for (h100, a100, ...)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: usage errors exit 2, --help exits 0
        return int(exc.code or 0)
    # imported after parsing: --help answers without importing torch
    from .interrupt import quiet_interrupts
    from .runs import ConfigError, RunError

    try:
        with quiet_interrupts():  # Ctrl-C: the one line below, no warning or traceback before it
            rc = args.func(args)
        sys.stdout.flush()  # a reader that went away (| head) shows here, handled below
        return rc
    except (ConfigError, UsageError) as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    except RunError as exc:
        _err(str(exc))
        return 1
    except (ValueError, KeyError) as exc:
        if args.command in ("demo", "solve"):
            _err(str(exc))
            return EXIT_BAD_INPUT
        raise
    except SolveStopped as exc:  # ``solve`` says which plan files it wrote
        _err(str(exc))
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # ``run`` says where its finished pairs are; other commands write at the end
        _err("interrupted; nothing was written" if args.command == "solve" else "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into head and the like: stop quietly
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not raise BrokenPipeError again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
