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
import torch  # noqa: E402  (after the cache directory is chosen)

torch.set_num_threads(2)


@pytest.fixture
def reset_dynamo():
    """Dynamo's caches cleared around a test that compiles (files opt in with ``pytestmark``)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
