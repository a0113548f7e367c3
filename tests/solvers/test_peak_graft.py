"""Grafted plans (solvers.peak.graft): every graft returned fits and is simulated exactly, and on
layered graphs grafting a cheap plan that overshoots onto a fitting one finds cheaper plans."""

import random

from support.random_problems import random_problem, repeated_problem

from solvers.baselines import save_all
from solvers.liveness import simulate_plan
from solvers.peak.candidates import checkpoint_plans
from solvers.peak.graft import graft_plans
from solvers.problem import check_plan


def test_grafts_fit_and_are_valid_plans():
    checked = 0
    for seed in range(40):
        p = random_problem(seed, n_forward=random.Random(seed).randint(5, 12), view_prob=0.2,
                           either_prob=0.2, n_backward=6)
        cheap = save_all(p)  # nothing recomputed: the cheapest plan, and the largest peak
        top = simulate_plan(p, cheap.saved).peak
        for plan, peak in checkpoint_plans(p):
            if peak >= top:
                continue
            for got, got_peak in graft_plans(p, plan.saved, [cheap.saved], top - 1):
                assert check_plan(p, got).valid, seed
                assert got_peak == simulate_plan(p, got.saved).peak <= top - 1, seed
                checked += 1
    assert checked > 20


def test_grafting_beats_both_plans_on_layered_graphs():
    better = total = 0
    for seed in range(12):
        p = repeated_problem(seed, layers=8, per_layer=5)
        cheap = save_all(p)
        cheap_peak = simulate_plan(p, cheap.saved).peak
        for plan, peak in checkpoint_plans(p):
            if peak >= cheap_peak or plan.recompute_cost <= 0:
                continue
            budget = (peak + cheap_peak) // 2  # between the two: the cheap plan does not fit
            total += 1
            grafts = graft_plans(p, plan.saved, [cheap.saved], budget)
            assert all(pk <= budget for _, pk in grafts)
            better += any(g.recompute_cost < plan.recompute_cost for g, _ in grafts)
    assert total >= 10
    assert better >= 0.8 * total, (better, total)  # measured: 69 of 69
