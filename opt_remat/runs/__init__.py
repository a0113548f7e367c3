"""Offline runs (``opt-remat run`` / ``solve`` / ``report`` / ``show``): one module per job.

``config`` (typed YAML configurations; ``config_rules``: ``load_config``, what types cannot say,
and the wording of errors; ``yaml_lines``: YAML with the line of every key, ``--set``) -> ``workload``
(capture once) -> ``execute`` (solve the pairs: here, in a process pool, or on Ray) -> ``loop`` (the
run: each plan's record, its step simulated once by ``curves``, its plan file written once by
``plan_files``, its checks by ``verification``) -> ``results`` (typed records with their curves,
results.json/csv, resume) -> ``run_data`` (the one loaded run the reports read) -> ``summary``,
``plots``, ``html_report`` (report.html: ``html_data`` -> ``html_figures``, ``html_page``). ``show``
prints a plan file, ``solve_files`` writes ``opt-remat solve``'s plan files, ``progress`` is the live
display. Each pair is solved, lowered and verified through ``opt_remat.road``, the road the API takes.
Importing this package imports torch (the solve settings are checked as the API's are).
"""

from .config import BudgetSpec, Config, ConfigError, SolverSpec
from .config_rules import load_config
from .loop import RunSummary, run
from .results import Record, read_results
from .util import RunError, SolveRefused
from .workload import Workload, materialize, materialize_all

__all__ = ["BudgetSpec", "Config", "ConfigError", "Record", "RunError", "RunSummary", "SolveRefused",
           "SolverSpec", "Workload", "load_config", "materialize", "materialize_all", "read_results", "run"]
