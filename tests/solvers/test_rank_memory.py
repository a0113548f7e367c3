"""The rank's memory over the step (``solvers.rank_memory``): the training set-up's parsing, the
per-kind accounting worked out by hand on a two-block problem, the whole-rank simulation against
the graph's own where they must agree, the device budget's refusal, and (slow) torch's
``FSDPMemTracker`` on a small HF LLaMA under FSDP2 over 8 fake ranks."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from solvers import Node, Problem, Role
from solvers.baselines import inputs_only, save_all
from solvers.device_budget import device_budget, rank_states, resident_bound
from solvers.fast_peak import fast_peak_plan
from solvers.liveness import simulate_plan, simulator, without_gradients
from solvers.memory_kinds import MemoryKind as K
from solvers.problem import Parameter
from support.random_problems import random_problem
from solvers.rank_memory import fsdp_units, rank_curve, rank_peak, with_rank_memory
from solvers.errors import DeviceBudgetError, TrainingSetupError
from solvers.training import TrainingSetup, training_setup

F, B, IN = Role.FORWARD, Role.BACKWARD, Role.INPUT


# ---- the set-up -------------------------------------------------------------------------------

def test_setup_from_a_plain_dict():
    s = training_setup({"param_dtype": "BF16", "sharded_dtype": "fp32", "optimizer": "adamw",
                        "sharding": "fsdp", "world_size": 8, "reshard": False})
    assert s == TrainingSetup(param_dtype="bf16", master_dtype="fp32", optimizer="adamw", sharding="fsdp",
                              ranks=8, reshard_after_forward=False)
    assert s.shards == 8 and training_setup(None) is None and training_setup(s) is s


@pytest.mark.parametrize("raw, field", [
    ({"optimizer": "lion"}, "training.optimizer"),
    ({"param_dtype": "int3"}, "training.param_dtype"),
    ({"sharding": "zero2"}, "training.sharding"),
    ({"ranks": 8}, "training.ranks"),  # eight ranks of sharding 'none'
    ({"sharding": "fsdp", "ranks": 0}, "training.ranks"),
    ({"sharding": "fsdp", "ranks": 2, "prefetch": "yes"}, "training.prefetch"),
    ({"optimiser": "sgd"}, "training.optimiser"),
])
def test_setup_errors_name_the_field(raw, field):
    with pytest.raises(TrainingSetupError) as err:
        training_setup(raw)
    assert str(err.value).startswith(field + ":") and "\n" not in str(err.value)


# ---- a two-block problem, by hand -------------------------------------------------------------

def _two_blocks() -> Problem:
    """embed -> layers.0 -> layers.1 -> loss, and its backward; each block has a weight (64
    elements, first dimension 8), the embedding one of 10 elements (first dimension 5)."""
    nodes = [
        Node("x", IN), Node("we", IN, bytes=40), Node("w0", IN, bytes=256), Node("w1", IN, bytes=256),
        Node("e", F, ("x", "we"), bytes=100, module="embed"),
        Node("h0", F, ("e", "w0"), bytes=100, module="layers.0"),
        Node("h1", F, ("h0", "w1"), bytes=100, module="layers.1"),
        Node("loss", F, ("h1",), bytes=4, module=""),
        Node("t", B, (), bytes=4),
        Node("gh1", B, ("t", "h1"), bytes=100, module=""),
        Node("gw1", B, ("gh1", "h0"), bytes=128, module="layers.1"),
        Node("gh0", B, ("gh1", "w1"), bytes=100, module="layers.1"),
        Node("gw0", B, ("gh0", "e"), bytes=128, module="layers.0"),
        Node("ge", B, ("gh0", "w0"), bytes=100, module="layers.0"),
        Node("gwe", B, ("ge", "x"), bytes=20, module="embed"),
    ]
    classes = {"embed": "pkg.Embedding", "layers": "torch.nn.modules.container.ModuleList",
               "layers.0": "pkg.Block", "layers.1": "pkg.Block"}
    params = (Parameter("we", "embed.weight", 10, 5, "gwe"), Parameter("w0", "layers.0.weight", 64, 8, "gw0"),
              Parameter("w1", "layers.1.weight", 64, 8, "gw1"))
    return Problem(tuple(nodes), forward_outputs=frozenset({"loss"}),
                   backward_outputs=frozenset({"gwe", "gw0", "gw1"}), module_classes=classes, parameters=params)


def _heavy() -> Problem:
    """The two-block problem with activations that outweigh the rank's states: plans differ."""
    p = _two_blocks()
    big = {"e", "h0", "h1", "gh1", "gh0", "ge"}
    return p.with_nodes([replace(n, bytes=n.bytes * 30) if n.name in big else n for n in p.nodes])


