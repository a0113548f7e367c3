"""The spending's shortcuts give what the plain ways give: the save-back gains of one dominator
tree per plan equal a closure per value; a simulation stopped at a limit agrees with the whole one
at or below it and says "over" above it; a judge that stops simulations at the budget spends to
the same plan with the same count of simulations."""

import math
import random

import pytest
from support.random_problems import random_problem, repeated_problem

from solvers.baselines import save_all, uniform_checkpoints
from solvers.liveness import simulate_plan, simulator
from solvers.peak.search import Judge, SearchState
from solvers.peak.spend import _save_back_gains, spend_budget


def _problems():
    for seed in range(10):
        yield random_problem(seed, n_forward=14, n_backward=10, view_prob=0.2, either_prob=0.1)
        yield repeated_problem(seed, layers=5, per_layer=5)


def _random_plans(p, rng, count):
    """Closed plans (kept saved, recomputed, cost) around save-all and checkpointing."""
    judge = Judge(p, 0, None, math.inf, 10**9)
    starts = [save_all(p).saved] + [ck.saved for ck in uniform_checkpoints(p, (1, 2))]
    names = [n.name for n in p.candidates if p.can_save(n.name)]
    out = []
    for _ in range(count):
        saved = set(rng.choice(starts))
        for v in rng.sample(names, k=rng.randint(0, len(names))):
            (saved.add if rng.random() < 0.5 else saved.discard)(v)
        closed = judge.close(saved)
        if closed is not None:
            out.append(closed)
    return judge, out


def test_save_back_gains_equal_a_closure_per_value():
    rng = random.Random(0)
    checked = 0
    for p in _problems():
        judge, plans = _random_plans(p, rng, 12)
        for kept, recomputed, cost in plans:
            st = SearchState(kept, recomputed, cost, p.saved_bytes(kept), 0)
            gains = _save_back_gains(p, judge, st)
            assert set(gains) == set(recomputed)
            for v in recomputed:
                moved = judge.close(kept | {v})
                assert moved is not None
                gain, added = gains[v]
                assert gain == pytest.approx(cost - moved[2], rel=1e-9, abs=1e-12), (p.name, v)
                assert added == p.saved_bytes(moved[0]) - st.saved_bytes, (p.name, v)
                checked += 1
    assert checked > 300


def test_a_peak_stopped_at_a_limit_agrees_below_it_and_is_over_above():
    rng = random.Random(1)
    below = above = 0
    for p in _problems():
        sim = simulator(p)
        _, plans = _random_plans(p, rng, 6)
        for kept, _, _ in plans:
            whole = sim.peak(kept)
            assert whole[0] == simulate_plan(p, kept).peak
            for limit in (whole[0] - 1, whole[0], whole[0] + 1, whole[0] // 2, 2 * whole[0]):
                got = sim.peak(kept, limit=limit)
                if whole[0] <= limit:
                    assert got == whole
                    below += 1
                else:
                    assert limit < got[0] <= whole[0] and got[1] == frozenset()
                    above += 1
    assert below > 50 and above > 50


def test_a_judge_that_stops_at_the_budget_spends_to_the_same_plan():
    same = 0
    for p in _problems():
        start = uniform_checkpoints(p, (1,))[0]
        lo, hi = simulate_plan(p, start.saved).peak, simulate_plan(p, save_all(p).saved).peak
        for share in (0.1, 0.4, 0.7):
            budget = lo + int(share * (hi - lo))
            runs = []
            for quick in (False, True):
                judge = Judge(p, budget, None, math.inf, 200, quick=quick)
                st = spend_budget(p, start.saved, budget, max_evaluations=200, judge=judge)
                runs.append((None if st is None else (st.saved, st.cost, st.peak), judge.evaluations))
            assert runs[0] == runs[1], (p.name, share)
            same += runs[0][0] is not None
    assert same > 30
