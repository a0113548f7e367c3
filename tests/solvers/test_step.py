"""The step across graphs (``solvers.step``): its peak against the step unrolled into one problem
(L copies of a random layer chained: each copy's input is the previous copy's output, each copy's
incoming gradient the next copy's input gradient), the one-device states, and the solve against
every combination of plans checked by the unrolled simulation."""

from __future__ import annotations

import random

import pytest

from solvers import Node, Problem, Role
from solvers.baselines import inputs_only, save_all, uniform_checkpoints
from solvers.liveness import simulator
from solvers.memory_kinds import MemoryKind as K
from solvers.problem import Parameter
from solvers.rank_memory import RankModel
from solvers.step import Step, StepGraph, graph_stats, step_peak
from solvers.errors import StepBudgetError
from solvers.step_solve import solve_step, spend_step
from solvers.training import TrainingSetup

F, B, IN = Role.FORWARD, Role.BACKWARD, Role.INPUT


def random_layer(seed: int, n_forward: int = 7, n_backward: int = 6, ctx: bool = False) -> Problem:
    """A layer: data input ``x``, two parameters, forward values ending in ``y`` (the output,
    x's size), the tangent ``ty``; backward values ending in the gradients of the parameters and
    of ``x``. ``ctx``: a context input every copy shares (a rotary table), of another size."""
    rng = random.Random(seed)
    width = rng.randint(2, 6) * 16
    nodes = [Node("x", IN, bytes=width), Node("w0", IN, bytes=32), Node("w1", IN, bytes=48)]
    if ctx:
        nodes.append(Node("c", IN, bytes=width + 16))
    fwd: list[str] = ["c"] if ctx else []
    for i in range(n_forward):
        pool = ["x", "w0", "w1", *fwd][-5:]
        ins = tuple(sorted(set(rng.sample(pool, k=min(len(pool), rng.randint(1, 3))))))
        if ctx and i == 0:  # the forward reads it (an input only the backward reads is a gradient)
            ins = tuple(sorted({*ins, "c"}))
        nodes.append(Node(f"f{i}", F, ins, bytes=rng.randint(1, 8) * 16, cost=float(rng.randint(1, 9)),
                          banned=rng.random() < 0.1))
        fwd.append(f"f{i}")
    fwd = [v for v in fwd if v != "c"]
    nodes.append(Node("y", F, (fwd[-1], "x"), bytes=width, cost=1.0))
    nodes.append(Node("ty", IN, bytes=width))
    bwd = ["ty"]
    for j in range(n_backward):
        ins = set(rng.sample(["x", *(["c"] if ctx else []), *fwd], k=rng.randint(1, 2))) | {bwd[-1]}
        nodes.append(Node(f"b{j}", B, tuple(sorted(ins, key=[n.name for n in nodes].index)),
                          bytes=rng.randint(1, 6) * 16))
        bwd.append(f"b{j}")
    nodes += [Node("g0", B, (bwd[-1], "w0"), bytes=32), Node("g1", B, (bwd[-2], "w1"), bytes=48),
              Node("gx", B, (bwd[-1],), bytes=width)]
    params = (Parameter("w0", "w0", 8, 8, "g0"), Parameter("w1", "w1", 12, 12, "g1"))
    return Problem(tuple(nodes), forward_outputs=frozenset({"y"}),
                   backward_outputs=frozenset({"g0", "g1", "gx"}), parameters=params, name=f"layer-{seed}")


def chained(layer: Problem, copies: int, saved: frozenset[str]) -> tuple[Problem, set[str]]:
    """The step of ``copies`` layers as one problem, and the saved set of ``saved`` per copy (a
    copy's input is saved where its backward reads it: autograd holds it)."""
    by = layer.by_name
    sim = simulator(layer)
    order = sim.backward_order({sim.ids[v] for v in saved})
    read = {sim.names[u] for v in order for u in (v, *sim.inputs[v])}
    reads_x = "x" in read

    def name(k: int, v: str) -> str:
        if v == "c":
            return "c"
        if v == "x" and k > 0:
            return f"{k - 1}.y"
        if v == "ty" and k < copies - 1:
            return f"{k + 1}.gx"
        return f"{k}.{v}"

    nodes: list[Node] = []
    for k in range(copies):
        for n in layer.nodes:
            if n.name in ("x", "c") and k == 0:  # the step's inputs: made at its start, kept while read
                nodes.append(Node(name(0, n.name), F, bytes=n.bytes, banned=True))
            elif n.role is not B and not (n.name in ("x", "c") and k > 0) and n.name != "ty":
                nodes.append(Node(name(k, n.name), n.role, tuple(name(k, i) for i in n.inputs), bytes=n.bytes,
                                  cost=n.cost, banned=n.banned))
    nodes.append(Node(f"{copies - 1}.ty", B, bytes=by["ty"].bytes))  # the loss's gradient
    for k in range(copies - 1, -1, -1):
        for n in layer.nodes:
            if n.role is B:
                nodes.append(Node(name(k, n.name), B, tuple(name(k, i) for i in n.inputs), bytes=n.bytes))
    grads = {f"{k}.g{i}" for k in range(copies) for i in (0, 1)} | {"0.gx"}
    problem = Problem(tuple(nodes), forward_outputs=frozenset({f"{copies - 1}.y"}), backward_outputs=frozenset(grads))
    chain_saved = {name(k, v) for k in range(copies) for v in saved if by[v].role is not IN}
    chain_saved |= {name(k, "x") for k in range(copies) if reads_x} | ({"c"} & read)
    return problem, chain_saved


