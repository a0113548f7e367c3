"""Exhaustive search over saved sets: the reference that exact solvers are tested against."""

from __future__ import annotations

import itertools
import time

from solvers.problem import Plan, Problem, Status, plan_from_saved, recompute_closure


class Enumeration:
    """Every valid saved set of a problem, enumerated once: ``best(budget)`` then answers any
    number of budgets (tests ask several of one problem, and the enumeration is the slow part)."""

    def __init__(self, problem: Problem, *, max_candidates: int = 18) -> None:
        start = time.perf_counter()
        choices = [n.name for n in problem.candidates if problem.can_save(n.name)]
        if len(choices) > max_candidates:
            raise ValueError(f"brute force over {len(choices)} candidates is too slow (max {max_candidates})")
        self.problem = problem
        self.rows: list[tuple[float, int, frozenset[str]]] = []  # (recompute cost, saved bytes, saved)
        for r in range(len(choices) + 1):
            for combo in itertools.combinations(choices, r):
                saved = frozenset(combo)
                recomputed, errors = recompute_closure(problem, saved)
                if not errors:
                    self.rows.append((problem.recompute_cost(recomputed), problem.saved_bytes(saved), saved))
        self.seconds = time.perf_counter() - start

    def best(self, budget: int | None = None, lam: float | None = None) -> Plan | None:
        """As ``brute_force(problem, budget=..., lam=...)``."""
        best_key: tuple[float, float] | None = None
        best_saved: frozenset[str] | None = None
        for cost, mem, saved in self.rows:
            if lam is not None:
                key = (sum(self.problem.save_weight(s) for s in saved) + lam * cost, 0.0)
            else:
                if budget is not None and mem > budget:
                    continue
                key = (cost, float(mem))
            if best_key is None or key < best_key:
                best_key, best_saved = key, saved
        if best_saved is None:
            return None
        assert best_key is not None
        return plan_from_saved(self.problem, best_saved, solver="brute-force", status=Status.OPTIMAL,
                               solve_time_s=self.seconds, objective=best_key[0], bound=best_key[0],
                               budget=budget)


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
    return Enumeration(problem, max_candidates=max_candidates).best(budget, lam)
