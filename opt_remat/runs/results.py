"""A run's results: one typed ``Record`` per (budget, solver) pair, and the files that hold them.

``results.json`` holds the run (its configuration as run, a fingerprint of the graph and device,
the problem's size, the min-cut hull) and its records; ``results.csv`` the records as rows. Both
are rewritten atomically after every pair, so an interrupted run keeps what it finished and a
rerun resumes: it keeps a record whose pair, budget bytes, solver and options are unchanged.

Format 2 leaves a record's empty fields out (format 1 wrote them as null); format 3 adds each
plan's simulated step (``curve``, written on one line), which reports read instead of simulating
again. All three are read.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from solvers.budget import format_bytes

from ..errors import OptRematError
from .config import BudgetSpec, Config, SolverSpec
from .curves import Curve
from .offload_view import FIELDS as OFFLOAD_FIELDS
from .util import jsonable, write_atomic

RESULTS_FORMAT = 3
READABLE_FORMATS = (1, 2, 3)
CSV_FIELDS = [
    "budget", "budget_bytes", "solver", "solver_name", "options", "status", "saved_bytes",
    "measured_saved_bytes", "peak_budget", "device_memory", "peak_bytes", "peak_gradient_bytes",
    "peak_by_kind", "recompute_cost", "objective", "bound", "gap", "solve_time_s",
    "n_saved", "n_recomputed", "verified", "bitwise", "max_rel_error", "loss", "loss_reference",
    "verify_s", "min_feasible_bytes", "plan_file", "message", "error", *OFFLOAD_FIELDS,
]


@dataclass
class Record:
    """One (budget, solver) pair: the plan's figures and checks, or why there is no plan."""
    budget: str  # the budget's label, as the config writes it
    solver: str  # the solver's label
    solver_name: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    budget_raw: Any = None  # as written: a fraction, bytes, or a peak budget's mapping
    budget_bytes: int | None = None  # saved bytes the budget allows
    peak_budget: int | None = None  # bytes of the step's peak the budget allows
    device_memory: int | None = None  # bytes of the device, for a device budget
    status: str = "error"  # optimal, feasible, infeasible, skipped, error (, a solver's own)
    error: str | None = None
    min_feasible_bytes: int | None = None  # for an infeasible saved-bytes budget
    min_peak_bytes: int | None = None  # for an infeasible peak budget
    solve_time_s: float | None = None
    # the plan
    saved_bytes: int | None = None
    recompute_cost: float | None = None
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    n_saved: int | None = None
    n_recomputed: int | None = None
    peak_bytes: int | None = None  # the whole step's simulated peak ...
    peak_gradient_bytes: int | None = None  # ... and how much of it is gradients
    curve: Curve | None = None  # the step's live memory, step by step (peak_bytes is its peak)
    message: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the solver's own details
    offload: dict[str, Any] = field(default_factory=dict)  # with offload: runs.offload_view.FIELDS
    warnings: list[str] = field(default_factory=list)
    plan_file: str | None = None  # relative to the output folder
    # its checks
    measured_saved_bytes: int | None = None  # what the lowered forward hands to the backward
    verified: bool | None = None  # gradients equal save-all's (None: not checked)
    bitwise: bool | None = None
    max_rel_error: float | None = None
    loss: float | None = None
    loss_reference: float | None = None
    verify_note: str = ""
    verify_s: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.budget, self.solver)

    @property
    def peak_by_kind(self) -> dict[str, int]:
        """The step's peak split by kind (``MemoryKind`` values; with a training set-up, the rank's
        whole memory), read off the curve."""
        return {} if self.curve is None else self.curve.peak_by_kind()

    @property
    def done(self) -> bool:
        """Whether a rerun keeps it (errors and skipped pairs are tried again)."""
        return self.status not in ("error", "skipped")

    @property
    def note(self) -> str:
        """Why there is no plan, or what its checks noticed."""
        if self.status in ("error", "skipped", "infeasible"):
            return str(self.error or self.status)
        return self.verify_note

    def to_json(self) -> dict[str, Any]:
        """The record as results.json holds it: empty fields left out."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "curve"}
        out = {k: jsonable(v) for k, v in out.items() if v not in (None, "", [], {})}
        if self.curve is not None:  # plain ints and text already: not walked by jsonable
            out["peak_by_kind"] = self.peak_by_kind or None
            out["curve"] = self.curve.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Record":
        """A record of results.json (format 1, 2 or 3); keys it does not know are dropped."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known and v is not None}
        values["budget"], values["solver"] = str(data["budget"]), str(data["solver"])
        if "curve" in values:
            values["curve"] = Curve.from_json(values["curve"])
        return cls(**values)


