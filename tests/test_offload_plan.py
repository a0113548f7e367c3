"""The offload chooser (``solvers.offload_plan``): never more added time than the plan it starts
from, always inside the peak by the offload-aware simulation, bans, threshold and host cap kept."""

import pytest
from support.random_problems import random_problem, repeated_problem

from solvers import Node, Problem, Role
from solvers.baselines import save_all
from solvers.fast_peak import fast_peak_plan
from solvers.liveness import simulate_plan
from solvers.offload import HostLink, offload_candidates, offload_errors, offloaded_curve
from solvers.offload_plan import choose_offload, offload_cost
from solvers.peak import PeakInfeasibleError
from solvers.problem import check_plan

F, B, IN = Role.FORWARD, Role.BACKWARD, Role.INPUT


def _cases():
    for seed in range(24):
        problem = (repeated_problem(seed, layers=4) if seed % 2 else
                   random_problem(seed, n_forward=14, n_backward=10, view_prob=0.2))
        top = simulate_plan(problem, save_all(problem).saved).peak
        for fraction in (0.6, 0.8, 0.95):
            try:
                plan = fast_peak_plan(problem, int(top * fraction))
            except PeakInfeasibleError:
                continue
            yield seed, problem, int(top * fraction), plan


@pytest.mark.parametrize("bandwidth", [1.0, 30.0, 1e6])  # bytes/s against costs of 1-9 s per node
def test_the_chooser_never_adds_time_and_always_fits(bandwidth):
    checked = improved = 0
    for seed, problem, peak, plan in _cases():
        link = HostLink(bandwidth, bandwidth, min_bytes=1)
        chosen = choose_offload(problem, plan, peak, link)
        before = offload_cost(problem, plan.saved, plan.offloaded, link)
        after = offload_cost(problem, chosen.saved, chosen.offloaded, link)
        assert after.added_s <= before.added_s + 1e-9, seed
        curve, _ = offloaded_curve(problem, chosen.saved, chosen.offloaded, link)  # an independent run
        assert curve.peak <= peak, seed
        assert check_plan(problem, chosen).valid and not offload_errors(problem, chosen, link), seed
        assert chosen.extra["offload"]["added_s"] == pytest.approx(after.added_s)
        checked += 1
        improved += after.added_s < before.added_s - 1e-9
    assert checked > 30
    if bandwidth == 1e6:  # copies all but free: offload must win somewhere
        assert improved > 0


def test_bans_threshold_and_host_cap_are_kept():
    for seed, problem, peak, plan in _cases():
        sizes = sorted(problem.storage_size.values())
        link = HostLink(1e6, 1e6, host_bytes=sizes[len(sizes) // 2] * 2, min_bytes=sizes[len(sizes) // 3])
        chosen = choose_offload(problem, plan, peak, link)
        allowed = set(offload_candidates(problem, link))
        assert chosen.offloaded <= allowed, seed
        assert sum(problem.storage_size[problem.by_name[v].storage_id] for v in chosen.offloaded) <= link.host_bytes
        assert not offload_errors(problem, chosen, link)


def test_no_host_memory_means_no_offload_and_the_same_plan():
    for _, problem, peak, plan in list(_cases())[:10]:
        chosen = choose_offload(problem, plan, peak, HostLink(1e6, 1e6, host_bytes=0, min_bytes=1))
        assert not chosen.offloaded and chosen.saved == plan.saved


def _chain() -> Problem:
    """x -> a -> b -> c -> d (4 s each, 100 B); the backward reads them all in reverse."""
    nodes = [Node("x", IN)]
    prev = "x"
    for v in "abcd":
        nodes.append(Node(v, F, (prev,), 100, cost=4.0))
        prev = v
    nodes.append(Node("out", F, ("d",), 8, cost=1.0))
    nodes.append(Node("t", B))
    prev = "t"
    for i, v in enumerate("dcba"):
        nodes.append(Node(f"g{i}", B, (prev, v), 100, cost=4.0))
        prev = f"g{i}"
    return Problem(tuple(nodes), forward_outputs=frozenset({"out"}), backward_outputs=frozenset({prev}))


def test_on_a_chain_offload_replaces_recompute_and_must_values_stay_offloaded():
    problem = _chain()
    top = simulate_plan(problem, {"a", "b", "c", "d"}).peak
    plan = fast_peak_plan(problem, top - 100)
    assert plan.recompute_cost > 0
    fast = HostLink(1000.0, 1000.0, min_bytes=1)  # 0.1 s a copy, hidden by 4 s ops
    chosen = choose_offload(problem, plan, top - 100, fast)
    assert chosen.recompute_cost == 0 and chosen.offloaded
    assert chosen.extra["offload"]["exposed_s"] == 0.0
    assert chosen.extra["offload"]["without"]["added_s"] == plan.recompute_cost
    slow = HostLink(1.0, 1.0, min_bytes=1)  # 100 s a copy: recompute is cheaper
    assert choose_offload(problem, plan, top - 100, slow).recompute_cost == plan.recompute_cost
    must = sorted(v for v in plan.saved if v in offload_candidates(problem, slow))[:1]
    kept = choose_offload(problem, plan, top - 100, slow, must=must)
    assert set(must) <= kept.offloaded
