"""The peak relaxation (solvers.peak.rows) is a relaxation: its live bytes never exceed the exact
simulation's, and its optimum never exceeds the true least cost (brute force) at a peak budget."""

import itertools
import random

import pytest

from solvers import Problem, recompute_closure
from solvers.liveness import simulate_plan
from solvers.mip_model import build_model, presolve
from solvers.options import PeakSearchOptions
from solvers.peak import PeakInfeasibleError, peak_search
from solvers.peak.rows import peak_rows, relaxed_live
from solvers.peak.relaxation import solve_relaxation
from solvers.problem import Node, PlanError, Role, Status, plan_from_saved
from support.random_problems import random_problem


def _problem(seed, multi_output_prob=0.25, view_prob=0.2):
    rng = random.Random(seed)
    p = random_problem(seed, n_forward=rng.randint(4, 9), view_prob=view_prob, either_prob=0.2,
                       n_backward=rng.randint(3, 8), multi_output_prob=multi_output_prob)
    fw = [n.name for n in p.nodes if n.role is Role.FORWARD]
    bw = [n.name for n in p.nodes if n.role is Role.BACKWARD]
    return Problem(p.nodes, forward_outputs=frozenset(fw[-1:]), backward_outputs=frozenset(rng.sample(bw, 2)))


def _valid_plans(p):
    choices = [n.name for n in p.candidates if p.can_save(n.name)]
    for r in range(len(choices) + 1):
        for combo in itertools.combinations(choices, r):
            try:
                yield plan_from_saved(p, combo, solver="brute", status=Status.FEASIBLE)
            except PlanError:
                continue


def test_relaxed_live_bytes_never_exceed_the_simulation():
    checked = 0
    for seed in range(60):
        p = _problem(seed)
        rows = peak_rows(p)
        backward = [n.name for n in p.nodes if n.role is Role.BACKWARD]
        for plan in itertools.islice(_valid_plans(p), 200):
            curve = simulate_plan(p, plan.saved)
            at = {name: live for phase, name, live in curve.steps if phase == "backward"}
            relaxed = relaxed_live(p, rows, set(plan.saved), set(plan.recomputed))
            for k, name in enumerate(backward):
                assert relaxed[k] <= at[name], (seed, sorted(plan.saved), name)
            checked += 1
    assert checked > 500


def test_relaxation_counts_a_multi_output_ops_outputs_from_its_call():
    # convolution_backward's grad_input and grad_weight exist from its call on, as the simulation
    # has them (4-layer ResNet at 1/4 of floor..min-cut: 51,200 bytes missed there, and the
    # budget was not proven infeasible)
    nodes = [Node("x", Role.INPUT, bytes=64), Node("f", Role.FORWARD, ("x",), bytes=64, cost=1.0),
             Node("g", Role.FORWARD, ("f",), bytes=64, cost=1.0),
             Node("conv_bw", Role.BACKWARD, ("g",), bytes=0),
             Node("grad_in", Role.BACKWARD, ("conv_bw",), bytes=32, allocated_by="conv_bw"),
             Node("grad_w", Role.BACKWARD, ("conv_bw",), bytes=16, allocated_by="conv_bw"),
             Node("b", Role.BACKWARD, ("grad_in", "f"), bytes=8)]
    p = Problem(tuple(nodes), forward_outputs=frozenset(["g"]), backward_outputs=frozenset(["grad_w", "b"]))
    rows = peak_rows(p)
    for plan in _valid_plans(p):
        curve = simulate_plan(p, plan.saved)
        at = {name: live for phase, name, live in curve.steps if phase == "backward"}
        relaxed = relaxed_live(p, rows, set(plan.saved), set(plan.recomputed))
        assert relaxed[0] == at["conv_bw"] >= 32 + 16 + 64, sorted(plan.saved)


