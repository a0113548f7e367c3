"""Peak budgets at the scale users plan offline: the LLaMA-7B shape (fake capture) of
``opt_remat.models.llama`` and of Hugging Face's LlamaForCausalLM and MistralForCausalLM
(Llama-2-7B config; Mistral with 8 KV heads), batch 8 x 2048, bf16, and small LLaMA-style graphs
of 8/32/64 layers.

    python benchmarks/bench_peak_scale.py [--models 7b hf-llama-7b hf-mistral-7b 32]
                                          [--fractions 0.3 0.45 0.6 0.8] [--time-limit 60]
                                          [--torch-fractions 1.0 0.5 0.2 0.0]

Rows per model, every plan simulated by the same simulator (``solvers.liveness``): the floor no
plan can go below, save-all, the default min-cut (``lam="auto"``, h100), checkpointing every
1/2/4/8 blocks (``uniform``), torch's partitioner at ``activation_memory_budget`` fractions, and
at peak budgets = fractions x the min-cut peak, tightest first: the fast default (no solver
named: ``choose_peak_plan(problem, None, ...)``, without remembered plans) and ``cpsat``
(``choose_peak_plan(problem, "cpsat", ...)``, each plan remembered for the looser budgets as in
a YAML sweep; below the floor the relaxation proves a budget infeasible). Columns: peak,
recompute cost (h100 roofline), proven lower bound and gap, the cheapest checkpoint-every-k plan
that fits the same budget, solve seconds; the default's cost, peak and seconds.

``--offload``: the problem is built as an offload request builds it (backward times too) and each
budget gets offload rows through the road (``road.solve_problem`` with ``offload=True``, h100's
50 GB/s host link, 1 MiB threshold, no host cap): for the default and ``cpsat``, without and with
offload, the recompute ms, offloaded GiB, exposed transfer ms and predicted added step time
(recompute + exposed transfer) by the model of ``solvers.offload``; for cpsat the offload
program (``solvers.mip_offload``) runs too and the note says whose plan was kept.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from opt_remat import plan_memory, road
from opt_remat.api import auto_lam
from opt_remat.build import classify, problem_from_joint
from opt_remat.capture import capture
from opt_remat.costs import get_profile
from opt_remat.models import llama
from opt_remat.report import table
from opt_remat.request import make_request
from opt_remat.solve import PeakBudgetError, choose_peak_plan
from opt_remat.torch_reference import torch_plan
from solvers.baselines import save_all, uniform_checkpoints
from solvers.liveness import peak_lower_bound, simulate_plan
from solvers.mincut import solve_mincut
from solvers.offload_plan import offload_cost
from solvers.options import PeakSearchOptions
from solvers.peak import PeakInfeasibleError, peak_search

GIB = 2**30


def _hf_factory(architecture: str):
    from opt_remat.hf import causal_lm
    config = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 11008,
              "num_attention_heads": 32, "num_key_value_heads": 8 if "Mistral" in architecture else 32,
              "vocab_size": 32000, "max_position_embeddings": 4096, "attn_implementation": "sdpa"}
    return lambda: causal_lm(architecture, config)


def _capture(name: str):
    if name.startswith("hf-"):  # Llama-2-7B config, batch 8 x 2048, bf16, nothing allocated
        arch = {"hf-llama-7b": "LlamaForCausalLM", "hf-mistral-7b": "MistralForCausalLM"}[name]
        return capture(_hf_factory(arch), (torch.zeros(8, 2048, dtype=torch.long),), meta=True,
                       dtype=torch.bfloat16)
    if name == "7b":  # LLaMA-7B shape, batch 8 x 2048, bf16, nothing allocated
        factory = lambda: llama(layers=32, d_model=4096, heads=32, hidden=11008, vocab=32000, seq=2048)  # noqa: E731
        return capture(factory, (torch.zeros(8, 2048, dtype=torch.long),), meta=True, dtype=torch.bfloat16)
    layers = int(name)
    return capture(lambda: llama(layers=layers), (torch.zeros(2, 32, dtype=torch.long),), meta=True)


def _default_columns(problem, budget: int, lam: float, unit: int, t_scale: float, t_name: str) -> dict:
    """The fast default's cost, peak and seconds at ``budget`` (no plans remembered)."""
    start = time.perf_counter()
    try:
        plan = choose_peak_plan(problem, None, budget, None, default_lam=lam)
    except PeakBudgetError:
        return {f"default {t_name}": "refused", "default peak": "-",
                "default s": f"{time.perf_counter() - start:.1f}"}
    return {f"default {t_name}": f"{plan.recompute_cost * t_scale:.2f}",
            "default peak": f"{plan.extra['peak'] / unit:.2f}", "default s": f"{time.perf_counter() - start:.1f}",
            "default by": plan.extra["found_by"]}


