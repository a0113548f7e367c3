"""One base for every error opt-remat raises, errors modules that import no torch, and the torch-free
homes of the file formats and the disk cache."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import opt_remat
import solvers
from solvers.errors import OptRematError

REPO = Path(__file__).resolve().parents[2]
# a KeyboardInterrupt (``except Exception`` must not catch a Ctrl-C) and a private signal that
# carries a captured graph out of torch.compile: not errors
NOT_ERRORS = {"opt_remat.errors.SolveInterrupted", "opt_remat.cli.SolveStopped", "opt_remat.capture._Captured"}
TORCH_FREE = ["solvers.errors", "opt_remat.errors", "opt_remat.formats.plan_file",
              "opt_remat.formats.checkmate_graph", "opt_remat.disk_cache", "opt_remat.plan_memory"]


def _exception_classes() -> dict[str, type]:
    """Every exception class defined in ``solvers`` and ``opt_remat`` (modules whose optional
    dependency is missing are skipped)."""
    found: dict[str, type] = {}
    for package in (solvers, opt_remat):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:
                module = importlib.import_module(info.name)
            except ImportError:
                continue
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == info.name:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_error_derives_from_one_base():
    classes = _exception_classes()
    assert len(classes) >= 20  # the errors of both packages and the entry layer are all found
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, OptRematError) and name not in NOT_ERRORS)
    assert outside == []
    assert opt_remat.OptRematError is OptRematError and solvers.OptRematError is OptRematError


def test_errors_live_in_one_module_per_package_except_the_entry_layers():
    homes = {cls.__module__ for cls in _exception_classes().values()}
    entry = {m for m in homes if m.startswith("opt_remat.runs.") or m == "opt_remat.cli"}
    assert homes - entry - {"opt_remat.capture"} == {"solvers.errors", "opt_remat.errors"}


@pytest.mark.parametrize("name, base", [
    ("BudgetError", ValueError), ("PeakBudgetError", ValueError), ("GraphError", ValueError),
    ("PlanMismatchError", ValueError), ("SolveInterrupted", KeyboardInterrupt)])
def test_public_errors_keep_their_names_and_bases(name, base):
    cls = getattr(opt_remat, name)
    assert issubclass(cls, base) and cls is getattr(importlib.import_module("opt_remat.errors"), name)


def test_solver_errors_stay_value_errors():
    from solvers.errors import (BudgetInfeasibleError, InfeasibleError, MIPTimeLimitError,
                                PeakInfeasibleError, PlanError, ProblemError)
    for cls in (InfeasibleError, BudgetInfeasibleError, PeakInfeasibleError, PlanError, ProblemError):
        assert issubclass(cls, ValueError) and issubclass(cls, OptRematError)
    assert issubclass(MIPTimeLimitError, TimeoutError)
    assert issubclass(PeakInfeasibleError, InfeasibleError)
    assert "1.00 KiB" in str(PeakInfeasibleError(1024, 2048, proven=True))


def test_errors_formats_and_caches_import_no_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in TORCH_FREE)
            + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_plan_memory_and_profile_costs_share_the_cache_folder(tmp_path, monkeypatch):
    pytest.importorskip("torch")  # profile_costs times ops with torch
    from opt_remat.disk_cache import cache_dir
    from opt_remat.plan_memory import memory_path
    from opt_remat.profile_costs import cache_path
    monkeypatch.setenv("OPT_REMAT_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    assert cache_path().parent == memory_path("g").parent.parent == tmp_path


def test_peak_budget_error_is_one_sentence_that_does_not_contradict_itself():
    from opt_remat.errors import PeakBudgetError
    at_floor = str(PeakBudgetError(100, 300, 300, further="peak-search"))
    above = str(PeakBudgetError(100, 300, 200, further="peak-search"))
    assert "searches further" not in at_floor and "no plan can peak below" in at_floor
    assert "try solver 'peak-search', which searches further" in above and "200 bytes" in above
    for text in (at_floor, above):
        assert "(" + "it is" not in text and ") (" not in text and text.count(". ") == 0
        assert "raise peak_budget to at least 300 bytes" in text
