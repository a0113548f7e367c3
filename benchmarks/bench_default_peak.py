"""The drop-in default under a peak budget (no solver named) against torch's partitioner and the
exact search (``cpsat``), same run.

    python benchmarks/bench_default_peak.py [--models qwen3 gemma3 mixtral qwen3-moe t5 opt]
                                            [--time-limit 30] [--big hf-llama-7b hf-mistral-7b 7b rope-7b]
                                            [--big-time-limit 60] [--cache DIR]

Small rows: HF models of ``tests/hf_small.py`` (2 layers, hidden 64, random init, captured by a
real step). Budgets: the step peaks of torch's partitioner at ``activation_memory_budget`` 0.5
and 0.2 (its plan simulated by ``solvers.liveness``, which equals the measured peak), where the
default's cost is set beside torch's; and 0.7 / 0.85 x the peak of the min-cut plan (lam auto,
h100 roofline), where it is set beside ``cpsat``'s (``--time-limit``). Big rows (``--big``): the
LLaMA-7B shape (batch 8 x 2048, bf16, fake capture; ``bench_peak_scale``'s harness) of HF
Llama/Mistral, ``opt_remat.models.llama`` and a LLaMA with its RoPE tables computed inside each
block (``rope-7b``, below) at 0.3/0.45/0.6/0.8 x the min-cut peak. Each solve is fresh: no
plans remembered; the default gets the min-cut plan at the h100's lam as a candidate, as
``opt_remat.partitioner`` gives it. ``--cache DIR``: the big problems are captured once and
pickled there (``DIR/NAME.pkl``), so later runs are only the solves.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, cast

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.hf_small, benchmarks.*

from opt_remat.api import auto_lam
from opt_remat.build import classify, problem_from_joint
from opt_remat.capture import capture
from opt_remat.costs import get_profile
from opt_remat.report import table
from opt_remat.solve import PeakBudgetError, choose_peak_plan
from opt_remat.torch_reference import torch_plan
from solvers.liveness import simulate_plan
from solvers.mincut import solve_mincut
from solvers.problem import Problem

SMALL = ("qwen3", "gemma3", "mixtral", "qwen3-moe", "t5", "opt")
BIG = ("hf-llama-7b", "hf-mistral-7b", "7b", "rope-7b")


class RopeBlockLlama(torch.nn.Module):
    """A LLaMA written unlike the project's: each decoder block computes its own RoPE tables
    (cos/sin from the positions) and attends with SDPA; RMSNorm and SwiGLU as LLaMA's."""

    def __init__(self, layers: int, d_model: int, heads: int, hidden: int, vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.blocks = torch.nn.ModuleList(_RopeBlock(d_model, heads, hidden) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(d_model, eps=1e-5)
        self.head = torch.nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), idx[:, 1:].flatten())


