"""Exhaustive search over saved sets: the reference that exact solvers are tested against."""

from __future__ import annotations

import itertools
import time

from .problem import Plan, Problem, Status, plan_from_saved, recompute_closure


def brute_force(
    problem: Problem,
    *,
    budget: int | None = None,
    lam: float | None = None,
    max_candidates: int = 18,
) -> Plan | None:
    """The best plan by enumeration.

    With ``lam`` set, minimizes ``per-node saved bytes + lam * recompute cost`` (the min-cut's
    objective, ``Problem.save_weight`` per saved value); otherwise minimizes recompute cost
    under ``budget`` on storage-aware saved bytes, ties broken by fewer saved bytes.
    Returns None when no plan is feasible.
    """
    start = time.perf_counter()
    choices = [n.name for n in problem.candidates if problem.can_save(n.name)]
    if len(choices) > max_candidates:
        raise ValueError(f"brute force over {len(choices)} candidates is too slow (max {max_candidates})")
    best_key: tuple[float, float] | None = None
    best_saved: frozenset[str] | None = None
    for r in range(len(choices) + 1):
        for combo in itertools.combinations(choices, r):
            saved = frozenset(combo)
            recomputed, errors = recompute_closure(problem, saved)
            if errors:
                continue
            cost = problem.recompute_cost(recomputed)
            if lam is not None:
                key = (sum(problem.save_weight(s) for s in saved) + lam * cost, 0.0)
            else:
                mem = problem.saved_bytes(saved)
                if budget is not None and mem > budget:
                    continue
                key = (cost, float(mem))
            if best_key is None or key < best_key:
                best_key, best_saved = key, saved
    if best_saved is None:
        return None
    assert best_key is not None
    return plan_from_saved(problem, best_saved, solver="brute-force", status=Status.OPTIMAL,
                           solve_time_s=time.perf_counter() - start, objective=best_key[0],
                           bound=best_key[0], budget=budget)


