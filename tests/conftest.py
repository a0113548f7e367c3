import atexit
import os
import shutil
import tempfile

# A fresh compile cache per test session (inherited by the subprocesses tests start): inductor's
# and AOTAutograd's caches stay on with opt-remat's backend, and a hit left on disk by an earlier
# session would skip the partitioner that tests inspect.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="opt-remat-tests-inductor-")
atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

import pytest  # noqa: E402

try:  # tests/solvers/ also run in a venv without torch (.ci/run)
    import torch  # (after the cache directory is chosen)
except ImportError:
    torch = None
else:
    torch.set_num_threads(2)


@pytest.fixture
def reset_dynamo():
    """Dynamo's caches cleared around a test that compiles (files opt in with ``pytestmark``)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _fresh_plan_memory(tmp_path_factory, monkeypatch):
    """Plans remembered across solves (opt_remat.plan_memory) start empty in each test: on disk
    (a fresh cache folder, inherited by the subprocesses a test starts) and in this process."""
    from opt_remat import plan_memory
    monkeypatch.setenv("OPT_REMAT_CACHE_DIR", str(tmp_path_factory.mktemp("opt-remat-cache")))
    plan_memory.forget_all()
    yield
    plan_memory.forget_all()
