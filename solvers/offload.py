"""Offloading saved values to host memory: what it frees on the device and what it costs in time.

The model (the lowering is torch's pass, ``opt_remat.offload``):

* an offloaded value's D2H copy runs on its own stream, from the end of the value's last forward
  use (torch's pass places it there; for most saved values that is the op right after the one
  that made it), overlapping the forward compute after it; copies on one stream run one at a
  time, in that order, at the link's bandwidth. The device holds the value until its copy ends;
  copies still running when the forward's compute is done hold up the step (exposed time);
* the H2D copy is prefetched ahead of the value's first backward use: copies on the other stream,
  one at a time, each as late as it can end by that use, none starting before the backward does;
  the part of a copy that cannot be hidden so is exposed. The device holds the value again from
  the start of its H2D copy (the buffer is allocated then) to its last use, as for a saved value;
* compute time is the problem's per-node costs (``Node.cost``) in the simulator's order (backward
  values have theirs where the problem was built with them, ``build_problem(backward_costs=True)``;
  without, only recomputation hides reloads);
* host memory holds every offloaded value from the end of the forward to its reload: the cap
  (``HostLink.host_bytes``) bounds their sum; values under ``HostLink.min_bytes`` are not
  candidates (their copies are too small to use the link's bandwidth).

``offload_timeline`` gives the device bytes to take off each step of the simulator's curve
(``liveness.simulate_plan``), the bytes in flight at each step, the exposed seconds and the host
bytes; ``offloaded_curve`` the curve with those adjustments.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate

from .liveness import MemoryCurve, simulate_plan
from .problem import Plan, Problem, Role


@dataclass(frozen=True)
class HostLink:
    """A device's link to pinned host memory."""
    d2h: float  # bytes/s, device to host
    h2d: float  # bytes/s, host to device
    host_bytes: int | None = None  # host memory offloaded values may use; None: no cap
    min_bytes: int = 1 << 20  # smaller values are not offload candidates

    def __post_init__(self) -> None:
        if not (self.d2h > 0 and self.h2d > 0):
            raise ValueError(f"host link bandwidths must be > 0 bytes/s, got d2h={self.d2h}, h2d={self.h2d}")


# pinned-memory bandwidth of the host link each device sits on (PCIe x16): Gen5 (H100) ~50 GB/s,
# Gen4 (A100) ~25 GB/s, Gen3 (V100) ~12 GB/s; a CPU's "offload" is a copy within its own memory
LINK_BANDWIDTH: dict[str, float] = {"h100": 50e9, "a100": 25e9, "v100": 12e9, "cpu": 5e10}


def link_for(device: str, *, host_bytes: int | None = None, min_bytes: int = 1 << 20) -> HostLink:
    """The preset link of a device profile by name."""
    try:
        bw = LINK_BANDWIDTH[device.lower()]
    except KeyError:
        raise ValueError(f"no host-link preset for device {device!r}; use one of {sorted(LINK_BANDWIDTH)} "
                         "or HostLink(d2h=..., h2d=...)") from None
    return HostLink(bw, bw, host_bytes, min_bytes)


def alone_in_storage(problem: Problem, saved: Iterable[str]) -> frozenset[str]:
    """The values of ``saved`` whose storage holds no other saved value: the only ones offload
    can move (torch's async wait frees the whole storage)."""
    saved = list(saved)
    count: dict[str, int] = {}
    for v in saved:
        g = problem.by_name[v].storage_id
        count[g] = count.get(g, 0) + 1
    return frozenset(v for v in saved if count[problem.by_name[v].storage_id] == 1)


def offload_errors(problem: Problem, plan: Plan, link: HostLink | None = None) -> list[str]:
    """Why ``plan.offloaded`` cannot be lowered (empty if it can): each value saved, offloadable
    (``Node.offload_ban``), alone in its storage among the saved values (torch's async wait frees
    the storage), and with ``link``, the host cap kept."""
    errors: list[str] = []
    alone = alone_in_storage(problem, (v for v in plan.saved if v in problem.by_name))
    for v in sorted(plan.offloaded):
        node = problem.by_name.get(v)
        if node is None:
            errors.append(f"offloaded {v!r} is not a node")
        elif v not in plan.saved:
            errors.append(f"offloaded {v!r} is not saved")
        elif node.offload_ban or node.role not in (Role.FORWARD, Role.EITHER):
            errors.append(f"{v!r} cannot be offloaded: {node.offload_ban or 'not a forward value'}")
        elif v not in alone:
            errors.append(f"{v!r} cannot be offloaded: its storage holds another saved value")
    if link is not None and link.host_bytes is not None and not errors:
        used = host_bytes(problem, plan.offloaded)
        if used > link.host_bytes:
            errors.append(f"offloaded values need {used} bytes of host memory, over the cap {link.host_bytes}")
    return errors


