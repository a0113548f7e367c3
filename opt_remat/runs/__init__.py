"""Offline runs (``opt-remat run`` / ``solve``): one module per job.

``config`` (typed YAML configurations; ``config_rules``: ``load_config``, what types cannot say,
and the wording of errors; ``yaml_lines``: YAML with the line of every key, ``--set``) -> ``workload`` (capture once)
-> ``execute`` (solve the pairs: here, in a process pool, or on Ray) -> ``verification`` (measured
bytes, gradients) -> ``results`` (typed records, results.json/csv, resume) -> ``summary``,
``plots``, ``html_report`` (report.html: ``html_data`` -> ``html_figures``, ``html_page``);
``plan_files``, ``solve_files`` (``opt-remat solve``) and ``show`` for plan files, ``progress`` for the live display, and ``loop`` for
the run itself. Each pair is solved, lowered and verified through ``opt_remat.road``, the road the
API takes. Importing this package imports torch (the solve settings are checked as the API's are).
"""

from .config import BudgetSpec, Config, ConfigError, SolverSpec
from .config_rules import load_config
from .loop import RunSummary, run
from .results import Record, read_results
from .util import RunError, SolveRefused
from .workload import Workload, materialize, materialize_all

__all__ = ["BudgetSpec", "Config", "ConfigError", "Record", "RunError", "RunSummary", "SolveRefused",
           "SolverSpec", "Workload", "load_config", "materialize", "materialize_all", "read_results", "run"]