def _offload_rows(problem, budgets: list[tuple[float, int]], time_limit: float, row, t_scale: float,
                  t_name: str, solvers: list[str | None]) -> None:
    """Per budget, each solver (None: the default) without and with offload, through the road."""
    for fraction, budget in budgets:
        for solver in solvers:
            opts = {"time_limit_s": time_limit} if solver else {}
            for offload in (False, True):
                request = make_request(solver, peak_budget=budget, options=opts, offload=offload)
                name = f"{solver or 'default'}{' + offload' if offload else ''} {fraction:g}x min-cut"
                start = time.perf_counter()
                try:
                    plan = road.solve_problem(problem, request, None)
                except PeakBudgetError:
                    row(name, None, None, **{"solve s": f"{time.perf_counter() - start:.1f}", "note": "infeasible"})
                    continue
                cost = offload_cost(problem, plan.saved, plan.offloaded, road.offload_link(request))
                row(name, cost.peak, plan.recompute_cost, **{
                    "offloaded GiB": f"{cost.host_bytes / GIB:.2f}",
                    f"exposed {t_name}": f"{cost.exposed_s * t_scale:.2f}",
                    f"added {t_name}": f"{cost.added_s * t_scale:.2f}", "solve s": f"{time.perf_counter() - start:.1f}",
                    "note": (f"{len(plan.offloaded)} offloaded" + _program_note(plan, t_scale, t_name)
                             if offload else "")})


