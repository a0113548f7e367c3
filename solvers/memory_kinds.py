"""What a rank's memory holds, by kind: named once here and used by the simulator
(``solvers.rank_memory``), results and reports. A new kind (offload's host copies, transfers in
flight) is one more member."""

from __future__ import annotations

from enum import Enum


class MemoryKind(str, Enum):
    # the graph's own buffers (``solvers.liveness``)
    ACTIVATIONS = "activations"  # forward values and values recomputed in the backward
    TEMPORARIES = "temporaries"  # backward values that are not gradients
    GRADIENTS = "gradients"  # parameter gradients as the graph makes them (unsharded under FSDP)
    # what the rank holds besides the graph (``solvers.training`` says how the step is trained)
    SHARDED_PARAMS = "sharded parameters"  # parameters as stored: master dtype, 1/N under FSDP
    GATHERED_PARAMS = "gathered parameters"  # FSDP: a unit's full parameters while it runs
    SHARDED_GRADS = "sharded gradients"  # FSDP: a unit's gradient shard after its reduce-scatter
    OPTIMIZER = "optimizer state"
    ALL_GATHER = "all-gather buffers"
    REDUCE_SCATTER = "reduce-scatter buffers"
    # offload (``solvers.offload``)
    HOST = "host"  # offloaded values held in host memory (not device bytes)
    IN_FLIGHT = "in flight"  # device bytes of values being copied to or from host memory


# the kinds the graph's simulation counts (what a plan changes); the others are the rank's
GRAPH_KINDS = (MemoryKind.ACTIVATIONS, MemoryKind.TEMPORARIES, MemoryKind.GRADIENTS)
OFFLOAD_KINDS = (MemoryKind.HOST, MemoryKind.IN_FLIGHT)
RESIDENT_KINDS = tuple(k for k in MemoryKind if k not in GRAPH_KINDS and k not in OFFLOAD_KINDS)
