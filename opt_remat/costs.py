"""Per-node recompute cost: a roofline estimate ``max(flops / peak_flops, bytes_moved / bandwidth)``.

Flops come from torch's own formulas (``torch.utils.flop_counter``); bytes moved are the bytes of
the tensors an op reads plus the bytes it writes (views move nothing). Device profiles:

| name   | peak_flops (FLOP/s) | bandwidth (B/s) | source                                        |
|--------|---------------------|-----------------|-----------------------------------------------|
| h100   | 9.89e14             | 3.35e12         | H100 SXM dense BF16 tensor core, HBM3         |
| a100   | 3.12e14             | 2.04e12         | A100 80GB SXM dense BF16 tensor core, HBM2e   |
| v100   | 1.25e14             | 9.0e11          | V100 SXM2 FP16 tensor core, HBM2              |
| cpu    | 1.0e12              | 5.0e10          | a many-core server CPU with AVX-512, DDR5     |

A custom profile is ``DeviceProfile(name, peak_flops, bandwidth)`` or a dict with those keys.
``host_bandwidth`` (optional) is the link to pinned host memory that offload copies over
(presets: ``solvers.offload.LINK_BANDWIDTH``, PCIe Gen5/Gen4/Gen3 for h100/a100/v100).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

from solvers.offload import LINK_BANDWIDTH


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    host_bandwidth: float = 0.0  # bytes/s to pinned host memory, each way (offload); 0: unknown

    def __post_init__(self) -> None:
        if not (self.peak_flops > 0 and self.bandwidth > 0):
            raise ValueError(
                f"device profile {self.name!r}: peak_flops and bandwidth must be > 0, "
                f"got {self.peak_flops} and {self.bandwidth}"
            )
        if not self.host_bandwidth >= 0:
            raise ValueError(f"device profile {self.name!r}: host_bandwidth must be >= 0 bytes/s, "
                             f"got {self.host_bandwidth}")


PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", 9.89e14, 3.35e12, LINK_BANDWIDTH["h100"]),
    "a100": DeviceProfile("a100", 3.12e14, 2.04e12, LINK_BANDWIDTH["a100"]),
    "v100": DeviceProfile("v100", 1.25e14, 9.0e11, LINK_BANDWIDTH["v100"]),
    "cpu": DeviceProfile("cpu", 1.0e12, 5.0e10, LINK_BANDWIDTH["cpu"]),
}


def get_profile(device: str | DeviceProfile | Mapping[str, Any]) -> DeviceProfile:
    """A profile by name, or a user-defined one from a mapping with peak_flops and bandwidth."""
    if isinstance(device, DeviceProfile):
        return device
    if isinstance(device, str):
        try:
            return PROFILES[device.lower()]
        except KeyError:
            raise ValueError(
                f"unknown device profile {device!r}; use one of {sorted(PROFILES)} or "
                "{peak_flops: FLOP/s, bandwidth: bytes/s}"
            ) from None
    if isinstance(device, Mapping):
        missing = {"peak_flops", "bandwidth"} - set(device)
        if missing:
            raise ValueError(f"device profile needs {sorted(missing)} (got keys {sorted(device)})")
        return DeviceProfile(str(device.get("name", "custom")), float(device["peak_flops"]),
                             float(device["bandwidth"]), float(device.get("host_bandwidth", 0.0)))
    raise TypeError(f"device must be a profile name, a DeviceProfile or a mapping, got {type(device)}")


def _hint(x: Any) -> Any:
    """A concrete int for a possibly symbolic size (its hint; 4096 for unbacked, like torch)."""
    if isinstance(x, torch.SymInt):
        return optimization_hint(x, fallback=4096)
    return x


def tensor_bytes(t: torch.Tensor) -> int:
    numel = 1
    for d in t.shape:
        numel *= int(_hint(d))
    return numel * t.dtype.itemsize


def node_flops(node: torch.fx.Node) -> int:
    """Flops of one FX node by torch's formulas; 0 for ops it has no formula for (pointwise etc.)."""
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    formula = flop_registry.get(packet) if packet is not None else None
    if formula is None:
        return 0

    def meta(x: Any) -> Any:
        if isinstance(x, torch.fx.Node):
            return x.meta.get("val")
        return x

    args = tree_map(meta, node.args)
    kwargs = tree_map(meta, node.kwargs)
    try:
        return int(_hint(formula(*args, out_val=node.meta.get("val"), **kwargs)))
    except Exception:  # a formula that does not fit these args: count it as bandwidth-bound
        return 0


def bytes_moved(node: torch.fx.Node, is_view: bool) -> int:
    if is_view:
        return 0
    total = 0
    for inp in node.all_input_nodes:
        val = inp.meta.get("val")
        if isinstance(val, torch.Tensor):
            total += tensor_bytes(val)
    outs, _ = tree_flatten(node.meta.get("val"))
    total += sum(tensor_bytes(o) for o in outs if isinstance(o, torch.Tensor))
    return total


def roofline_seconds(flops: int, moved: int, profile: DeviceProfile) -> float:
    return max(flops / profile.peak_flops, moved / profile.bandwidth)
