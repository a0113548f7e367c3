"""The offload model (``solvers.offload``) on tiny problems worked out by hand."""

import math

import pytest

from solvers import Node, Plan, Problem, Role, Status
from solvers.liveness import simulate_plan
from solvers.offload import (
    HostLink,
    host_bytes,
    link_for,
    offload_candidates,
    offload_errors,
    offload_timeline,
    offloaded_curve,
)

F, B, IN = Role.FORWARD, Role.BACKWARD, Role.INPUT


def _problem() -> Problem:
    """x -> a (1 s) -> b (1 s) -> c(a, b) (4 s) -> d (4 s) -> out (1 s); the backward reads d, c, b, a
    in turn (g1..g4: 2, 2, 1, 1 s). Values 100 B, out 8 B, the tangent 0 B."""
    return Problem((
        Node("x", IN),
        Node("a", F, ("x",), 100, cost=1.0),
        Node("b", F, ("a",), 100, cost=1.0),
        Node("c", F, ("a", "b"), 100, cost=4.0),
        Node("d", F, ("c",), 100, cost=4.0),
        Node("out", F, ("d",), 8, cost=1.0),
        Node("t", B),
        Node("g1", B, ("t", "d"), 100, cost=2.0),
        Node("g2", B, ("g1", "c"), 100, cost=2.0),
        Node("g3", B, ("g2", "b"), 100, cost=1.0),
        Node("g4", B, ("g3", "a"), 100, cost=1.0),
    ), forward_outputs=frozenset({"out"}), backward_outputs=frozenset({"g4"}))


SAVED = {"a", "b", "c", "d"}


def test_the_base_curve_is_what_the_hand_count_says():
    curve = simulate_plan(_problem(), SAVED)
    assert [b for _, _, b in curve.steps] == [100, 200, 300, 400, 408, 400, 500, 500, 400, 300]


def test_copies_overlap_compute_and_free_the_device_between_them():
    problem = _problem()
    tl = offload_timeline(problem, SAVED, {"a", "b"}, HostLink(100.0, 100.0))
    # a and b are last read by c (ends at 6 s): copies one at a time, a 6-7 s, b 7-8 s, hidden by d
    assert tl.copies["a"][:2] == (6.0, 7.0) and tl.copies["b"][:2] == (7.0, 8.0)
    # backward: steps end at 0, 2, 4, 5, 6 s; b first read by g3 (starts at 4 s), a by g4 (at 5 s):
    # as late as possible, one at a time: b 3-4 s, a 4-5 s
    assert tl.copies["b"][2:] == (3.0, 4.0) and tl.copies["a"][2:] == (4.0, 5.0)
    assert tl.exposed_s == 0.0 and tl.host_bytes == 200
    # off the device after the step their copy ends in (d) until the step their reload starts in
    assert tl.adjust == (0, 0, 0, 0, -200, -200, -200, -100, 0, 0)
    assert tl.in_flight == (0, 0, 0, 200, 0, 0, 0, 100, 100, 0)
    assert tl.away == {"a": range(4, 8), "b": range(4, 7)}
    curve, _ = offloaded_curve(problem, SAVED, {"a", "b"}, HostLink(100.0, 100.0))
    assert [b for _, _, b in curve.steps] == [100, 200, 300, 400, 208, 200, 300, 400, 400, 300]
    assert (curve.peak, curve.peak_phase, curve.peak_at) == (400, "forward", "d")  # was 500 at g1


def test_a_slow_link_exposes_what_compute_cannot_hide():
    tl = offload_timeline(_problem(), SAVED, {"a", "b"}, HostLink(10.0, 10.0))
    # 10 s copies: a 6-16 s, b 16-26 s; the forward's compute ends at 11 s
    assert tl.copies["b"][:2] == (16.0, 26.0)
    assert tl.d2h_exposed_s == pytest.approx(15.0)
    # reloads cannot start before the backward: b 0-10 s (needed at 4 s), a 10-20 s (needed at 5 s):
    # the backward waits 6 s, then 9 s more
    assert tl.copies["a"][2:] == (10.0, 20.0)
    assert tl.h2d_exposed_s == pytest.approx(15.0)
    assert tl.adjust[:5] == (0,) * 5  # held to the end of the forward: nothing freed there