def options_key(options: dict[str, Any]) -> str:
    return json.dumps(jsonable(options), sort_keys=True)


def fingerprint(cfg: Config, graph_hash: str, nodes: int, profile: Any) -> dict[str, Any]:
    """What results depend on besides the pair: a rerun resumes only when these agree."""
    out = {"graph_hash": graph_hash, "graph_nodes": nodes,
           "compiler": None if cfg.is_graph else cfg.compiler,
           "device": {"name": profile.name, "peak_flops": profile.peak_flops, "bandwidth": profile.bandwidth}}
    if cfg.spec.training is not None:  # only then: runs without one resume as before
        out["training"] = jsonable(cfg.spec.training)
    return out


class ResultsError(OptRematError, ValueError):
    """A results.json that cannot be read: missing, damaged, or of a format this version does not know."""


@dataclass
class ResultsFile:
    """What a results.json holds, read back: the run (``header``: everything but the records) and
    its records. The one object every report of a finished run reads."""
    name: str | None
    format: int
    fingerprint: dict[str, Any]
    records: list[Record]
    header: dict[str, Any] = field(default_factory=dict)

    @property
    def hull(self) -> list[tuple[int, float]]:
        """The min-cut hull's (saved bytes, recompute cost) points."""
        return [(int(b), float(c)) for b, c in self.header.get("mincut_hull") or []]

    def title(self, fallback: str) -> str:
        return ((self.header.get("config") or {}).get("output") or {}).get("title") or self.name or fallback


