"""Kinds of memory a step's timeline splits its bytes into.

A stand-in until the rank-memory change (#41) lands its ``MemoryKind``: the two merge into one
enum there; the offload kinds below are what ``solvers.offload`` reports.
"""

from __future__ import annotations

from enum import Enum


class MemoryKind(str, Enum):
    ACTIVATIONS = "activations"  # saved, recomputed and temporary values on the device
    GRADIENTS = "gradients"
    HOST = "host"  # offloaded values held in host memory (not device bytes)
    IN_FLIGHT = "in_flight"  # device bytes of values being copied to or from host memory