@pytest.mark.slow  # many exact peak solves: run by .ci/run
def test_relaxation_bound_is_below_the_true_optimum():
    tight = total = 0
    for seed in range(60):
        p = _problem(seed)
        everything = [n.name for n in p.candidates if p.can_save(n.name)]
        if recompute_closure(p, everything)[1]:
            continue
        plans = [(plan, simulate_plan(p, plan.saved).peak) for plan in _valid_plans(p)]
        top = max(peak for _, peak in plans)
        model = presolve(p, build_model(p), for_peak=True)
        rows = peak_rows(p)
        for frac in (1.0, 0.85, 0.7, 0.55):
            budget = int(top * frac)
            fits = [plan.recompute_cost for plan, peak in plans if peak <= budget]
            relaxed = solve_relaxation(p, model, rows, budget, time_limit_s=5)
            if not fits:
                continue  # the relaxation may or may not see it: it only under-counts
            total += 1
            assert relaxed.status != "infeasible", (seed, budget)
            assert relaxed.bound is not None and relaxed.bound <= min(fits) + 1e-12, (seed, budget)
            tight += relaxed.bound >= min(fits) - 1e-12
            # the solve's reported bound is the relaxation's and its plan fits
            plan = peak_search(p, budget, options=PeakSearchOptions(time_limit_s=5))
            assert plan.bound <= min(fits) + 1e-12 <= plan.recompute_cost + 2e-12
            assert simulate_plan(p, plan.saved).peak <= budget
    assert total > 50
    assert tight >= 0.5 * total, (tight, total)  # measured: most bounds are the optimum itself


def test_relaxation_proves_budgets_infeasible():
    # below the floor of every plan the relaxation admits nothing, and says so
    for seed in range(20):
        p = _problem(seed)
        if recompute_closure(p, [n.name for n in p.candidates if p.can_save(n.name)])[1]:
            continue
        smallest = min(simulate_plan(p, plan.saved).peak for plan in _valid_plans(p))
        try:
            peak_search(p, smallest - 1, options=PeakSearchOptions(time_limit_s=3))
        except PeakInfeasibleError as exc:
            assert exc.min_peak is None or exc.min_peak >= smallest
        else:
            raise AssertionError(f"seed {seed}: a plan under the smallest peak {smallest}")


def test_gradients_split_and_activation_only_budgets():
    from solvers.liveness import without_gradients
    checked = 0
    for seed in range(40):
        p = _problem(seed)
        bare = without_gradients(p)
        for plan in itertools.islice(_valid_plans(p), 30):
            full, acts = simulate_plan(p, plan.saved), simulate_plan(bare, plan.saved)
            assert bare.saved_bytes(plan.saved) == p.saved_bytes(plan.saved)
            assert 0 <= full.peak_gradients <= full.peak
            assert full.peak - full.peak_gradients <= acts.peak <= full.peak
            checked += 1
        if recompute_closure(p, [n.name for n in p.candidates if p.can_save(n.name)])[1]:
            continue
        # a budget only the activations fit: met with count_gradients=False, and the plan's full
        # step may exceed it by at most the gradients
        top = simulate_plan(bare, [n.name for n in p.candidates if p.can_save(n.name)]).peak
        try:
            plan = peak_search(p, top, options=PeakSearchOptions(time_limit_s=3), count_gradients=False)
        except PeakInfeasibleError:
            continue
        assert simulate_plan(bare, plan.saved).peak <= top and plan.extra["count_gradients"] is False
    assert checked > 300


def _pinned_true_plans(p, model, count):
    """Valid plans of ``p`` in presolve's normal form: (plan, its simulated peak, the program's
    variables pinned to it)."""
    from solvers.mip_model import hint_from_plan, normalize_saved
    for plan in itertools.islice(_valid_plans(p), count):
        normal = plan_from_saved(p, normalize_saved(model, plan.saved), solver="x", status=Status.FEASIBLE)
        # presolve's normal form is no more live anywhere (see solvers.peak.rows' docstring)
        assert simulate_plan(p, normal.saved).peak <= simulate_plan(p, plan.saved).peak
        yield normal, simulate_plan(p, normal.saved).peak, hint_from_plan(model, normal)


@pytest.mark.slow  # brute force over ~200 problems: ~6 s
def test_peak_presolve_keeps_a_least_cost_plan_at_every_peak():
    """presolve(for_peak=True)'s view reduction (a view's base saved instead of the view) leaves,
    at every peak budget, a plan as cheap as the cheapest of all plans (measured: without the
    for_peak condition 9 of these problems lost every plan at some budget)."""
    with_views = 0
    for seed in range(200):
        for view_prob in (0.3, 0.6):
            p = _problem(seed, view_prob=view_prob)
            base_model = build_model(p)
            model = presolve(p, base_model, for_peak=True)
            by_name = p.by_name
            dropped = {v for v, w in model.replaced.items()
                       if v not in base_model.replaced and by_name[v].storage_id == by_name[w].storage_id}
            if not dropped:
                continue
            with_views += 1
            plans = [(simulate_plan(p, plan.saved).peak, plan.recompute_cost, set(plan.saved))
                     for plan in _valid_plans(p)]
            for budget in sorted({peak for peak, _, _ in plans}):
                least = min(cost for peak, cost, _ in plans if peak <= budget)
                kept = [cost for peak, cost, saved in plans if peak <= budget and not saved & dropped]
                assert kept and min(kept) <= least + 1e-12, (seed, view_prob, budget, sorted(dropped))
    assert with_views > 100


