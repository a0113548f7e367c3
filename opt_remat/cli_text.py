"""The plain-text parts of ``opt-remat --help`` (argparse prints them as they are written)."""

from __future__ import annotations

import textwrap

DESCRIPTION = """\
Choose which activations a PyTorch training step saves for the backward and which it recomputes.

examples:
  opt-remat demo --model gpt2 --solvers mincut cpsat --budget 0.5
  opt-remat run configs/mlp.yaml                      solve, check and report every pair of a config
  opt-remat solve configs/llama.yaml --budget 0.5 -o plan.json
  opt-remat show plan.json
  opt-remat compare runs/a runs/b
  opt-remat report runs/mlp                           (re)write a finished run's report.html
  opt-remat solvers                                   the solvers, their budgets and options

Bad input (configuration, options, files) exits with code 2 and one line naming what is wrong;
Ctrl-C exits with 130. 'opt-remat COMMAND --help' describes each command."""

RUN_EPILOG = """\
output folder (the config's output.dir; default runs/CONFIG-NAME beside the config file):
  results.json, results.csv   one record per (budget, solver) pair, rewritten after every pair
  summary.txt                 the summary table printed at the end
  report.html                 the interactive report: plots, tables, live memory per step (offline)
  pareto.png, memory.png      saved memory vs recompute cost; live memory during the step
  plans/BUDGET__SOLVER.json   each plan, for opt_remat.backend(plan=...) or 'opt-remat show'

resume: an interrupted run (Ctrl-C, a crash) keeps the pairs it finished; running the same
command again skips every pair whose budget, solver and options are unchanged and solves the
rest. Delete the output folder to start over."""

BUDGET_HELP = ("a fraction in [0, 1] of the way from the least-memory plan to torch's min-cut plan "
               "(0.5), or bytes ('2MiB', '1.5GB', 1500000)")


def para(text: str) -> str:
    """A paragraph of --help text wrapped at 100 columns (the help formatter keeps it as it is)."""
    return textwrap.fill(text, 100)
