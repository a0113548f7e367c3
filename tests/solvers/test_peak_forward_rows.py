"""The forward's rows of the peak relaxation (solvers.peak.forward_rows) keep it a relaxation:
true plans fit them at their own peak, the bound stays below brute force, and rows that count a
byte more fail these checks; the cut rounds turn them on where a plan overshoots in the forward."""

from support.random_problems import repeated_problem
from test_peak_bound import _pinned_true_plans, _problem, _valid_plans

from solvers.liveness import simulate_plan
from solvers.mip_model import build_model, presolve
from solvers.peak.relaxation import solve_relaxation
from solvers.peak.rows import peak_rows



def _forward_pinned(seeds):
    """(problem, model, rows, plan, its simulated peak, pinned variables) of true plans of random
    problems (with ``either`` values) and of repeated layers."""
    for seed in seeds:
        for p in (_problem(seed), repeated_problem(seed, layers=3, per_layer=4)):
            model = presolve(p, build_model(p), for_peak=True)
            rows = peak_rows(p)
            for plan, peak, fixed in _pinned_true_plans(p, model, 20):
                yield p, model, rows, plan, peak, fixed


def test_every_true_plan_fits_the_forward_rows_at_its_own_peak():
    # solvers.peak.forward_rows: the forward's own peak and the inputs kept for saved either values
    checked = 0
    for p, model, rows, plan, peak, fixed in _forward_pinned(range(40)):
        relaxed = solve_relaxation(p, model, rows, peak, time_limit_s=5, fixed=fixed, forward=True)
        assert relaxed.status in ("optimal", "feasible"), (sorted(plan.saved), peak)
        checked += 1
    assert checked > 600


def test_forward_rows_test_fails_on_rows_that_overcount(monkeypatch):
    """The check above can fail: rows that count one byte more than the forward holds at the
    positions they keep refuse some true plan at its own peak."""
    from solvers.peak import forward_rows
    real = forward_rows.forward_terms

    def over(problem):
        kept, consts, starts = real(problem)
        return kept, [c + 1 for c in consts], starts

    monkeypatch.setattr(forward_rows, "forward_terms", over)
    refused = sum(solve_relaxation(p, model, rows, peak, time_limit_s=5, fixed=fixed, forward=True).status
                  == "infeasible" for p, model, rows, plan, peak, fixed in _forward_pinned(range(40)))
    assert refused > 0


def test_forward_rows_bound_stays_below_the_true_optimum():
    compared = raised = 0
    for seed in range(40):
        for p in (_problem(seed), repeated_problem(seed, layers=3, per_layer=4)):
            plans = [(simulate_plan(p, plan.saved).peak, plan.recompute_cost) for plan in _valid_plans(p)]
            model = presolve(p, build_model(p), for_peak=True)
            rows = peak_rows(p)
            for budget in sorted({peak for peak, _ in plans})[:4]:
                least = min(cost for peak, cost in plans if peak <= budget)
                with_rows = solve_relaxation(p, model, rows, budget, time_limit_s=5, forward=True)
                plain = solve_relaxation(p, model, rows, budget, time_limit_s=5)
                assert with_rows.status != "infeasible" and with_rows.bound <= least * (1 + 1e-6) + 1e-12
                raised += with_rows.bound > plain.bound * (1 + 1e-9) + 1e-12
                compared += 1
    assert compared > 200 and raised > 0


def test_a_cut_round_on_a_plan_over_in_the_forward_turns_the_forward_rows_on():
    """A relaxation plan that overshoots only in the forward leaves the cut rounds no backward
    step to cut: the round turns the forward's rows on instead of stopping (and its re-solve's
    bound is still a bound: below brute force)."""
    import time
    from solvers.peak.state import Clock, PeakState
    from solvers.peak.strategy_cuts import _round, _Rounds
    turned = 0
    for seed in range(60):
        p = _problem(seed)
        plans = [(simulate_plan(p, plan.saved), plan) for plan in _valid_plans(p)]
        for curve, plan in plans:
            budget = curve.forward_peak - 1
            if curve.backward_peak > budget or not any(c.peak <= budget for c, _ in plans):
                continue
            state = PeakState(p, budget, None, clock=Clock(5.0, len(p.candidates)), threads=1, seed=0,
                              gap=0.0, frontier=[])
            assert _round(state, _Rounds(), plan, curve, time.perf_counter() + 5.0) is not None
            assert state.forward_rows and not state.cut_steps
            assert state.bound <= min(pl.recompute_cost for c, pl in plans if c.peak <= budget) + 1e-9
            turned += 1
            break
    assert turned >= 5