def test_every_true_plan_fits_the_relaxation_at_its_own_peak():
    # the relaxation must admit each valid plan at the plan's simulated
    # peak: otherwise its bound could exceed a real plan's cost
    checked = 0
    for seed in range(30):
        p = _problem(seed)
        model = presolve(p, build_model(p), for_peak=True)
        rows = peak_rows(p)
        for plan, peak, fixed in _pinned_true_plans(p, model, 25):
            relaxed = solve_relaxation(p, model, rows, peak, time_limit_s=5, fixed=fixed)
            assert relaxed.status in ("optimal", "feasible"), (seed, sorted(plan.saved), relaxed.status)
            checked += 1
    assert checked > 300


def test_highs_and_cpsat_prove_the_same_relaxation_bound():
    """The two engines solve the same relaxation: HiGHS's bound never exceeds the true least cost
    (brute force), and matches CP-SAT's up to HiGHS's relative gap (its integer-but-not-boolean
    variables are continuous, which can only lower it)."""
    compared = agree = 0
    for seed in range(25):
        p = _problem(seed)
        plans = [(plan, simulate_plan(p, plan.saved).peak) for plan in _valid_plans(p)]
        if not plans:
            continue
        top = max(peak for _, peak in plans)
        model = presolve(p, build_model(p), for_peak=True)
        rows = peak_rows(p)
        for frac in (0.9, 0.7):
            budget = int(top * frac)
            fits = [plan.recompute_cost for plan, peak in plans if peak <= budget]
            by_cpsat = solve_relaxation(p, model, rows, budget, time_limit_s=5, engine="cpsat")
            by_highs = solve_relaxation(p, model, rows, budget, time_limit_s=5,
                                        engine="highs")
            if by_cpsat.status == "infeasible":
                assert by_highs.status == "infeasible" or by_highs.bound is not None
                continue
            assert by_highs.status != "infeasible", (seed, budget)
            if fits:
                assert by_highs.bound <= min(fits) * (1 + 1e-9) + 1e-15, (seed, budget)
            assert by_highs.bound <= by_cpsat.bound * (1 + 1e-9) + 1e-15 or \
                by_highs.bound <= by_cpsat.objective * (1 + 1e-9) + 1e-15, (seed, budget)
            compared += 1
            agree += by_highs.bound >= by_cpsat.bound * (1 - 1e-3) - 1e-15
            # without HiGHS's probing (the cut rounds once one is solved): the same program
            unprobed = solve_relaxation(p, model, rows, budget, time_limit_s=5,
                                        engine="highs", probing=False)
            assert unprobed.status == by_highs.status, (seed, budget)
            assert abs(unprobed.bound - by_highs.bound) <= 1e-3 * by_highs.bound + 1e-15, (seed, budget)
    assert compared >= 20
    assert agree == compared, (agree, compared)  # measured: 42 of 42


@pytest.mark.parametrize("full_window", [True, False])
def test_every_true_plan_fits_the_cut_rows_at_its_own_peak(monkeypatch, full_window):
    # solvers.peak.cuts' rows at every backward step must admit each valid plan at its simulated
    # peak (with N at its true values), or the bound they raise would not be a bound; both with
    # a variable for every value (small graphs) and with the windows big graphs get (noted plans
    # and the nearest reads)
    from solvers.peak import cuts as peak_cuts
    if not full_window:
        monkeypatch.setattr(peak_cuts, "FULL_WINDOW", 0)
        monkeypatch.setattr(peak_cuts, "CHAIN_WINDOW", 2)
    checked = 0
    for seed in range(40):
        p = _problem(seed)
        model = presolve(p, build_model(p), for_peak=True)
        rows = peak_rows(p)
        ctx = peak_cuts.CutContext(p, model, rows)
        steps = list(range(len(rows.consts)))
        others = list(itertools.islice(_valid_plans(p), 40))
        for other in random.Random(seed).sample(others, min(3, len(others))):  # windows from others
            for tau in steps:
                ctx.note(tau, set(other.saved), set(other.recomputed))
        for plan, peak, fixed in _pinned_true_plans(p, model, 25):
            relaxed = solve_relaxation(p, model, rows, peak, time_limit_s=5,
                                       fixed=fixed, cuts=(ctx, steps))
            assert relaxed.status in ("optimal", "feasible"), (seed, sorted(plan.saved), relaxed.status)
            checked += 1
    assert checked > 400


