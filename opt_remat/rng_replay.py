"""Random ops recomputed exactly, by replaying the RNG state they drew from.

A random op (``rand``, ``bernoulli``, ``native_dropout``...) gives other numbers when it runs again,
so it may only be recomputed if the backward replays the generator state the forward used. Before
each replayable random op, ``insert_rng_states`` puts a node ``rng_state_capture`` into the joint
graph: the generator's state just before the op, a value of its real size (torch's CPU generator
state is 5056 bytes; a CUDA generator's is seed and offset, 16 bytes). ``build_problem`` makes the
random op recomputable with that state as an extra input and the state itself banned from
recomputation, so a solver that recomputes the op must save the state, which counts in the budget
and the peak like any saved value: the solver weighs saving the mask against saving the state.

Lowering uses torch's higher-order ops: ``route_replays`` makes each random op the plan recomputes
``run_with_rng_state(state, op, ...)`` (sets the state, draws, restores the generator), so that
torch's graph extraction saves the state and the backward replays it; ``fuse_rng_replay`` turns the
forward's copy into ``run_and_save_rng_state(op, ...)``, which reads the state right before the op
draws, in one op so that nothing can be scheduled between the two.
The forward draws exactly as without opt-remat, so gradients equal save-all's bit for bit.
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
import torch.fx as fx

STATE_META = "opt_remat_rng_state_for"  # on a state node: the name of the random op it belongs to
CUDA_STATE_BYTES = 16  # a CUDA (philox) generator state: seed and offset, 8 bytes each


def rng_state_capture(device: str) -> torch.Tensor:
    """The state of ``device``'s default generator (the target of the joint graph's state nodes;
    lowering replaces each by ``run_and_save_rng_state``, so it only runs if a graph is executed
    unlowered)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_rng_state(torch.device(device))
    return torch.get_rng_state()


def _device_of(val: Any) -> torch.device | None:
    for v in val if isinstance(val, (list, tuple)) else (val,):
        if isinstance(v, torch.Tensor):
            return v.device
    return None


def state_bytes(device: torch.device) -> int | None:
    """Bytes of the generator state replay saves for a random op on ``device``; None where torch's
    replay ops have no implementation we have checked (then the op stays banned)."""
    if device.type == "cpu":
        return int(torch.get_rng_state().numel())
    if device.type == "cuda":
        return CUDA_STATE_BYTES
    return None


def dropout_is_off(node: fx.Node) -> bool:
    """Attention ops are tagged random for their dropout; with dropout_p == 0 they draw nothing."""
    target = node.target
    assert isinstance(target, torch._ops.OpOverload)  # is_random_op's ops are overloads
    names = [a.name for a in target._schema.arguments]
    if "dropout_p" not in names:
        return False
    i = names.index("dropout_p")
    value = node.kwargs.get("dropout_p", node.args[i] if i < len(node.args) else
                            target._schema.arguments[i].default_value)
    return isinstance(value, (int, float)) and value == 0


