"""Where opt-remat keeps what it learns across processes: ``$OPT_REMAT_CACHE_DIR`` (default
``~/.cache/opt-remat``), holding the op-cost cache (``opt_remat.profile_costs``) and the plans
remembered per graph (``opt_remat.plan_memory``). Torch-free, so that the runs' solve workers,
which remember plans, do not import torch to find the folder."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("OPT_REMAT_CACHE_DIR") or os.path.join(Path.home(), ".cache", "opt-remat")
    return Path(root)


def replace_file(path: Path, text: str) -> None:
    """``text`` written to ``path`` through a temporary file and a rename, so that another process
    reading the cache never sees half a file. Raises ``OSError`` (callers treat the cache as best
    effort)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
