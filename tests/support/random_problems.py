"""Random small problems for tests: layered DAGs shaped like training graphs."""

from __future__ import annotations

import random
from dataclasses import replace

from solvers.problem import Node, Problem, Role


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
    multi_output_prob: float = 0.0,
) -> Problem:
    """A random problem: inputs, a forward DAG, then backward nodes reading forward values (with
    ``multi_output_prob``, some of them multi-output ops whose two outputs their call allocates,
    as ``convolution_backward``'s)."""
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
        if multi_output_prob and rng.random() < multi_output_prob:
            nodes.append(Node(f"b{j}", Role.BACKWARD, tuple(sorted(ins)), bytes=0))
            for out in range(2):
                nodes.append(Node(f"b{j}_{out}", Role.BACKWARD, (f"b{j}",), bytes=rng.randint(1, 4) * 16,
                                  allocated_by=f"b{j}"))
            backward_names.append(f"b{j}_1")
            continue
        nodes.append(Node(f"b{j}", Role.BACKWARD, tuple(sorted(ins)), bytes=16))
        backward_names.append(f"b{j}")
    # a must_recompute value whose inputs are all banned forward values is still fine: the model
    # allows recomputing from saved banned values; a banned+must_recompute node is infeasible if read
    fixed = [n if not (n.banned and n.must_recompute) else replace(n, must_recompute=False)
             for n in nodes]
    return Problem(tuple(fixed), name=f"random-{seed}")


def repeated_problem(seed: int, *, layers: int = 4, per_layer: int = 5, reads: int = 2,
                     view_prob: float = 0.2, ban_prob: float = 0.1) -> Problem:
    """``layers`` copies of one random block (a forward chain with its weight input, and a
    backward block reading some of its values), like a transformer's joint graph."""
    rng = random.Random(seed)
    # the block: per value (inputs as offsets into the block, -1 = the block's input, "w" = weight)
    block = []
    for i in range(per_layer):
        pool = [-1] + list(range(i))
        ins = sorted(set(rng.sample(pool[-3:], k=min(len(pool[-3:]), rng.randint(1, 2)))))
        view = i > 0 and rng.random() < view_prob
        block.append({"ins": [i - 1] if view else ins, "weight": not view and rng.random() < 0.5,
                      "view": view, "bytes": rng.randint(1, 8) * 16, "cost": float(rng.randint(1, 9)),
                      "banned": rng.random() < ban_prob})
    read = sorted(rng.sample(range(per_layer), k=min(reads, per_layer)))
    nodes = [Node("x", Role.INPUT, bytes=64)]
    prev = "x"
    names: list[list[str]] = []
    for layer in range(layers):
        nodes.append(Node(f"w{layer}", Role.INPUT, bytes=32))
        here: list[str] = []
        for i, spec in enumerate(block):
            ins = [prev if j == -1 else here[j] for j in spec["ins"]]
            if spec["weight"]:
                ins.append(f"w{layer}")
            storage = nodes[-1].storage_id if spec["view"] else None
            name = f"l{layer}_{i}"
            nodes.append(Node(name, Role.FORWARD, tuple(ins), bytes=spec["bytes"] // (4 if spec["view"] else 1),
                              storage=storage, cost=0.0 if spec["view"] else spec["cost"],
                              banned=spec["banned"] and not spec["view"]))
            here.append(name)
        names.append(here)
        prev = here[-1]
    grad = prev
    for layer in reversed(range(layers)):
        for j, i in enumerate(read):
            name = f"g{layer}_{j}"
            nodes.append(Node(name, Role.BACKWARD, (grad, names[layer][i]), bytes=16))
            grad = name
    return Problem(tuple(nodes), name=f"repeated-{seed}", forward_outputs=frozenset([prev]),
                   backward_outputs=frozenset([grad]))
