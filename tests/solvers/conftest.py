"""The torch-free tests: the pure solver package (``solvers/``) and the torch-free parts of
``opt_remat`` (errors, file formats, plan memory). They run in a venv without torch too
(``.ci/run``), so nothing here imports torch; a test that needs it says
``pytest.importorskip("torch")``. Fixtures and helpers: ``tests/conftest.py``, ``tests/support/``."""

import sys
from pathlib import Path

# ``support`` (tests/support/) importable whichever conftest pytest loads first
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