def load_results(path: Path) -> ResultsFile:
    """The results of ``path`` (a results.json), parsed once; a ResultsError saying why not."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(
            f"{path.parent}: no results.json there (expected a folder written by opt-remat run)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read it ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ResultsError(f"{path}: not an opt-remat results file")
    fmt = data.get("format", 1)
    if fmt not in READABLE_FORMATS:
        raise ResultsError(f"{path}: results format {fmt}, which this version cannot read (it reads "
                           f"{', '.join(map(str, READABLE_FORMATS))}); rerun it with this version's opt-remat run")
    records = [Record.from_json(r) for r in data.pop("results")]
    return ResultsFile(data.get("name"), fmt, data.get("fingerprint") or {}, records, data)


def read_results(path: Path) -> ResultsFile | None:
    """The results of ``path`` (a results.json), or None when there are none to read."""
    try:
        return load_results(path)
    except ResultsError:
        return None


class ResultsStore:
    """The results files of one output folder: what a rerun keeps, and the writes after each pair."""

    def __init__(self, cfg: Config, fingerprint: dict[str, Any], run_info: dict[str, Any]) -> None:
        self.cfg = cfg
        self.dir = cfg.output_dir
        self.path = self.dir / "results.json"
        if self.dir.exists() and not self.dir.is_dir():
            raise cfg.error(("output", "dir"), f"{self.dir} exists and is not a folder")
        previous = read_results(self.path)
        if previous is not None and previous.fingerprint != fingerprint:
            raise cfg.error(("output", "dir"), f"{self.dir} holds results for another graph or device "
                                               f"(graph {previous.fingerprint.get('graph_hash')}, this one "
                                               f"{fingerprint['graph_hash']}); choose another output.dir or "
                                               "remove that folder")
        self.previous = {r.key: r for r in previous.records} if previous else {}
        self.header = {"format": RESULTS_FORMAT, "name": cfg.name, "config_file": str(cfg.path.resolve()),
                       "config": jsonable(cfg.resolved_dict()), "fingerprint": fingerprint, **run_info}
        self.order = {(b.label, s.label): (b.index, s.index) for b in cfg.budgets for s in cfg.solvers}

    def reusable(self, b: BudgetSpec, s: SolverSpec, budget_bytes: int | None) -> Record | None:
        """The previous run's record of this pair, if it still holds."""
        rec = self.previous.get((b.label, s.label))
        if (rec is not None and rec.done and rec.budget_bytes == budget_bytes and rec.solver_name == s.name
                and options_key(rec.options) == options_key(s.options)):
            return rec
        return None

    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "plans").mkdir(exist_ok=True)
        for stale in list(self.dir.glob(".*.tmp")) + list((self.dir / "plans").glob(".*.tmp")):
            stale.unlink(missing_ok=True)  # left by a run killed mid-write

    def contents(self, ordered: Sequence[Record]) -> ResultsFile:
        """What results.json holds once ``ordered`` (``write``'s answer) are written: the reports' run."""
        kept = [r for k, r in self.previous.items() if k not in self.order]
        return ResultsFile(self.cfg.name, RESULTS_FORMAT, self.header["fingerprint"], [*ordered, *kept], self.header)

    def write(self, records: Sequence[Record]) -> list[Record]:
        """Write the records (in the config's order; pairs no longer in the config stay at the end)."""
        ordered = sorted(records, key=lambda r: self.order.get(r.key, (1 << 30, 0)))
        kept = [r for k, r in self.previous.items() if k not in self.order]
        write_atomic(self.path, results_text(self.header, ordered + kept))
        if "csv" in self.cfg.formats:
            write_atomic(self.dir / "results.csv", csv_text(ordered + kept))
        return ordered


def results_text(header: dict[str, Any], records: Sequence[Record]) -> str:
    """results.json's text: indented, but each curve on one line (a line per number would make
    the file many times longer)."""
    rows, curves = [], []
    for rec in records:
        row = rec.to_json()
        if "curve" in row:
            curves.append(json.dumps(row["curve"], separators=(",", ":")))
            row["curve"] = f"@curve {len(curves) - 1}@"
        rows.append(row)
    text = json.dumps(dict(header, results=rows), indent=1)
    return re.sub(r'"@curve (\d+)@"', lambda m: curves[int(m.group(1))], text) + "\n"


def csv_text(records: Sequence[Record]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for rec in records:
        row = rec.to_json()
        row["options"] = json.dumps(jsonable(rec.options), sort_keys=True)
        row["peak_by_kind"] = json.dumps(rec.peak_by_kind) if rec.peak_by_kind else None
        row.update(rec.offload)
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS})
    return buf.getvalue()


def verified_text(rec: Record, *, notes: bool = True) -> str:
    if rec.verified is None:
        return "-"
    if rec.verified:
        text = "bitwise" if rec.bitwise else f"ok ({rec.max_rel_error or 0:.1e})"
    else:
        err = rec.max_rel_error
        text = "FAIL" + (f" ({err:.1e})" if isinstance(err, float) else "")
    return text + (f": {rec.verify_note}" if notes and rec.verify_note else "")


def budget_bytes_text(rec: Record, unit: str | None = None) -> str:
    saved = format_bytes(rec.budget_bytes, unit) if rec.budget_bytes is not None else ""
    if rec.device_memory is not None:
        return f"device {format_bytes(rec.device_memory, unit)}" + (f", saved {saved}" if saved else "")
    if rec.peak_budget is None:
        return saved or "-"
    return f"peak {format_bytes(rec.peak_budget, unit)}" + (f", saved {saved}" if saved else "")