def _program_note(plan, t_scale: float, t_name: str) -> str:
    """Whose plan it is where the offload program ran (cpsat): the program's or the chooser's."""
    program = plan.extra.get("offload_program")
    if program is None:
        return ""
    if "greedy" in plan.extra:
        greedy = plan.extra["greedy"]
        return ("; the program's plan" + ("" if greedy is None else
                f" (the chooser's added {greedy['added_s'] * t_scale:.2f} {t_name})"))
    if program.get("fitted"):
        return f"; the chooser's plan (the program's added {program['added_s'] * t_scale:.2f} {t_name})"
    return "; the chooser's plan (the program's plans did not fit)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["7b", "hf-llama-7b", "hf-mistral-7b", "8", "32", "64"])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.3, 0.45, 0.6, 0.8])
    ap.add_argument("--torch-fractions", type=float, nargs="+", default=[1.0, 0.5, 0.2, 0.0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--no-smallest", action="store_true", help="skip the smallest-peak search (a time limit each)")
    ap.add_argument("--offload", action="store_true", help="offload rows only: default and cpsat, without and with")
    ap.add_argument("--offload-solvers", nargs="+", default=["default", "cpsat"], help="the offload rows' solvers")
    args = ap.parse_args()
    # the sweep's remembered plans stay out of the user's cache
    os.environ["OPT_REMAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-peak-scale-")
    rows = []
    for name in args.models:
        big = name == "7b" or name.startswith("hf-")
        unit, unit_name = (GIB, "GiB") if big else (2**20, "MiB")
        t_scale, t_name = (1e3, "ms") if big else (1e6, "us")
        label = name if name.startswith("hf-") else "llama-7b" if name == "7b" else f"llama-{name}L"
        joint = _capture(name)
        prepared, problem = problem_from_joint(joint, device="h100")
        if args.offload:  # built as an offload request builds it: backward times too
            graph = joint.copy()
            problem = road.prepare(graph.module, graph.num_fwd_outputs, graph.static_lifetime_input_indices,
                                   make_request(offload=True), input_roles=graph.input_roles).problem

        def row(plan_name: str, peak: int | None, cost: float | None, label: str = label, unit: int = unit,
                unit_name: str = unit_name, t_scale: float = t_scale, t_name: str = t_name, **more) -> None:
            r = {"model": label, "plan": plan_name,
                 f"peak {unit_name}": "-" if peak is None else f"{peak / unit:.2f}",
                 f"recompute {t_name}": "-" if cost is None else f"{cost * t_scale:.2f}"}
            r.update(more)
            rows.append(r)
            print(table([r], list(r)), flush=True)

        row("floor", peak_lower_bound(problem), None)
        sa = save_all(problem)
        row("save-all", simulate_plan(problem, sa.saved).peak, sa.recompute_cost)
        lam = auto_lam(get_profile("h100"))
        mc = solve_mincut(problem, lam)
        mc_peak = simulate_plan(problem, mc.saved).peak
        row("min-cut (lam auto)", mc_peak, mc.recompute_cost)
        if args.offload:
            budgets = [(f, int(f * mc_peak)) for f in sorted(args.fractions)]
            _offload_rows(problem, budgets, args.time_limit, row, t_scale, t_name,
                          [None if s == "default" else s for s in args.offload_solvers])
            continue
        checkpoints = []
        for plan in uniform_checkpoints(problem, (1, 2, 4, 8)):
            peak = simulate_plan(problem, plan.saved).peak
            checkpoints.append((peak, plan.recompute_cost))
            row(f"checkpoint every {plan.extra['every']}", peak, plan.recompute_cost)
        for fraction in args.torch_fractions:
            copy = prepared.copy()  # torch's partitioner annotates the graph it is given
            info = classify(copy.module, copy.num_fwd_outputs, copy.static_lifetime_input_indices)
            ref = torch_plan(copy.module, info, problem, fraction=fraction)
            valid = "valid" if not ref.extra["recomputes_banned"] else "recomputes random ops"
            row(f"torch {fraction:g}", simulate_plan(problem, ref.saved).peak, ref.recompute_cost,
                note=valid)
        # cpsat's plans remembered across the sweep, as a YAML run's are (opt_remat.plan_memory)
        memory = plan_memory.GraphKey(f"bench-{label}-{time.time()}", {n.name: n.name for n in problem.nodes})
        for fraction in sorted(args.fractions):
            budget = int(fraction * mc_peak)
            fitting = [c for p, c in checkpoints if p <= budget]
            cheapest = f"{min(fitting) * t_scale:.2f}" if fitting else "none fits"
            more = {"budget": f"{budget / unit:.2f}", f"checkpoint {t_name}": cheapest,
                    **_default_columns(problem, budget, lam, unit, t_scale, t_name)}
            start = time.perf_counter()
            try:
                plan = choose_peak_plan(problem, "cpsat", budget, None, {"time_limit_s": args.time_limit},
                                        memory=memory)
            except PeakBudgetError:
                row(f"cpsat {fraction:g}x min-cut", None, None, **more,
                    **{f"bound {t_name}": "-", "gap": "-", "solve s": f"{time.perf_counter() - start:.1f}",
                       "note": "infeasible"})
                continue
            row(f"cpsat {fraction:g}x min-cut", plan.extra["peak"], plan.recompute_cost, **more,
                **{f"bound {t_name}": f"{plan.bound * t_scale:.2f}", "gap": f"{plan.extra['gap']:.1%}",
                   "solve s": f"{time.perf_counter() - start:.1f}",
                   "note": f"{plan.status.value}, by {plan.extra['found_by']}"})
        if args.no_smallest:
            continue
        start = time.perf_counter()
        try:
            peak_search(problem, 1, options=PeakSearchOptions(time_limit_s=args.time_limit))
        except PeakInfeasibleError as exc:
            row("opt-remat smallest peak", exc.min_peak, None,
                **{"solve s": f"{time.perf_counter() - start:.1f}"})
    print("\nsummary:")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    print(table([{k: r.get(k, "-") for k in columns} for r in rows], columns))


if __name__ == "__main__":
    main()
