"""The live storages of a whole training step, compiled regions included: a storage tracker that
``torch.compile`` ignores (``ignore_compile_internals``), so the layers compiled with
``opt_remat.backend(plan=...)`` run compiled under it (a plain dispatch mode makes dynamo run
every frame eagerly). It sees every op, eager or in a compiled graph, on any device, CPU
included; what existed before it was entered (parameters, optimizer state) is not counted."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from .memory import _StorageTracker


class StepTracker(_StorageTracker):
    """``with StepTracker() as t: step()``; then ``t.peak``: the most bytes of storages made in the
    step alive at once (each storage once, its bytes)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages of ``tensors`` (parameters, optimizer state)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