FSDP2 = TrainingSetup(param_dtype="bf16", master_dtype="fp32", reduce_dtype="fp32", optimizer="adamw",
                      sharding="fsdp", ranks=2, reshard_after_forward=True, prefetch=False)


def _at(curve, value: str, phase: str | None = None) -> dict[K, int]:
    i = [v for ph, v in curve.steps if phase in (None, ph)].index(value)
    i += 0 if phase in (None, "forward") else sum(ph == "forward" for ph, _ in curve.steps)
    return {k: v[i] for k, v in curve.by_kind.items() if v[i]}


def test_units_are_the_blocks_and_a_root():
    units = fsdp_units(_two_blocks())
    assert [u.path for u in units] == ["layers.0", "layers.1", ""]
    assert [u.numel for u in units] == [64, 64, 10]
    assert units[2].padded(4) == 16  # a first dimension of 5 padded to 8: 8 x 2 elements


def test_per_kind_accounting_by_hand():
    p = _two_blocks()
    saved = {"e", "h0", "h1"}
    curve = rank_curve(p, saved, FSDP2)
    # shards in fp32: the root's 5 x 2 padded to 6 x 2 -> 6 elements, each block's 64 -> 32;
    # AdamW: two states of each
    states = {K.SHARDED_PARAMS: (6 + 32 + 32) * 4, K.OPTIMIZER: 2 * (6 + 32 + 32) * 4}
    # the forward in block 0: the root (bf16, 20 B) and block 0 (128 B) gathered, block 0's
    # all-gather output (128 B); e and h0 live
    assert _at(curve, "h0") == {**states, K.GATHERED_PARAMS: 20 + 128, K.ALL_GATHER: 128,
                                K.ACTIVATIONS: 200}
    # the backward in block 0 (gw0): block 1 is done: its gradient freed at its reduce-scatter,
    # its reduce-scatter input (64 x fp32) held until block 0's, its shard (32 x fp32) kept
    assert _at(curve, "gw0") == {**states, K.GATHERED_PARAMS: 20 + 128, K.ALL_GATHER: 128,
                                 K.SHARDED_GRADS: 128, K.REDUCE_SCATTER: 256, K.GRADIENTS: 128,
                                 K.ACTIVATIONS: 100, K.TEMPORARIES: 100}
    # the root's backward after the blocks: both shards, block 0's reduce-scatter buffer
    assert _at(curve, "gwe") == {**states, K.GATHERED_PARAMS: 20, K.SHARDED_GRADS: 256,
                                 K.REDUCE_SCATTER: 256, K.GRADIENTS: 20, K.TEMPORARIES: 100}
    totals = [sum(v[i] for v in curve.by_kind.values()) for i in range(len(curve.steps))]
    assert curve.peak.total == max(totals) == sum(curve.peak.by_kind.values())


def test_without_resharding_blocks_stay_gathered_and_prefetch_holds_the_next():
    p = _two_blocks()
    saved = {"e", "h0", "h1"}
    kept = rank_curve(p, saved, TrainingSetup(**{**FSDP2.__dict__, "reshard_after_forward": False}))
    assert _at(kept, "h1")[K.GATHERED_PARAMS] == 20 + 128 + 128
    assert _at(kept, "gw1")[K.GATHERED_PARAMS] == 20 + 128 + 128
    assert _at(kept, "gw0")[K.GATHERED_PARAMS] == 20 + 128  # block 1 resharded after its backward
    assert K.ALL_GATHER not in _at(kept, "gw0")  # nothing gathered again in the backward
    ahead = rank_curve(p, saved, TrainingSetup(**{**FSDP2.__dict__, "prefetch": True}))
    assert _at(ahead, "h0")[K.ALL_GATHER] == 128  # block 1's output while block 0 runs
    assert _at(ahead, "gwe").get(K.ALL_GATHER, 0) == 0


def test_recomputing_the_forward_gathers_one_block_at_a_time():
    """Saving only the embedding recomputes both blocks before the head's backward: block 0 is
    resharded once block 1 runs, and gathered again for its own backward."""
    curve = rank_curve(_two_blocks(), {"e"}, FSDP2)
    assert [v for ph, v in curve.steps if ph == "backward"][:4] == ["t", "h0", "h1", "gh1"]
    assert _at(curve, "h0", "backward")[K.GATHERED_PARAMS] == 20 + 128
    assert _at(curve, "h1", "backward")[K.GATHERED_PARAMS] == 20 + 128
    assert _at(curve, "gw1", "backward")[K.GATHERED_PARAMS] == 20 + 128
    assert _at(curve, "gh1", "backward")[K.GATHERED_PARAMS] == 20  # the head: the root alone
    assert _at(curve, "gw0", "backward")[K.GATHERED_PARAMS] == 20 + 128