def test_cut_rows_cut_off_more_plans_that_do_not_fit():
    # the converse, measured: pinned at a budget one byte below their simulated peak, plans are
    # refused by the rows at every step more often than by the plain relaxation
    from solvers.peak.cuts import CutContext
    refused = refused_plain = total = 0
    for seed in range(40):
        p = _problem(seed, multi_output_prob=0.0)  # as measured (with them: 174 vs 153 of 260)
        model = presolve(p, build_model(p), for_peak=True)
        rows = peak_rows(p)
        ctx = CutContext(p, model, rows)
        steps = list(range(len(rows.consts)))
        for plan, peak, fixed in _pinned_true_plans(p, model, 10):
            if simulate_plan(p, plan.saved).peak_phase != "backward":
                continue
            for tau in steps:
                ctx.note(tau, set(plan.saved), set(plan.recomputed))
            total += 1
            refused += solve_relaxation(p, model, rows, peak - 1, time_limit_s=5,
                                        fixed=fixed, cuts=(ctx, steps)).status == "infeasible"
            refused_plain += solve_relaxation(p, model, rows, peak - 1, time_limit_s=5,
                                              fixed=fixed).status == "infeasible"
    assert total > 100
    # measured: 157 vs 112 of 235 (141 before the rows counted a value made by the step for a
    # recomputation after it)
    assert refused >= refused_plain + 0.17 * total, (refused, refused_plain, total)


def _overshooting_plans():
    """Random problems' save-nothing plans with a budget a third of the way up their backward
    curve, where at least 3 steps overshoot: (problem, curve, live per step, budget, steps over)."""
    from solvers.peak.cuts import simulated_by_step
    for seed in range(30):
        p = _problem(seed)
        curve = simulate_plan(p, ())
        by_step = simulated_by_step(p, curve)
        budget = sorted(by_step)[len(by_step) // 3]
        over = [k for k, live in enumerate(by_step) if live > budget]
        if len(over) >= 3:
            yield p, curve, by_step, budget, over


def _worst(steps, by_step):
    return max(steps, key=lambda k: (by_step[k], k))


def test_violated_steps_skip_the_steps_cut_already():
    # the cut rounds go on past the steps they cut: with those skipped, the other steps over the
    # budget come back, each over it; first the worst one next to a cut step, then the worst one
    from solvers.peak.cuts import NEAR_CUT, violated_steps
    checked = 0
    for p, curve, by_step, budget, over in _overshooting_plans():
        first = violated_steps(p, curve, budget, count=1, apart=0)
        assert first == [_worst(over, by_step)]
        rest = violated_steps(p, curve, budget, count=len(over), apart=0, skip=set(first))
        assert first[0] not in rest and sorted(first + rest) == over
        beside = [k for k in over if k != first[0] and abs(k - first[0]) <= NEAR_CUT]
        left = [k for k in over if k != first[0]]
        assert rest[0] == _worst(beside or left, by_step)
        if beside:
            assert rest[1] == _worst([k for k in left if k != rest[0]], by_step)
        checked += 1
    assert checked > 10


def test_violated_steps_start_where_the_relaxation_counts_most():
    # given the relaxation's live bytes per step, the first step cut is the overshooting one
    # where the relaxation is tightest (ties within 1% of the budget: the more overshooting)
    from solvers.peak.cuts import violated_steps
    checked = 0
    for p, curve, by_step, budget, over in _overshooting_plans():
        # a made-up relaxation: tightest at the least overshooting step
        relaxed = [budget - 5 * budget // 100] * len(by_step)
        least = min(over, key=lambda k: (by_step[k], k))
        relaxed[least] = budget
        got = violated_steps(p, curve, budget, count=2, apart=0, relaxed=relaxed)
        assert got[0] == least
        assert got[1] == _worst([k for k in over if k != least], by_step)
        checked += 1
    assert checked > 10