def test_reloads_needed_by_the_same_backward_step_queue_behind_each_other():
    """a and b are both first read by g2 (starts at 4 s): 1 s reloads fit back to back before it
    whichever order the offloaded set iterates in (a set's order once made one of them late)."""
    problem = Problem((
        Node("x", IN),
        Node("a", F, ("x",), 100, cost=1.0),
        Node("b", F, ("a",), 100, cost=1.0),
        Node("c", F, ("b",), 100, cost=1.0),
        Node("out", F, ("c",), 8, cost=1.0),
        Node("t", B),
        Node("g1", B, ("t", "c"), 100, cost=4.0),
        Node("g2", B, ("g1", "a", "b"), 100, cost=1.0),
    ), forward_outputs=frozenset({"out"}), backward_outputs=frozenset({"g2"}))
    saved = {"a", "b", "c"}
    for offloaded in (["a", "b"], ["b", "a"], {"a", "b"}, frozenset({"b", "a"})):
        tl = offload_timeline(problem, saved, offloaded, HostLink(100.0, 100.0))
        assert tl.h2d_exposed_s == 0.0
        assert tl.copies["a"][2:] == (2.0, 3.0) and tl.copies["b"][2:] == (3.0, 4.0)


def test_nothing_offloaded_changes_nothing():
    problem = _problem()
    tl = offload_timeline(problem, SAVED, set(), HostLink(1.0, 1.0))
    assert set(tl.adjust) == {0} and tl.exposed_s == 0.0 and tl.host_bytes == 0
    assert offloaded_curve(problem, SAVED, set(), HostLink(1.0, 1.0))[0] == simulate_plan(problem, SAVED)
    with pytest.raises(ValueError, match="not saved"):
        offload_timeline(problem, {"a"}, {"b"}, HostLink(1.0, 1.0))


def _plan(saved, offloaded):
    return Plan(frozenset(saved), frozenset(), 0, 0.0, "test", Status.HEURISTIC, offloaded=frozenset(offloaded))


def test_errors_name_what_cannot_be_offloaded():
    problem = Problem((
        Node("x", IN),
        Node("a", F, ("x",), 100, cost=1.0),
        Node("v", F, ("a",), 100, storage="a"),  # a view of a
        Node("w", F, ("a",), 300, cost=1.0, offload_ban="non-contiguous (torch's pass refuses it)"),
        Node("g", B, ("v", "w", "x"), 100),
    ), backward_outputs=frozenset({"g"}))
    assert offload_errors(problem, _plan({"a", "w"}, {"a"})) == []
    assert "not saved" in offload_errors(problem, _plan({"w"}, {"a"}))[0]
    assert "non-contiguous" in offload_errors(problem, _plan({"w"}, {"w"}))[0]
    assert "another saved value" in offload_errors(problem, _plan({"a", "v"}, {"a"}))[0]
    assert "graph input" not in offload_errors(problem, _plan({"x"}, {"x"}))[0]  # no ban recorded: role
    assert "cap" in offload_errors(problem, _plan({"a"}, {"a"}), HostLink(1.0, 1.0, host_bytes=99))[0]
    assert host_bytes(problem, {"a", "v"}) == 100  # one storage, counted once
    assert offload_candidates(problem, HostLink(1.0, 1.0, min_bytes=100)) == ["a"]
    assert offload_candidates(problem, HostLink(1.0, 1.0, min_bytes=101)) == []


def test_link_presets():
    assert link_for("H100").d2h == 50e9 and link_for("a100").h2d == 25e9 and link_for("v100").d2h == 12e9
    assert math.isclose(link_for("h100").d2h / link_for("v100").d2h, 50 / 12)
    with pytest.raises(ValueError, match="no host-link preset"):
        link_for("tpu")
    with pytest.raises(ValueError, match="> 0"):
        HostLink(0.0, 1.0)


def test_device_profiles_carry_the_link():
    pytest.importorskip("torch")  # opt_remat.costs and .offload are the torch side's
    from opt_remat.costs import get_profile
    from opt_remat.offload import host_link
    assert host_link("h100") == link_for("h100")
    assert get_profile({"peak_flops": 1e12, "bandwidth": 1e11, "host_bandwidth": 7e9}).host_bandwidth == 7e9
    assert host_link({"peak_flops": 1e12, "bandwidth": 1e11, "host_bandwidth": 7e9}, host_bytes=5).host_bytes == 5
    with pytest.raises(ValueError, match="no host_bandwidth"):
        host_link({"peak_flops": 1e12, "bandwidth": 1e11})


def test_plan_files_keep_the_offloaded_values():
    from solvers import plan_from_saved
    from opt_remat.formats.plan_file import apply_plan, graph_entry, values_of_problem
    problem = _problem()
    plan = plan_from_saved(problem, SAVED, solver="test", status=Status.HEURISTIC)
    values = values_of_problem(problem)
    assert "offloaded" not in graph_entry(problem, plan, values, "g")
    entry = graph_entry(problem, _with(plan, {"b", "a"}), values, "g")
    assert entry["offloaded"] == ["a", "b"]
    assert apply_plan(entry, problem, values).offloaded == {"a", "b"}


def _with(plan, offloaded):
    from dataclasses import replace
    return replace(plan, offloaded=frozenset(offloaded))
