"""Random small problems for tests and benchmarks: layered DAGs shaped like training graphs."""

from __future__ import annotations

import random

from .problem import Node, Problem, Role


def random_problem(
    seed: int,
    *,
    n_forward: int = 8,
    n_inputs: int = 2,
    n_backward: int = 6,
    max_fanin: int = 3,
    ban_prob: float = 0.15,
    must_recompute_prob: float = 0.0,
    either_prob: float = 0.1,
    view_prob: float = 0.1,
    integer_costs: bool = True,
) -> Problem:
    """A random problem: inputs, a forward DAG, then backward nodes reading forward values."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    for i in range(n_inputs):
        nodes.append(Node(f"in{i}", Role.INPUT, bytes=rng.randint(1, 8) * 16))
    inputs_only = [n.name for n in nodes]
    forward_names: list[str] = []
    for i in range(n_forward):
        pool = inputs_only + forward_names
        if forward_names and rng.random() < either_prob:
            ins = tuple(sorted(set(rng.sample(inputs_only, k=min(len(inputs_only), rng.randint(1, 2))))))
            nodes.append(Node(f"e{i}", Role.EITHER, ins, bytes=rng.randint(1, 10) * 16,
                              cost=float(rng.randint(1, 9)) if integer_costs else rng.random()))
            continue
        k = rng.randint(1, min(max_fanin, len(pool)))
        # lean on recent values so that the DAG looks like a layered network
        recent = pool[-4:]
        ins = tuple(sorted(set(rng.sample(recent, k=min(k, len(recent))))))
        storage = None
        if forward_names and rng.random() < view_prob:
            base = nodes[-1]
            if base.role is Role.FORWARD:
                ins = (base.name,)
                storage = base.storage_id
        cost = 0.0 if storage is not None else (float(rng.randint(1, 9)) if integer_costs else rng.random())
        nodes.append(Node(
            f"f{i}", Role.FORWARD, ins,
            bytes=rng.randint(1, 10) * 16 if storage is None else rng.randint(1, 4) * 4,
            storage=storage, cost=cost,
            banned=rng.random() < ban_prob,
            must_recompute=rng.random() < must_recompute_prob,
        ))
        forward_names.append(f"f{i}")
    backward_names: list[str] = []
    candidates = [n.name for n in nodes]
    for j in range(n_backward):
        k = rng.randint(1, max_fanin)
        ins = set(rng.sample(candidates, k=min(k, len(candidates))))
        if backward_names:
            ins.add(backward_names[-1])
        nodes.append(Node(f"b{j}", Role.BACKWARD, tuple(sorted(ins)), bytes=16))
        backward_names.append(f"b{j}")
    # a must_recompute value whose inputs are all banned forward values is still fine: the model
    # allows recomputing from saved banned values; a banned+must_recompute node is infeasible if read
    fixed = [n if not (n.banned and n.must_recompute) else Node(**{**n.__dict__, "must_recompute": False})
             for n in nodes]
    return Problem(tuple(fixed), name=f"random-{seed}")
