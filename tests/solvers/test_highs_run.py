"""HiGHS as run_highs drives it (solvers.highs): each better solution it finds reaches the caller,
a solve stops early when asked (an event set from another thread, or Ctrl-C) keeping what it
found, and solves asking different thread counts all run. The program: a market-split instance
with slacks (Cornuejols and Dawande), which HiGHS improves on for a while and does not prove
within the tests' limits."""

import os
import random
import signal
import threading
import time

import numpy as np

from solvers import interrupt
from solvers.highs import Program, run_highs


def _market_split(seed: int, rows: int = 4, binaries: int = 34) -> Program:
    """``min sum(slack)`` with ``sum_j a_ij x_j + up_i - down_i = floor(sum_j a_ij / 2)``."""
    rng = random.Random(seed)
    n = binaries + 2 * rows
    a = [[rng.randrange(100) for _ in range(binaries)] for _ in range(rows)]
    cost = np.array([0.0] * binaries + [1.0] * (2 * rows))
    lines = []
    for i, row in enumerate(a):
        line = {j: float(c) for j, c in enumerate(row) if c}
        line[binaries + 2 * i] = 1.0
        line[binaries + 2 * i + 1] = -1.0
        lines.append(line)
    rhs = [float(sum(row) // 2) for row in a]
    return Program(cost=cost, lower=np.zeros(n), upper=np.array([1.0] * binaries + [np.inf] * (2 * rows)),
                   integer=[True] * binaries + [False] * (2 * rows), rows=lines, row_lower=rhs, row_upper=rhs)


def test_each_better_solution_reaches_the_caller_and_the_last_is_the_answer():
    p = _market_split(0)
    found = []
    got = run_highs(p, time_limit_s=3.0, on_solution=found.append)
    assert got.values is not None and found
    costs = [float(np.dot(p.cost, v)) for v in found]
    assert costs == sorted(costs, reverse=True)  # each better than the last
    assert found[-1] == got.values
    assert abs(costs[-1] - got.objective) < 1e-6


def test_a_set_event_stops_the_solve_with_what_it_found():
    p = _market_split(1)
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    began = time.perf_counter()
    got = run_highs(p, time_limit_s=60.0, stop=stop)
    timer.cancel()
    assert time.perf_counter() - began < 15.0
    assert got.detail["highs_status"] == "Interrupted by user"
    assert got.values is not None and got.bound is not None and got.bound <= got.objective + 1e-9


def test_ctrl_c_stops_a_solve_in_the_main_thread():
    p = _market_split(2)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    began = time.perf_counter()
    try:
        got = run_highs(p, time_limit_s=60.0)
        assert interrupt.requested()
    finally:
        timer.cancel()
        interrupt.clear()
    assert time.perf_counter() - began < 15.0
    assert got.detail["highs_status"] == "Interrupted by user"


def test_solves_asking_other_thread_counts_still_run():
    # HiGHS's thread pool is one per process: a solve asking another size used to fail at once
    # ("Not Set"), e.g. `milp` with `threads: 1` after a peak relaxation in the same process
    from solvers.mip_milp import run_highs_model
    from solvers.mip_model import build_model
    from support.random_problems import random_problem

    assert run_highs(_market_split(3), time_limit_s=0.5).values is not None
    model = build_model(random_problem(0, n_forward=6, n_backward=4))
    for threads in (1, 3):
        got = run_highs_model(model, dict(model.cost), None, None, time_limit_s=5.0, threads=threads,
                              gap_abs=1e-9)
        assert got.status == "optimal", (threads, got.detail)