def offload_candidates(problem: Problem, link: HostLink) -> list[str]:
    """Values a planner may choose to offload: offloadable and at least ``link.min_bytes``."""
    size = problem.storage_size
    return [n.name for n in problem.candidates
            if n.role in (Role.FORWARD, Role.EITHER) and not n.offload_ban and problem.can_save(n.name)
            and n.storage_id == n.name and size[n.name] >= link.min_bytes]


def host_bytes(problem: Problem, offloaded: Iterable[str]) -> int:
    size = problem.storage_size
    return sum(size[g] for g in {problem.by_name[v].storage_id for v in offloaded})


@dataclass(frozen=True)
class OffloadTimeline:
    steps: tuple[tuple[str, str], ...]  # (phase, value) of each step, the simulator's order
    adjust: tuple[int, ...]  # bytes to add to the device's live bytes at each step (<= 0)
    in_flight: tuple[int, ...]  # device bytes being copied to or from the host at each step
    d2h_exposed_s: float
    h2d_exposed_s: float
    host_bytes: int
    # value -> (D2H start, D2H end) in seconds from the forward's start, (H2D start, H2D end) from
    # the backward's
    copies: Mapping[str, tuple[float, float, float, float]]
    away: Mapping[str, range] = field(default_factory=dict)  # value -> the steps it is off the device

    @property
    def exposed_s(self) -> float:
        return self.d2h_exposed_s + self.h2d_exposed_s


def _readers(problem: Problem, order: Sequence[str], offloaded: set[str]) -> dict[str, list[int]]:
    """For each offloaded value, the positions in ``order`` of the steps that read it (or a view
    of its storage)."""
    by_name = problem.by_name
    of_storage = {by_name[v].storage_id: v for v in offloaded}
    out: dict[str, list[int]] = {v: [] for v in offloaded}
    for i, name in enumerate(order):
        for u in by_name[name].inputs:
            v = of_storage.get(by_name[u].storage_id)
            if v is not None:
                out[v].append(i)
    return out


