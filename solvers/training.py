"""How the step is trained: dtypes, optimizer and sharding, what a rank holds besides the graph.

A ``TrainingSetup`` is read from a plain dict (the YAML ``training:`` section, the API's
argument) by ``training_setup``; every bad field is one line naming it and what it accepts.
``solvers.rank_memory`` turns it and a problem's parameters into the rank's memory over the step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from .errors import TrainingSetupError

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "float8": 1, "fp64": 8, "float64": 8}
# optimizer state per parameter element, in tensors of the parameter's shard
OPTIMIZER_STATES = {"none": 0, "sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
SHARDINGS = ("none", "ddp", "fsdp")


@dataclass(frozen=True)
class TrainingSetup:
    param_dtype: str = "fp32"  # parameters in compute (FSDP2 MixedPrecisionPolicy.param_dtype)
    master_dtype: str = "fp32"  # parameters as stored (sharded under FSDP), and their gradients
    reduce_dtype: str = "fp32"  # gradients in the reduce-scatter / all-reduce
    optimizer: str = "adamw"
    state_dtype: str = "fp32"  # the optimizer's state
    sharding: str = "none"  # none (one device), ddp (replicated), fsdp (ZeRO-3)
    ranks: int = 1
    reshard_after_forward: bool = True  # FSDP: free a unit's gathered parameters after its forward
    prefetch: bool = True  # FSDP: gather the next unit while the current one runs

    def __post_init__(self) -> None:
        for name in ("param_dtype", "master_dtype", "reduce_dtype", "state_dtype"):
            value = getattr(self, name)
            if value not in DTYPE_BYTES:
                raise TrainingSetupError(f"training.{name}: {value!r} is not a dtype opt-remat knows; "
                                         f"use one of {', '.join(DTYPE_BYTES)}")
        if self.optimizer not in OPTIMIZER_STATES:
            raise TrainingSetupError(f"training.optimizer: {self.optimizer!r} is not known; "
                                     f"use one of {', '.join(OPTIMIZER_STATES)}")
        if self.sharding not in SHARDINGS:
            raise TrainingSetupError(f"training.sharding: {self.sharding!r} is not known; "
                                     f"use one of {', '.join(SHARDINGS)}")
        if not isinstance(self.ranks, int) or isinstance(self.ranks, bool) or self.ranks < 1:
            raise TrainingSetupError(f"training.ranks: {self.ranks!r} must be a whole number >= 1")
        if self.sharding == "none" and self.ranks != 1:
            raise TrainingSetupError(f"training.ranks: {self.ranks} ranks need sharding 'ddp' or 'fsdp' "
                                     "(sharding 'none' is one device)")
        for name in ("reshard_after_forward", "prefetch"):
            if not isinstance(getattr(self, name), bool):
                raise TrainingSetupError(f"training.{name}: {getattr(self, name)!r} must be true or false")

    @property
    def sharded(self) -> bool:
        return self.sharding == "fsdp"

    @property
    def shards(self) -> int:
        """How many ranks share each parameter's storage (1 unless FSDP)."""
        return self.ranks if self.sharded else 1

    def bytes_of(self, field_name: str) -> int:
        return DTYPE_BYTES[getattr(self, field_name)]

    def describe(self) -> str:
        where = {"none": "one device", "ddp": f"DDP over {self.ranks} ranks",
                 "fsdp": f"FSDP over {self.ranks} ranks"}[self.sharding]
        return (f"{where}, {self.optimizer} ({self.state_dtype} state), params {self.param_dtype} in "
                f"compute / {self.master_dtype} stored, gradients reduced in {self.reduce_dtype}")


# names the dict may use besides the fields' own
_ALIASES = {"world_size": "ranks", "sharded_dtype": "master_dtype", "optimizer_dtype": "state_dtype",
            "reshard": "reshard_after_forward"}


def training_setup(raw: Mapping[str, Any] | TrainingSetup | None) -> TrainingSetup | None:
    """A ``TrainingSetup`` from a plain dict (keys: the fields, or ``world_size``,
    ``sharded_dtype``, ``optimizer_dtype``, ``reshard``); None stays None."""
    if raw is None or isinstance(raw, TrainingSetup):
        return raw
    if not isinstance(raw, Mapping):
        raise TrainingSetupError(f"training: expected a mapping of settings, got {type(raw).__name__}")
    known = {f.name for f in fields(TrainingSetup)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = _ALIASES.get(str(key), str(key))
        if name not in known:
            raise TrainingSetupError(f"training.{key}: unknown setting; use one of {', '.join(sorted(known))}")
        if isinstance(value, str):
            value = value.strip().lower()
        values[name] = value
    return TrainingSetup(**values)
