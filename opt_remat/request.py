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
    offload: bool = False  # PREFER_CPU_OFFLOAD values offloaded too (opt_remat.offload)

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
                 offload: bool = False, option_modes: Collection[str] | None = None) -> SolveRequest:
    """A checked request; the first bad setting raises ``RequestError`` naming it. ``option_modes``:
    the modes the options must apply in (default: those the budgets allow; a run config passes its
    budgets' modes, as a solver entry serves all of them)."""
    for name, value in (("count_gradients", count_gradients), ("rng_replay", rng_replay),
                        ("count_input_bytes", count_input_bytes), ("offload", offload)):
        if not isinstance(value, bool):
            raise RequestError(name, f"{name} must be true or false, got {value!r}")
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
    try:
        profile = get_profile(device)
    except (ValueError, TypeError, KeyError) as exc:
        raise RequestError("device", str(exc)) from None
    if solver == DEFAULT_SOLVER:  # the catalog's name for what no name asks for
        solver = None
    opts = dict(options or {})
    _check_options(solver, opts, possible_modes(budget, peak) if option_modes is None else option_modes)
    if peak is not None and plan is None and solver not in (None, *catalog.supporting(catalog.PEAK)):
        raise RequestError("solver", f"solver {solver!r} has no peak-budget mode: peak_budget works with solver "
                                     f"{', '.join(map(repr, catalog.supporting(catalog.PEAK)))} or none (the default)")
    plan_path = None if plan is None else Path(plan)
    if plan_path is not None and not plan_path.exists():
        raise FileNotFoundError(f"plan file {str(plan_path)!r} not found: expected a JSON plan written by "
                                "'opt-remat solve -o FILE' (a relative path starts at the working directory)")
    return SolveRequest(solver, budget, peak, count_gradients, opts, profile, costs, rng_replay,
                        count_input_bytes, plan_path, read_plan_file(plan_path) if plan_path is not None else None,
                        offload)


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