def offload_timeline(problem: Problem, saved: Iterable[str], offloaded: Iterable[str], link: HostLink,
                     curve: MemoryCurve | None = None) -> OffloadTimeline:
    """The model above for a plan saving ``saved`` and offloading ``offloaded`` (a subset);
    ``curve``: the plan's curve if simulated already."""
    saved, off = set(saved), set(offloaded)
    if not off <= saved:
        raise ValueError(f"offloaded values {sorted(off - saved)[:5]} are not saved")
    curve = curve if curve is not None else simulate_plan(problem, saved)
    steps = tuple((ph, v) for ph, v, _ in curve.steps)
    fwd = [v for ph, v in steps if ph == "forward"]
    bwd = [v for ph, v in steps if ph == "backward"]
    by_name, size = problem.by_name, problem.storage_size
    nbytes = {v: size[by_name[v].storage_id] for v in off}
    f_end = list(accumulate(by_name[v].cost for v in fwd))  # each forward step's end, seconds
    b_end = list(accumulate(by_name[v].cost for v in bwd))
    f_total = f_end[-1] if f_end else 0.0
    position = {v: i for i, v in enumerate(fwd)}

    # D2H: FIFO from the end of the last forward use; freed after the step during which it ends
    f_read = _readers(problem, fwd, off)
    ready = {v: f_end[max([position[v], *f_read[v]])] for v in off}
    d2h: dict[str, tuple[float, float]] = {}
    free_after: dict[str, int] = {}
    clock = 0.0
    for v in sorted(off, key=lambda v: (ready[v], position[v])):
        start = max(ready[v], clock)
        clock = start + nbytes[v] / link.d2h
        d2h[v] = (start, clock)
        k = bisect.bisect_left(f_end, clock)  # first step ending at or after the copy's end
        free_after[v] = k  # k == len(fwd): held to the forward's end
    d2h_exposed = max(0.0, clock - f_total) if off else 0.0

    # H2D: as late as possible before the first backward use, one at a time, none before 0
    b_read = _readers(problem, bwd, off)
    first = {v: min(b_read[v]) if b_read[v] else len(bwd) for v in off}
    b_start = [0.0, *b_end]
    deadline = {v: b_start[first[v]] for v in off}
    alap: dict[str, float] = {}
    nxt = float("inf")
    # one total order (ties by forward position): the ALAP pass walks it backwards, the copies run
    # forwards in it; a set's iteration order must not decide which of two tied copies is late
    h2d_order = sorted(off, key=lambda v: (deadline[v], first[v], position[v]))
    for v in reversed(h2d_order):
        end = min(deadline[v], nxt)
        alap[v] = nxt = end - nbytes[v] / link.h2d
    h2d: dict[str, tuple[float, float]] = {}
    clock, late = 0.0, 0.0
    for v in h2d_order:
        start = max(alap[v], clock)
        clock = start + nbytes[v] / link.h2d
        h2d[v] = (start, clock)
        late = max(late, clock - deadline[v])

    # per value, ranges of steps get its bytes: difference arrays, summed once (O(steps + values))
    adjust_d = [0] * (len(steps) + 1)
    flight_d = [0] * (len(steps) + 1)
    nf = len(fwd)
    f_begin = [0.0, *f_end]
    away: dict[str, range] = {}

    def add(diff: list[int], lo: int, hi: int, n: int) -> None:
        if lo < hi:
            diff[lo] += n
            diff[hi] -= n

    for v in off:
        back = min(bisect.bisect_right(b_end, h2d[v][0]), len(bwd))  # the step its H2D starts in
        away[v] = range(free_after[v] + 1, nf + back)
        add(adjust_d, away[v].start, max(away[v].start, away[v].stop), -nbytes[v])
        # steps overlapping the copy: begin < copy end and end > copy start
        add(flight_d, bisect.bisect_right(f_end, d2h[v][0]), bisect.bisect_left(f_begin, d2h[v][1], hi=nf), nbytes[v])
        add(flight_d, nf + bisect.bisect_right(b_end, h2d[v][0]),
            nf + bisect.bisect_left(b_start, h2d[v][1], hi=len(bwd)), nbytes[v])
    adjust = list(accumulate(adjust_d[:-1]))
    in_flight = list(accumulate(flight_d[:-1]))
    copies = {v: (*d2h[v], *h2d[v]) for v in off}
    return OffloadTimeline(steps, tuple(adjust), tuple(in_flight), d2h_exposed, max(0.0, late),
                           host_bytes(problem, off), copies, away)


def offloaded_curve(problem: Problem, saved: Iterable[str], offloaded: Iterable[str], link: HostLink,
                    base: MemoryCurve | None = None) -> tuple[MemoryCurve, OffloadTimeline]:
    """The step's device curve with ``offloaded`` in host memory as the model says, and the timeline.
    ``peak_live`` and ``peak_gradients`` are kept where the peak stays at the simulator's step (less
    the values away there), empty where it moves (they would need a second simulation). ``base``:
    the plan's curve without offload, if the caller has it (``simulate_plan(problem, saved)``)."""
    saved = set(saved)
    if base is None:
        base = simulate_plan(problem, saved)
    timeline = offload_timeline(problem, saved, offloaded, link, base)
    steps = tuple((ph, v, b + a) for (ph, v, b), a in zip(base.steps, timeline.adjust))
    if not steps:
        return base, timeline
    top = max(range(len(steps)), key=lambda i: (steps[i][2], -i))
    same = (steps[top][0], steps[top][1]) == (base.peak_phase, base.peak_at)
    gone = {problem.by_name[v].storage_id for v, steps_away in timeline.away.items() if top in steps_away}
    curve = replace(base, steps=steps, peak=steps[top][2], peak_phase=steps[top][0], peak_at=steps[top][1],
                    peak_live=base.peak_live - gone if same else frozenset(),
                    peak_gradients=base.peak_gradients if same else 0)
    return curve, timeline