def is_replayable(node: fx.Node) -> bool:
    """A seeded aten op that draws (not attention without dropout), with tensor outputs on a device
    whose generator state can be replayed."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    # prims.inductor_seeds is inductor's own tiny seed tensor: the values drawn from it are already
    # recomputable, and replaying it could never save bytes
    if target.namespace != "aten" or torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    if target._schema.is_mutable or dropout_is_off(node):
        return False  # in-place draws (bernoulli_, uniform_) write into an existing tensor
    device = _device_of(node.meta.get("val"))
    return device is not None and state_bytes(device) is not None


def _reads_tangents(graph: fx.Graph) -> set[fx.Node]:
    closure: set[fx.Node] = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and "tangents" in str(node.target)) or \
                any(i in closure for i in node.all_input_nodes):
            closure.add(node)
    return closure


def insert_rng_states(joint_module: fx.GraphModule) -> list[fx.Node]:
    """Insert a state node before every replayable random op of the forward; returns them."""
    graph = joint_module.graph
    backward = _reads_tangents(graph)
    inserted = []
    for node in list(graph.nodes):
        if node in backward or not is_replayable(node):
            continue
        val = node.meta["val"]
        first = next(v for v in (val if isinstance(val, (list, tuple)) else (val,)) if isinstance(v, torch.Tensor))
        device = first.device
        mode = getattr(first, "fake_mode", None)
        with mode if mode is not None else torch._subclasses.fake_tensor.FakeTensorMode():
            size = state_bytes(device)
            assert size is not None  # is_replayable checked the device
            state_val = torch.empty(size, dtype=torch.uint8)
        with graph.inserting_before(node):
            state = graph.create_node("call_function", rng_state_capture, (str(device),),
                                      name=f"rng_state_{node.name}")
        state.meta["val"] = state_val
        state.meta[STATE_META] = node.name
        inserted.append(state)
    # not recompiled: the states have no users, so the module's code computes the same
    return inserted


def state_nodes(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is rng_state_capture]


def route_replays(joint_module: fx.GraphModule, saved: set[str], recomputed: set[str]) -> fx.GraphModule:
    """A copy of the joint graph in which every random op the plan recomputes and saves the state of
    reads it: ``run_with_rng_state(state, op, ...)``, so graph extraction saves the state and the
    backward replays it (the forward's copy is fused back into a plain draw by ``fuse_rng_replay``).
    The graph itself is returned when nothing is replayed. A random op recomputed without its state
    (only a foreign plan does that: torch's baseline; the problem model forbids it) is lowered as
    the plan says, a fresh draw, as torch's partitioner does."""
    states = {s.meta[STATE_META]: s for s in state_nodes(joint_module.graph)}
    replayed = [name for name in states if name in recomputed and states[name].name in saved]
    if not replayed:
        return joint_module
    joint_module = copy.deepcopy(joint_module)  # the caller may lower other plans on its graph
    by_name = {n.name: n for n in joint_module.graph.nodes}
    run_with = torch._prims.rng_prims.run_with_rng_state
    for name in replayed:
        op = by_name[name]
        state = by_name[states[name].name]
        op.args = (state, op.target, *op.args)  # in place: the name, meta and users stay
        op.target = run_with
    joint_module.recompile()
    return joint_module


def fuse_rng_replay(fw_module: fx.GraphModule) -> fx.GraphModule:
    """``fuse_rng_replay_graph`` on a forward module, recompiled if it changed."""
    if fuse_rng_replay_graph(fw_module.graph):
        fw_module.recompile()
    return fw_module


def fuse_rng_replay_graph(graph: fx.Graph) -> bool:
    """In the forward, ``run_with_rng_state(rng_state_capture(), op, ...)`` (which would not advance
    the generator) becomes ``run_and_save_rng_state(op, ...)``: the draw save-all makes, and the
    state just before it, in one op so nothing can be scheduled between the two. True if changed."""
    run_with = torch._prims.rng_prims.run_with_rng_state
    run_and_save = torch._prims.rng_prims.run_and_save_rng_state
    fused = False
    for op in list(graph.find_nodes(op="call_function", target=run_with)):
        state = op.args[0]
        if not (isinstance(state, fx.Node) and state.target is rng_state_capture):
            continue
        # named after the op, not by the graph's name counters, so that they do not depend on
        # which names the graph had used (the fast and torch's extractions give the same code)
        with graph.inserting_before(op):
            pair = graph.create_node("call_function", run_and_save, tuple(op.args[1:]), dict(op.kwargs),
                                     name=f"run_and_save_{op.name}")
            got_state = graph.create_node("call_function", operator.getitem, (pair, 0), name=f"{state.name}_saved")
            got_out = graph.create_node("call_function", operator.getitem, (pair, 1), name=f"{op.name}_drawn")
        pair.meta["val"] = (state.meta["val"], op.meta.get("val"))
        got_state.meta = {k: v for k, v in state.meta.items() if k != STATE_META}
        got_out.meta = dict(op.meta)
        op.replace_all_uses_with(got_out)
        graph.erase_node(op)
        state.replace_all_uses_with(got_state)
        graph.erase_node(state)
        fused = True
    for state in graph.find_nodes(op="call_function", target=rng_state_capture):
        if not state.users:  # captures no replay reads (none expected): dropped
            graph.erase_node(state)
            fused = True
    return fused
