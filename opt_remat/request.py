"""A solve request: everything besides the graph that decides a plan, checked once where it is made.

The API's ``Partitioner`` and a YAML run's pairs (``runs.config_rules``, ``runs.execute``) make
theirs with ``make_request``, so a bad value is the same one-line error in both: a
``RequestError`` (a ``ValueError``) whose ``field`` names the setting (``budget``, ``solver``,
``options.KEY``, ``device``, ...). ``opt_remat.road`` turns a request and a graph into a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping

from solvers import catalog
from solvers.budget import Fraction, parse_budget
from solvers.errors import TrainingSetupError
from solvers.training import TrainingSetup, training_setup

from .formats.plan_file import read_plan_file

from .costs import DeviceProfile, get_profile
from .errors import RequestError
from .options import TORCH_SOLVER, check_solver_options, possible_modes

COSTS = ("roofline", "profile")
# a run config's name for "no solver named" (the API's solver=None): the default path
DEFAULT_SOLVER = catalog.DEFAULT  # the fast default under a peak budget, HiGHS from min-cut under bytes

# lam="auto": a second of recompute is worth 10% of the bytes the device moves in a second, so that
# bandwidth-bound ops (pointwise, views) are recomputed and compute-bound ones (matmuls) are saved
AUTO_LAM_FRACTION_OF_BANDWIDTH = 0.1


def auto_lam(profile: DeviceProfile) -> float:
    """``lam="auto"`` on a device: the min-cut weight the default path uses."""
    return AUTO_LAM_FRACTION_OF_BANDWIDTH * profile.bandwidth


# a device budget without a ``training`` set-up: the step on one device, parameters and their
# gradients in fp32, no optimizer state
ONE_DEVICE = TrainingSetup(optimizer="none")


@dataclass(frozen=True)
class SolveRequest:
    """What to solve for: made by ``make_request`` (which checks it); picklable, so that a run's
    worker processes get it with the problem."""
    solver: str | None = None  # None: the default path
    budget: int | float | str | None = None  # saved bytes or a fraction, as written
    peak_budget: int | None = None  # bytes of the step's peak
    count_gradients: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)
    profile: DeviceProfile = field(default_factory=lambda: get_profile("h100"))
    costs: str = "roofline"
    rng_replay: bool = True
    count_input_bytes: bool = False
    plan_path: Path | None = None  # a plan file applied instead of solving
    plan_data: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    # offload is one of the planner's choices (under a peak budget, solvers.offload_plan; without
    # one, PREFER_CPU_OFFLOAD values are offloaded as torch documents); MUST_CPU_OFFLOAD always is
    offload: bool = False
    host_memory: int | None = None  # host bytes offloaded values may use; None: no cap
    offload_min_bytes: int = 1 << 20  # smaller values are never offloaded

    device_memory: int | None = None  # bytes of the device: a peak budget on the rank's whole memory
    training: TrainingSetup | None = None  # how the step is trained (None: ONE_DEVICE under device_memory)

    @property
    def rank_setup(self) -> TrainingSetup | None:
        """The set-up the rank's memory is counted under: ``training``, else one device without an
        optimizer where a device budget is given, else None (the graph's memory alone)."""
        if self.training is not None:
            return self.training
        return ONE_DEVICE if self.device_memory is not None else None

    @property
    def peak_limit(self) -> int | None:
        """The bytes a peak solve must fit: the peak budget or the device's memory."""
        return self.peak_budget if self.peak_budget is not None else self.device_memory

    @property
    def torch_baseline(self) -> bool:
        """torch's own partitioner, run as a baseline (not a plan file that a torch solve wrote)."""
        return self.solver == TORCH_SOLVER and self.plan_data is None

    @property
    def replays_rng(self) -> bool:
        """torch's partitioner knows nothing of opt-remat's RNG-state nodes: none for it."""
        return self.rng_replay and not self.torch_baseline


def make_request(solver: str | None = None, budget: int | float | str | None = None, *,
                 peak_budget: int | str | None = None, count_gradients: bool = True,
                 options: Mapping[str, Any] | None = None,
                 device: str | DeviceProfile | Mapping[str, Any] = "h100", costs: str = "roofline",
                 rng_replay: bool = True, count_input_bytes: bool = False, plan: str | Path | None = None,
                 offload: bool | Mapping[str, Any] = False, option_modes: Collection[str] | None = None,
                 device_memory: int | str | None = None,
                 training: Mapping[str, Any] | TrainingSetup | None = None) -> SolveRequest:
    """A checked request; the first bad setting raises ``RequestError`` naming it. ``option_modes``:
    the modes the options must apply in (default: those the budgets allow; a run config passes its
    budgets' modes, as a solver entry serves all of them)."""
    for name, value in (("count_gradients", count_gradients), ("rng_replay", rng_replay),
                        ("count_input_bytes", count_input_bytes)):
        if not isinstance(value, bool):
            raise RequestError(name, f"{name} must be true or false, got {value!r}")
    offload_on, host_memory, min_bytes = offload_settings(offload)
    if costs not in COSTS:
        raise RequestError("costs", f"costs must be 'roofline' or 'profile', got {costs!r}")
    try:
        parse_budget(budget)
        peak = parse_budget(peak_budget)
    except ValueError as exc:
        raise RequestError("budget" if peak_budget is None else "peak_budget", str(exc)) from None
    if isinstance(peak, Fraction):
        raise RequestError("peak_budget", f"peak_budget is bytes (an int or a string such as '200MiB'), "
                                          f"got {peak_budget!r}")
    device_bytes, setup = _device_and_training(device_memory, training)
    if device_bytes is not None and peak is not None:
        raise RequestError("device_memory", "give peak_budget (the graph's peak) or device_memory (the rank's "
                                            "whole memory), not both")
    peak_like = peak if peak is not None else device_bytes
    try:
        profile = get_profile(device)
    except (ValueError, TypeError, KeyError) as exc:
        raise RequestError("device", str(exc)) from None
    if offload_on and profile.host_bandwidth <= 0:
        raise RequestError("offload", f"offload needs the device's host-link bandwidth: device {profile.name!r} "
                                      "has none; give host_bandwidth (bytes/s) with the device's figures")
    if solver == DEFAULT_SOLVER:  # the catalog's name for what no name asks for
        solver = None
    opts = dict(options or {})
    _check_options(solver, opts, possible_modes(budget, peak_like) if option_modes is None else option_modes)
    if peak_like is not None and plan is None and solver not in (None, *catalog.supporting(catalog.PEAK)):
        which = "peak_budget" if peak is not None else "device_memory"
        raise RequestError("solver", f"solver {solver!r} has no peak-budget mode: {which} works with solver "
                                     f"{', '.join(map(repr, catalog.supporting(catalog.PEAK)))} or none (the default)")
    plan_path = None if plan is None else Path(plan)
    if plan_path is not None and not plan_path.exists():
        raise FileNotFoundError(f"plan file {str(plan_path)!r} not found: expected a JSON plan written by "
                                "'opt-remat solve -o FILE' (a relative path starts at the working directory)")
    return SolveRequest(solver, budget, peak, count_gradients, opts, profile, costs, rng_replay,
                        count_input_bytes, plan_path, read_plan_file(plan_path) if plan_path is not None else None,
                        offload_on, host_memory, min_bytes, device_bytes, setup)


def request_for(base: SolveRequest, solver: str | None = None, budget: int | float | str | None = None,
                **settings: Any) -> SolveRequest:
    """``base``'s graph-level settings (device, costs, rng_replay, count_input_bytes, offload,
    training) with a solver, budget and ``settings`` (``make_request``'s other keywords), checked as
    ``make_request`` checks them: how a run's checks and its pairs extend the run's request."""
    offload = {"host_memory": base.host_memory, "min_bytes": base.offload_min_bytes} if base.offload else False
    return make_request(solver, budget, device=base.profile, costs=base.costs, rng_replay=base.rng_replay,
                        count_input_bytes=base.count_input_bytes, offload=offload, training=base.training,
                        **settings)


def _device_and_training(device_memory: int | str | None, training: Mapping[str, Any] | TrainingSetup | None
                         ) -> tuple[int | None, TrainingSetup | None]:
    """The device's bytes and the training set-up, checked; errors name ``device_memory`` or
    ``training.FIELD``."""
    try:
        parsed = parse_budget(device_memory)
    except ValueError as exc:
        raise RequestError("device_memory", f"device_memory: {exc}") from None
    if isinstance(parsed, Fraction) or (parsed is not None and parsed <= 0):
        raise RequestError("device_memory", f"device_memory is the device's bytes (an int or a string such as "
                                            f"'80GiB'), got {device_memory!r}")
    try:
        setup = training_setup(training)
    except TrainingSetupError as exc:
        where = str(exc).split(":", 1)[0]
        raise RequestError(where if where.startswith("training") else "training", str(exc)) from None
    return parsed, setup


OFFLOAD_KEYS = ("host_memory", "min_bytes")


def offload_settings(offload: bool | Mapping[str, Any]) -> tuple[bool, int | None, int]:
    """``offload=`` as given (true/false, or a mapping of ``OFFLOAD_KEYS``, which means true):
    whether offload is a choice, the host-memory cap, the smallest value offloaded."""
    if isinstance(offload, bool):
        return offload, None, 1 << 20
    if not isinstance(offload, Mapping):
        raise RequestError("offload", f"offload must be true, false or a mapping with {', '.join(OFFLOAD_KEYS)}, "
                                      f"got {offload!r}")
    unknown = sorted(set(offload) - set(OFFLOAD_KEYS))
    if unknown:
        raise RequestError(f"offload.{unknown[0]}", f"unknown offload setting {unknown[0]!r}; expected "
                                                    f"{' or '.join(OFFLOAD_KEYS)}")
    sizes: list[int | None] = []
    for key, default in (("host_memory", None), ("min_bytes", 1 << 20)):
        try:
            value = parse_budget(offload.get(key, default))
        except ValueError as exc:
            raise RequestError(f"offload.{key}", f"offload {key}: {exc}") from None
        if isinstance(value, Fraction):
            raise RequestError(f"offload.{key}", f"offload {key} is bytes (e.g. '64GiB'), got {offload[key]!r}")
        sizes.append(value)
    return True, sizes[0], sizes[1] if sizes[1] is not None else 1 << 20


def _check_options(solver: str | None, options: Mapping[str, Any], modes: Collection[str]) -> None:
    """The catalog's check, one option at a time so that the error names the one at fault."""
    if solver is not None and solver not in catalog.names():
        raise RequestError("solver", f"unknown solver {solver!r}; expected one of: {', '.join(catalog.names())}")
    for key, value in options.items():
        checked = 0.0 if (key, value) == ("lam", "auto") else value  # "auto" is resolved per device
        try:
            check_solver_options(solver, {key: checked}, modes)
        except ValueError as exc:
            raise RequestError(f"options.{key}", str(exc)) from None
