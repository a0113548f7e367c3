"""Plans mixed layer by layer (solvers.peak.layers): the repeated layers are found position by
position, every plan returned is valid and fits by the exact simulation, and mixing the layers of
a cheap plan that overshoots with checkpointing's finds cheaper plans that fit."""

from support.random_problems import random_problem, repeated_problem

from solvers.baselines import save_all, uniform_checkpoints
from solvers.liveness import simulate_plan
from solvers.peak.layers import find_layers, layer_plans
from solvers.problem import check_plan


def test_layers_found_position_by_position():
    for seed in range(10):
        p = repeated_problem(seed, layers=8, per_layer=5)
        layers = find_layers(p)
        # layers near the graph's ends may differ from the rest in their neighbours, and a layer
        # may start anywhere in the block: consecutive copies, all the same
        assert layers is not None and 4 <= len(layers.slots) <= 8, seed
        for slots in zip(*layers.slots):  # one position: the same op and size in every layer,
            assert len({(p.by_name[v].bytes, p.by_name[v].cost) for v in slots}) == 1, seed
            gaps = {p.index[b] - p.index[a] for a, b in zip(slots, slots[1:])}
            assert len(gaps) == 1, seed  # one block length apart


def test_no_layers_in_an_irregular_graph():
    assert find_layers(random_problem(3, n_forward=10)) is None


def test_mixed_plans_fit_and_beat_checkpointing():
    total = better = 0
    for seed in range(20):
        p = repeated_problem(seed, layers=8, per_layer=6)
        layers = find_layers(p)
        base = uniform_checkpoints(p, (1,))[0]
        cheap = save_all(p)
        base_peak = simulate_plan(p, base.saved).peak
        cheap_peak = simulate_plan(p, cheap.saved).peak
        if cheap_peak <= base_peak or base.recompute_cost <= 0:
            continue
        for budget in (base_peak, (base_peak + cheap_peak) // 2):
            total += 1
            got = layer_plans(p, layers, base.saved, [cheap.saved, base.saved], budget,
                              deadline=float("inf"))
            for plan, peak in got:
                assert check_plan(p, plan).valid, seed
                assert peak == simulate_plan(p, plan.saved).peak <= budget, seed
            better += any(plan.recompute_cost < base.recompute_cost for plan, _ in got)
    assert total >= 10
    assert better >= 0.4 * total, (better, total)  # measured: 18 of 36


def test_the_layers_own_trade_off_saves_more_and_recomputes_less_each_step():
    """Each nested option keeps the last and lowers the whole plan's recompute cost, counted by
    ``recompute_closure`` over the graph (the options count it within the layer)."""
    from solvers.peak.layers import _nested_options
    from solvers.problem import recompute_closure

    checked = 0
    for seed in range(10):
        p = repeated_problem(seed, layers=8, per_layer=6)
        layers = find_layers(p)
        base = uniform_checkpoints(p, (1,))[0]
        if layers is None:
            continue
        probe = len(layers.slots) // 2
        slot = layers.slots[probe]
        keep = frozenset(i for i, v in enumerate(slot) if v in base.saved)
        outside = {v for v in base.saved if v not in slot}
        last, last_cost = keep, base.recompute_cost
        for option in _nested_options(p, slot, keep):
            assert last < option
            saved = outside | {slot[i] for i in option}
            recomputed, errors = recompute_closure(p, saved)
            assert not errors
            cost = sum(p.recompute_cost_of(v) for v in recomputed)
            assert cost < last_cost - 1e-12, seed
            last, last_cost = option, cost
            checked += 1
    assert checked, "no nested option on any problem: the test checks nothing"



def _model_fits(chain, peaks: list[int], forward: int, target: int, unit: int) -> bool:
    """The layer program's model of a chain of options, written out: layer by layer."""
    held = 0  # in units, rounded up per layer as the program counts them
    for peak, o in zip(peaks, chain):
        if peak + held * unit + o.own > target:
            return False
        held += -(-o.held // unit)
    return forward + held * unit <= target


def test_the_layer_program_finds_the_least_cost_chain_that_its_model_fits():
    """The dynamic program (array steps over states x options) against every chain enumerated:
    the same least cost, and its chain fits the model it was built on."""
    import itertools
    import random

    from solvers.peak.layers import _best_chain, _Option

    rng = random.Random(3)
    unit = 10
    for _ in range(300):
        n = rng.randint(2, 4)
        # bytes on a coarse grid, so that peaks meet the target exactly (the boundary counts)
        options, last = ([_Option(frozenset({i}), rng.choice([0.0, 1.0, 2.5, -1.0, 0.5]), 5 * rng.randint(-6, 8),
                                  rng.randint(-25, 60)) for i in range(rng.randint(1, 4))] for _ in range(2))
        peaks = [10 * rng.randint(5, 12) for _ in range(n)]
        forward, target = 10 * rng.randint(4, 15), 10 * rng.randint(10, 26)
        chains = [c for c in itertools.product(*([options] * (n - 1) + [last]))
                  if _model_fits(c, peaks, forward, target, unit)]
        got = _best_chain(options, last, peaks, forward, target, unit)
        if not chains:
            assert got is None
            continue
        assert got is not None
        picked = [next(o for o in options if o.positions == p) for p in got[:-1]]
        picked.append(next(o for o in last if o.positions == got[-1]))
        assert _model_fits(picked, peaks, forward, target, unit)
        assert abs(sum(o.cost for o in picked) - min(sum(o.cost for o in c) for c in chains)) < 1e-9