def test_one_device_keeps_gradients_to_the_end():
    p = _two_blocks()
    one = TrainingSetup(param_dtype="fp32", optimizer="sgd-momentum")
    curve = rank_curve(p, {"e", "h0", "h1"}, one)
    assert _at(curve, "gwe") == {K.SHARDED_PARAMS: 138 * 4, K.OPTIMIZER: 138 * 4,
                                 K.GRADIENTS: 128 + 128 + 20, K.TEMPORARIES: 100}


# ---- against the graph's own simulation -------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_without_a_setup_the_peak_is_the_graphs(seed):
    p = random_problem(seed)
    for plan in (save_all(p), inputs_only(p)):
        assert rank_peak(p, plan.saved, None).total == simulate_plan(p, plan.saved).peak


@pytest.mark.parametrize("seed", range(8))
def test_setup_adds_at_least_the_states(seed):
    """Without parameters a set-up adds nothing; the peak never drops below the graph's."""
    p = random_problem(seed)
    saved = save_all(p).saved
    peak = rank_peak(p, saved, TrainingSetup(sharding="fsdp", ranks=4))
    assert peak.total == simulate_plan(p, saved).peak


def test_the_rank_simulator_is_what_the_searches_see():
    p = _two_blocks()
    on_rank = with_rank_memory(p, FSDP2)
    rng = random.Random(0)
    for _ in range(5):
        saved = {v for v in ("e", "h0", "h1") if rng.random() < 0.7}
        expect = rank_peak(p, saved, FSDP2).total
        assert simulator(on_rank).peak(saved)[0] == expect == simulate_plan(on_rank, saved).peak


def _fitting_device(p: Problem) -> int:
    """A device size that some plans fit and others do not."""
    peaks = sorted({rank_peak(p, s, FSDP2).total for s in ({"e", "h0", "h1"}, {"e"}, {"e", "h1"}, {"e", "h0"})})
    assert len(peaks) > 1
    return peaks[0]


def test_fast_default_fits_the_device():
    p = _heavy()
    device = _fitting_device(p)
    plan = fast_peak_plan(with_rank_memory(p, FSDP2), device)
    assert rank_peak(p, plan.saved, FSDP2).total <= device


def test_peak_search_fits_the_device():
    """The peak search on the rank's problem: its relaxation counts the graph alone (a weaker,
    still valid bound); every plan it returns is judged by the rank's simulation."""
    from solvers.options import PeakSearchOptions
    from solvers.peak import peak_search
    p = _heavy()
    device = _fitting_device(p)
    plan = peak_search(with_rank_memory(p, FSDP2), device, options=PeakSearchOptions(time_limit_s=5))
    assert rank_peak(p, plan.saved, FSDP2).total <= device


SETUPS = (FSDP2, replace(FSDP2, reshard_after_forward=False, prefetch=True), TrainingSetup(optimizer="adamw"),
          TrainingSetup(param_dtype="bf16", sharding="ddp", ranks=4, optimizer="sgd"))


@pytest.mark.parametrize("setup", SETUPS)
def test_what_bounds_count_besides_the_graph_is_held_everywhere(setup):
    """The rank's floor (``RankModel.floor``) is held at every position of every plan's step, and
    the floor of the rank's problem (``peak_lower_bound``: the graph's share, gradients left out
    where FSDP frees them, plus that floor) is below every plan's rank peak, checked against
    the rank's own simulation of each saved set."""
    from itertools import combinations

    from solvers.liveness import peak_lower_bound
    p = _heavy()
    on_rank = with_rank_memory(p, setup)
    floor = simulator(on_rank).floor_besides_graph()
    states = rank_states(p, setup)
    assert floor >= states[K.SHARDED_PARAMS] + states[K.OPTIMIZER] > 0
    graph = {K.ACTIVATIONS, K.TEMPORARIES, K.GRADIENTS}
    lowest = peak_lower_bound(on_rank)
    for k in range(4):
        for saved in combinations(("e", "h0", "h1"), k):
            curve = rank_curve(p, saved, setup)
            besides = [sum(v[i] for kind, v in curve.by_kind.items() if kind not in graph)
                       for i in range(len(curve.steps))]
            assert min(besides) >= floor
            assert lowest <= curve.peak.total