class _RopeBlock(torch.nn.Module):
    def __init__(self, d_model: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.attn_norm = torch.nn.RMSNorm(d_model, eps=1e-5)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = torch.nn.Linear(d_model, d_model, bias=False)
        self.mlp_norm = torch.nn.RMSNorm(d_model, eps=1e-5)
        self.gate_up = torch.nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d_model, bias=False)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[-2]
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device=x.device).float() / self.head_dim))
        angles = torch.outer(torch.arange(seq, device=x.device).float(), inv)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        a, b = x[..., ::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(bsz, seq, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = torch.nn.functional.scaled_dot_product_attention(self._rope(q), self._rope(k), v, is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(bsz, seq, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


def _capture_small(name: str):
    from tests.hf_small import factory, inputs
    return capture(factory(name), inputs())


def _capture_big(name: str):
    if name == "rope-7b":
        def factory() -> RopeBlockLlama:
            return RopeBlockLlama(layers=32, d_model=4096, heads=32, hidden=11008, vocab=32000)

        return capture(factory, (torch.zeros(8, 2048, dtype=torch.long),), meta=True, dtype=torch.bfloat16)
    from benchmarks.bench_peak_scale import _capture
    return _capture(name)


def big_problem(name: str, cache: str | None = None) -> Problem:
    """The big model's problem (h100 costs), from ``cache/NAME.pkl`` when there, else captured
    (and pickled there when ``cache`` is given)."""
    path = Path(cache) / f"{name}.pkl" if cache else None
    if path is not None and path.exists():
        with path.open("rb") as f:
            return cast(Problem, pickle.load(f))
    _, problem = problem_from_joint(_capture_big(name), device="h100")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(problem, f)
    return problem


def _solve(problem: Problem, solver: str | None, budget: int, time_limit: float) -> dict[str, Any]:
    """Cost, peak and seconds of one fresh peak solve (None cost: refused)."""
    options = {"time_limit_s": time_limit} if solver else None
    # the drop-in default gets the min-cut plan at the device's lam as a candidate, as
    # opt_remat.partitioner gives it
    lam = None if solver else auto_lam(get_profile("h100"))
    start = time.perf_counter()
    try:
        plan = choose_peak_plan(problem, solver, budget, None, options, default_lam=lam)
    except PeakBudgetError:
        return {"cost": None, "peak": None, "s": time.perf_counter() - start, "gap": None, "by": "refused"}
    return {"cost": plan.recompute_cost, "peak": plan.extra["peak"], "s": time.perf_counter() - start,
            "gap": plan.extra.get("gap"), "by": plan.extra.get("found_by", "")}


def _ratio(a: float | None, b: float | None) -> str:
    if a is None:
        return "refused"
    if b is None:
        return "ref refused"
    return "1.00" if a == b else f"{a / b:.2f}" if b > 0 else "inf"


def _row(label: str, budget_name: str, budget: int, ref_name: str, ref: dict[str, Any], ours: dict[str, Any],
         scale: float, unit: str, unit_bytes: int) -> dict[str, Any]:
    def cost(r: dict[str, Any]) -> str:
        return "-" if r["cost"] is None else f"{r['cost'] * scale:.3f}"
    return {"model": label, "budget": budget_name, f"peak budget {unit}": f"{budget / unit_bytes:.3f}",
            "vs": ref_name, f"ref {'us' if scale == 1e6 else 'ms'}": cost(ref),
            "ref s": "-" if ref.get("s") is None else f"{ref['s']:.1f}",
            "ref gap": "-" if ref.get("gap") is None else f"{ref['gap']:.2%}",
            f"default {'us' if scale == 1e6 else 'ms'}": cost(ours), "default / ref": _ratio(ours["cost"], ref["cost"]),
            "default s": f"{ours['s']:.2f}", "default by": ours["by"]}


def small_rows(name: str, time_limit: float) -> list[dict[str, Any]]:
    prepared, problem = problem_from_joint(_capture_small(name))
    rows = []
    for fraction in (0.5, 0.2):
        copy = prepared.copy()  # torch's partitioner annotates the graph it is given
        info = classify(copy.module, copy.num_fwd_outputs, copy.static_lifetime_input_indices)
        ref = torch_plan(copy.module, info, problem, fraction=fraction)
        peak = simulate_plan(problem, ref.saved).peak
        torch_row = {"cost": ref.recompute_cost, "s": None, "gap": None}
        rows.append(_row(name, f"torch {fraction:g}", peak, "torch", torch_row,
                         _solve(problem, None, peak, time_limit), 1e6, "MiB", 2**20))
        print(table(rows[-1:], list(rows[-1])), flush=True)
    rows += mincut_rows(name, problem, (0.7, 0.85), time_limit, 1e6, "MiB", 2**20)
    return rows


def mincut_rows(label: str, problem: Problem, fractions: tuple[float, ...], time_limit: float, scale: float,
                unit: str, unit_bytes: int) -> list[dict[str, Any]]:
    mc_peak = simulate_plan(problem, solve_mincut(problem, auto_lam(get_profile("h100"))).saved).peak
    rows = []
    for fraction in fractions:
        budget = int(fraction * mc_peak)
        ours = _solve(problem, None, budget, time_limit)
        exact = _solve(problem, "cpsat", budget, time_limit)
        rows.append(_row(label, f"{fraction:g} x min-cut", budget, "cpsat", exact, ours, scale, unit, unit_bytes))
        print(table(rows[-1:], list(rows[-1])), flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    ratios = [float(r["default / ref"]) for r in rows if r["default / ref"] not in ("refused", "ref refused", "inf")]
    worst = max(ratios) if ratios else math.nan
    return (f"{len(rows)} rows; refused {sum(r['default / ref'] == 'refused' for r in rows)}; worst default/ref "
            f"{worst:.2f}; slowest default {max(float(r['default s']) for r in rows):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(SMALL), choices=SMALL)
    ap.add_argument("--time-limit", type=float, default=30.0, help="cpsat's limit on the small models, s")
    ap.add_argument("--big", nargs="*", default=[], choices=BIG)
    ap.add_argument("--big-time-limit", type=float, default=60.0)
    ap.add_argument("--cache", default=None, help="folder the big problems are pickled in once (then only solved)")
    args = ap.parse_args()
    os.environ["OPT_REMAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-default-peak-")  # nothing remembered
    warnings.filterwarnings("ignore")
    rows: list[dict[str, Any]] = []
    for name in args.models:
        torch.manual_seed(0)
        rows += small_rows(name, args.time_limit)
    if rows:
        print("\nsmall models:\n" + table(rows, list(rows[0])) + "\n" + summary(rows), flush=True)
    big: list[dict[str, Any]] = []
    for name in args.big:
        problem = big_problem(name, args.cache)
        big += mincut_rows(name, problem, (0.3, 0.45, 0.6, 0.8), args.big_time_limit, 1e3, "GiB", 2**30)
    if big:
        print("\n7B shape:\n" + table(big, list(big[0])) + "\n" + summary(big), flush=True)


if __name__ == "__main__":
    main()