def plans_of(layer: Problem) -> list[frozenset[str]]:
    return list({p.saved for p in (save_all(layer), inputs_only(layer), *uniform_checkpoints(layer, (1,)))})


@pytest.mark.parametrize("seed", range(40))
def test_the_step_peak_is_the_unrolled_steps(seed):
    layer = random_layer(seed, ctx=seed % 2 == 1)
    copies = 1 + seed % 4
    for saved in plans_of(layer):
        chain, chain_saved = chained(layer, copies, saved)
        unrolled, _ = simulator(chain).peak(chain_saved)
        ours = step_peak(Step((StepGraph("layer", layer, copies),)), {"layer": saved}).total
        assert ours == unrolled, (seed, sorted(saved))


def test_a_repeated_graph_adds_what_each_copy_holds():
    layer = random_layer(3)
    saved = save_all(layer).saved
    s = graph_stats(layer, saved)
    peaks = [step_peak(Step((StepGraph("l", layer, n),)), {"l": saved}).total for n in (4, 5, 6)]
    # the last copy's backward (or the forward of the last) is the peak: one more copy before it
    # adds its held bytes and, at a backward peak, nothing else (its gradients come after)
    assert peaks[2] - peaks[1] == peaks[1] - peaks[0]
    assert peaks[1] - peaks[0] >= s.held - s.param_grads


def test_one_device_states_are_the_copies_states_summed():
    layer = random_layer(5)
    setup = TrainingSetup(optimizer="adamw")
    saved = save_all(layer).saved
    graph_only = step_peak(Step((StepGraph("l", layer, 3),)), {"l": saved})
    with_states = step_peak(Step((StepGraph("l", layer, 3),)), {"l": saved}, setup)
    per_copy = sum(RankModel(layer, setup).constant().values())
    assert with_states.total == graph_only.total + 3 * per_copy
    assert with_states.by_kind[K.OPTIMIZER] == 3 * 2 * 20 * 4  # adamw: 2 fp32 states per element


def test_the_solve_is_the_cheapest_fitting_combination_it_tried():
    root, layer = random_layer(11), random_layer(12)
    step = Step((StepGraph("root", root, 1, fixed=save_all(root).saved), StepGraph("layer", layer, 4)))
    lo = step_peak(step, {"root": save_all(root).saved, "layer": inputs_only(layer).saved}).total
    hi = step_peak(step, {"root": save_all(root).saved, "layer": save_all(layer).saved}).total
    for budget in (lo, (lo + hi) // 2, hi):
        found = solve_step(step, budget)
        saved = {k: p.saved for k, p in found.plans.items()}
        assert found.plans["root"].saved == save_all(root).saved
        assert step_peak(step, saved).total == found.peak.total <= budget
        # every plan of the layer's own list that fits is no cheaper
        for other in plans_of(layer):
            if step_peak(step, {"root": saved["root"], "layer": other}).total <= budget:
                assert found.cost <= 4 * graph_stats(layer, other).cost + 1e-9
    with pytest.raises(StepBudgetError, match="lowest step peak found"):
        solve_step(step, lo // 2)



@pytest.mark.parametrize("seed", range(6))
def test_spending_the_budget_is_never_worse_and_fits_the_unrolled_step(seed):
    layer = random_layer(100 + seed, n_forward=9, n_backward=7)
    copies = 2 + seed % 3
    step = Step((StepGraph("layer", layer, copies),))
    lo = step_peak(step, {"layer": inputs_only(layer).saved}).total
    hi = step_peak(step, {"layer": save_all(layer).saved}).total
    for budget in (lo, (lo + hi) // 2, hi):
        for start in (solve_step(step, budget, spend_evaluations=0).plans["layer"].saved, inputs_only(layer).saved):
            before = graph_stats(layer, start)
            if step_peak(step, {"layer": before}).total > budget:
                continue
            saved = spend_step(step, {"layer": step.stats("layer", start)}, ["layer"], budget)["layer"].saved
            assert graph_stats(layer, saved).cost <= before.cost
            assert step_peak(step, {"layer": saved}).total <= budget
            # cross-checked on the step unrolled into one problem: its simulation
            chain, chain_saved = chained(layer, copies, saved)
            assert simulator(chain).peak(chain_saved)[0] <= budget
    # from the least-recompute plan nothing is left to spend; from inputs-only at eager's peak, all of it
    spent = spend_step(step, {"layer": step.stats("layer", inputs_only(layer).saved)}, ["layer"], hi)["layer"]
    assert spent.cost == 0.0


def test_the_solve_spends_budget_the_candidates_left():
    """A step whose best candidate combination peaks under the budget: the solve saves back values
    until the step peak meets it, cheaper than the combination, and never costlier elsewhere."""
    layer = random_layer(104, n_forward=9, n_backward=7)
    step = Step((StepGraph("layer", layer, 3),))
    lo = step_peak(step, {"layer": inputs_only(layer).saved}).total
    hi = step_peak(step, {"layer": save_all(layer).saved}).total
    budget = lo + (hi - lo) // 3
    old, new = solve_step(step, budget, spend_evaluations=0), solve_step(step, budget)
    assert old.peak.total < budget and new.cost < old.cost
    assert old.peak.total < new.peak.total == step_peak(step, {"layer": new.plans["layer"].saved}).total <= budget
    assert new.cost == pytest.approx(3 * graph_stats(layer, new.plans["layer"].saved).cost)
    assert any("budget left spent" in n for n in new.notes)