def test_the_peak_search_bound_under_a_device_budget_is_proven_and_counts_the_states():
    """Under FSDP the peak search's bound (its relaxation: the graph's share of the device)
    stays below the cheapest plan that fits, found by trying every saved set."""
    from itertools import combinations

    from solvers.options import PeakSearchOptions
    from solvers.peak import peak_search
    from solvers.errors import PlanError
    from solvers.problem import Status, plan_from_saved
    p = _heavy()
    device = _fitting_device(p)
    plan = peak_search(with_rank_memory(p, FSDP2), device, options=PeakSearchOptions(time_limit_s=5))
    inputs = {n.name for n in p.nodes if n.role is IN}
    names = [c.name for c in p.candidates if c.role is not IN]
    costs = []
    for k in range(len(names) + 1):
        for chosen in combinations(names, k):
            try:
                every = plan_from_saved(p, inputs | set(chosen), solver="all", status=Status.HEURISTIC)
            except PlanError:
                continue
            if rank_peak(p, every.saved, FSDP2).total <= device:
                costs.append(every.recompute_cost)
    assert plan.bound is not None and plan.bound <= min(costs) + 1e-12
    assert plan.recompute_cost == pytest.approx(min(costs))


# ---- the device budget ------------------------------------------------------------------------

def test_device_budget_is_conservative_and_refuses_with_what_fits():
    p = _two_blocks()
    states = rank_states(p, FSDP2)
    assert states == {K.SHARDED_PARAMS: 280, K.OPTIMIZER: 560, K.SHARDED_GRADS: 280}
    bound = resident_bound(p, FSDP2)
    # states 1120 B; root 20 and two blocks 256 gathered, all-gather 128, reduce-scatter 256,
    # the gradients of the root and two blocks (bf16, as gathered) 276
    assert sum(bound.values()) == 1120 + 276 + 128 + 256 + 276
    # tight: the graph's peak without its gradients (FSDP frees them) is 404 B for these plans;
    # fitting it fits the device
    device = sum(bound.values()) + 404
    got = device_budget(p, FSDP2, device)
    assert got.peak_budget == 404 and not got.count_gradients
    for saved in ({"e", "h0", "h1"}, {"e"}, {"e", "h1"}):
        if simulate_plan(without_gradients(p), saved).peak <= got.peak_budget:
            assert rank_peak(p, saved, FSDP2).total <= device
    # no plan's graph peaks below 204 B without gradients; the states over 2 ranks are 1120 B,
    # over 4 ranks (4 + 16 + 16 elements, 16 B each with AdamW's two fp32 states and the gradient
    # shard) 576 B, over 8 ranks 288 B; a bf16 state over 2 ranks 840 B
    for device, fix in ((700, "FSDP over 8 ranks"), (1000, "FSDP over 4 ranks"),
                        (1300, "FSDP over 4 ranks or the optimizer state in bf16")):
        with pytest.raises(DeviceBudgetError) as err:
            device_budget(p, FSDP2, device)
        text = str(err.value)
        assert text.endswith("would fit with " + fix) and "optimizer state 560 B" in text, text
        assert "\n" not in text
    assert device_budget(p, FSDP2, 1324).graph_floor == 204


# ---- torch's FSDPMemTracker -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.hf
@pytest.mark.parametrize("reshard", [True, False])
def test_against_fsdp_mem_tracker(reshard):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_rank_memory as bench
    predicted, tracked = bench.compare(_llama_problem(bench), reshard)
    for kind in (K.SHARDED_PARAMS, K.GATHERED_PARAMS, K.SHARDED_GRADS, K.OPTIMIZER):
        assert predicted[kind] == pytest.approx(tracked[kind], rel=0.02), kind
    assert predicted["total"] == pytest.approx(tracked["total"], rel=0.05)


_LLAMA: list = []


def _llama_problem(bench):
    if not _LLAMA:
        _LLAMA.append(bench.llama_problem())
    return _LLAMA[0]


# ---- the parameters recorded by build ---------------------------------------------------------

def test_build_records_the_parameters_and_their_gradients():
    torch = pytest.importorskip("torch")  # a capture: run where torch is installed

    from opt_remat.build import problem_from_joint
    from opt_remat.capture import capture
    from opt_remat.models import Llama

    def factory():
        return Llama(layers=2, d_model=32, heads=2, seq=16)

    joint = capture(factory, (torch.zeros(2, 16, dtype=torch.long),), meta=True)
    problem = problem_from_joint(joint)[1]
    expect = {name: p for name, p in factory().named_parameters()}
    assert {p.path: p.numel for p in problem.parameters} == {n: p.numel() for n, p in expect.items()}
    assert all(p.dim0 == expect[p.path].shape[0] for p in problem.parameters)
    assert {p.grad for p in problem.parameters} <= problem.backward_outputs
    for p in problem.parameters:  # each gradient has its parameter's size (fp32: 4 bytes each)
        assert problem.by_name[p.grad].bytes == 4 * p.numel
    units = fsdp_units(problem)
    assert [u.path for u in units] == ["blocks.0", "blocks.1", ""]
    assert [u.numel for u in units] == [sum(p.numel() for n, p in expect.items() if n.startswith(pre))
                                        for pre in ("blocks.0.", "blocks.1.")] + [
        sum(p.numel() for n, p in expect.items() if not n.startswith("blocks."))]
