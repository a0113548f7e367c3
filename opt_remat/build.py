"""Stage 2: a joint forward+backward FX graph becomes a torch-free ``solvers.Problem``.

Nodes are classified as torch's partitioner does (``classify_nodes``); sizes come from
``meta["val"]`` (symbolic sizes through their hints), storages from the fake tensors' storages
(views share their base's), and bans from random ops, ops with side effects, collectives,
custom ops that are not pure functions (``_custom_op_ban``) and the ``recompute`` tags of
selective activation checkpointing (their conflicts with bans are settled in ``tags``). Each value
keeps the path of the module that made it, and the problem the class of every module on those
paths (``_module_stacks``): its repeated blocks are read from them (``solvers.blocks``).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx
from torch._functorch import partitioners as tp
from torch._inductor.fx_utils import get_node_storage
from torch.fx.experimental.symbolic_shapes import optimization_hint
from torch.utils.checkpoint import CheckpointPolicy

from solvers import Node, Problem, Role
from solvers.problem import Parameter

from .canonical import clean_source
from .costs import DeviceProfile, bytes_moved, get_profile, node_flops, roofline_seconds, tensor_bytes
from .errors import GraphError
from .offload import offload_ban, offload_request
from .prepare import classify, prepare_joint
from .rng_replay import STATE_META, dropout_is_off, rng_state_capture, state_nodes
from .tags import resolve_tag_conflicts


_ALLOWED_NAMESPACES = {"aten", "prims"}
_COLLECTIVE_NAMESPACES = {"_c10d_functional", "c10d_functional", "_dtensor", "c10d"}


def _impurity() -> Callable[[fx.Node], bool]:
    """``node.is_impure()``, looked up once per op overload within one build (its purity does not
    depend on the arguments)."""
    memo: dict[Any, bool] = {}

    def impure(node: fx.Node) -> bool:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            return node.is_impure()
        if target not in memo:
            memo[target] = node.is_impure()
        return memo[target]
    return impure


def _ban_reason(node: fx.Node, op_types: tp.OpTypes, replayable: bool = False,
                impure: Callable[[fx.Node], bool] = fx.Node.is_impure) -> str | None:
    if node.op != "call_function":
        return None
    target = node.target
    if target is operator.getitem:
        return None
    tag = node.meta.get("recompute")
    if tag in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE):
        return f"tagged {tag.name}"
    if (asked := offload_request(node)) is not None:
        return asked  # saved, to be offloaded: never recomputed
    seeded = isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags
    if target is rng_state_capture:
        return "RNG state (saved to replay a random op)"
    if not replayable and (op_types.is_random(node) or (seeded and not dropout_is_off(node))):
        if isinstance(target, torch._ops.OpOverload) and target.namespace not in _ALLOWED_NAMESPACES:
            return _custom_op_ban(target, seeded) or "random op"
        return "random op"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return "higher-order op"
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.is_mutable:
            return "mutating op"
        if target.namespace not in _ALLOWED_NAMESPACES:
            reason = _custom_op_ban(target, seeded)
            if reason is not None:
                return reason
    if not seeded and impure(node):  # FX calls seeded ops impure for their randomness alone
        return "side effects"
    return None


def _custom_op_ban(target: torch._ops.OpOverload, seeded: bool) -> str | None:
    """Why a non-aten op may not be recomputed, or None: as torch's partitioner treats custom ops,
    one with a functional schema (no mutated or aliased outputs), no ``nondeterministic_seeded``
    tag and no registered effects is a pure function of its inputs (HF's
    ``transformers.grouped_mm_fallback`` experts); collectives talk to other ranks."""
    name = f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    if target.namespace in _COLLECTIVE_NAMESPACES:
        return f"collective ({name})"
    if seeded:
        return f"custom op {name} tagged nondeterministic_seeded (random)"
    if any(r.alias_info is not None for r in target._schema.returns):
        return f"custom op {name} returns an alias of an input"
    return None  # effectful ones are banned by the side-effect check after this


def _raw_stack(node: fx.Node) -> tuple[tuple[Any, Any], ...]:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    return tuple(stack.values())


def _stack_of(raw_stack: tuple[tuple[Any, Any], ...]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for raw, cls in raw_stack:
        raw = str(raw)
        if raw.startswith("G['__import_"):  # an imported Python module's global: a function
            continue
        path = clean_source(raw)
        if out and not path.startswith(out[-1][0] + "."):
            continue
        name = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(cls)
        out.append((path, name))
    return tuple(out)


def _module_stacks() -> Callable[[fx.Node], tuple[tuple[str, str], ...]]:
    """A node's module stack: the modules it was made in, outermost first, as (path, class):
    ``("model.layers.0", "pkg.LlamaDecoderLayer")``; a backward node takes its forward node's.
    Entries that are not submodules of the entry before them are left out: functions wrapped as
    modules (HF's ``G['__import_...'].apply_rotary_pos_emb``) sit in the stack but own no weights
    or children. Worked out once per distinct stack within one build: thousands of nodes share a
    few hundred stacks, and cleaning the dynamo source names takes regexes."""
    memo: dict[tuple[tuple[Any, Any], ...], tuple[tuple[str, str], ...]] = {}

    def stack_of(node: fx.Node) -> tuple[tuple[str, str], ...]:
        raw = _raw_stack(node)
        found = memo.get(raw)
        if found is None:
            found = memo[raw] = _stack_of(raw)
        return found
    return stack_of


def _meta_val(node: fx.Node) -> Any:
    if "val" in node.meta:
        return node.meta["val"]
    if node.op == "placeholder":
        return None  # a None or opaque Python input: nothing to size, nothing to decide
    if node.op == "call_function":
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
                and len(node.target._schema.returns) == 0:
            return None
        raise GraphError(
            f"node {node.name!r} ({node.op} {node.target}) has no meta['val']: opt-remat cannot size "
            "it. Trace the graph with fake tensors (AOTAutograd and torch.compile do) or use "
            "solver='save-all' for this graph"
        )
    return None


def _role(node: fx.Node, info: tp.NodeInfo, inputs: set[fx.Node]) -> Role:
    if node in inputs or node.op == "get_attr":
        return Role.INPUT
    if node.target is rng_state_capture:
        return Role.FORWARD  # no inputs and no users in the graph, but only the forward has it
    if node in info.tangents_closure or node.op == "placeholder":
        return Role.BACKWARD  # tangents, backward seeds, and everything that reads them
    if info.is_required_fw(node):
        return Role.FORWARD
    return Role.EITHER


@dataclasses.dataclass
class _Storages:
    """Fake storages seen so far: the first node owning each, and its size in bytes."""
    owner: dict[int, str] = dataclasses.field(default_factory=dict)  # storage key -> node name
    nbytes: dict[str, int] = dataclasses.field(default_factory=dict)  # owner -> storage bytes

    def size(self, node: fx.Node, val: Any, role: Role) -> tuple[int, str | None, bool]:
        """A value's bytes, the storage it shares (None: its own) and whether it can be saved."""
        if isinstance(val, torch.Tensor):
            nbytes = tensor_bytes(val)
            key = get_node_storage(node)
            if key is None:
                return nbytes, None, True
            if key in self.owner:
                return nbytes, self.owner[key], True
            self.owner[key] = node.name
            try:
                self.nbytes[node.name] = max(
                    nbytes, int(optimization_hint(val.untyped_storage().nbytes(), fallback=nbytes)))
            except Exception:  # storages of some subclasses cannot be sized; use the tensor
                self.nbytes[node.name] = nbytes
            return nbytes, None, True
        if isinstance(val, (torch.SymInt, torch.SymBool)):
            return 0, None, True  # a symbolic int, saved as a Python int, not as activation memory
        if isinstance(val, torch.SymFloat):
            return 0, None, False  # torch never saves SymFloats either
        if isinstance(val, (list, tuple)) and role is not Role.INPUT:
            # multi-output ops are saved through their getitems; outputs nobody extracts still
            # exist for a moment: they count toward the peak
            taken = {u.args[1] for u in node.users if u.target is operator.getitem}
            return sum(tensor_bytes(v) for i, v in enumerate(val)
                       if i not in taken and isinstance(v, torch.Tensor)), None, False
        saveable = val is None or role is Role.INPUT or isinstance(val, (int, float, bool))
        return 0, None, saveable


def _node(node: fx.Node, val: Any, role: Role, storages: _Storages, state_of: Mapping[str, str],
          op_types: tp.OpTypes, impure: Callable[[fx.Node], bool], tagged_recompute: set[str],
          ban_reasons: dict[str, str], profile: DeviceProfile, module: str, fwd_outputs: set[fx.Node],
          backward_costs: bool) -> Node:
    """One value of the problem: sizes, bans (reasons into ``ban_reasons``), cost, module."""
    nbytes, storage, saveable = storages.size(node, val, role)
    extra_inputs: tuple[str, ...] = ()
    banned = must_recompute = False
    if role in (Role.FORWARD, Role.EITHER):
        # a random op of the forward is recomputable by replaying its state (its extra input);
        # one that could run in the backward instead would draw other numbers there: banned
        replayable = role is Role.FORWARD and node.name in state_of
        if replayable:
            extra_inputs = (state_of[node.name],)
        reason = _ban_reason(node, op_types, replayable, impure)
        banned = reason is not None
        if reason is not None:
            ban_reasons[node.name] = reason
        # conflicts with bans are settled once every input is known (``resolve_tag_conflicts``)
        must_recompute = tp.must_recompute(node)
        if not must_recompute and node.meta.get("recompute") is None and storage in tagged_recompute:
            # an untagged alias (detach, view) of a value tagged to be recomputed: saving it
            # would save the tagged value's storage, against its tag
            must_recompute = True
        if must_recompute and storage is None:
            tagged_recompute.add(node.name)
    cost = 0.0
    if node.op == "call_function" and (backward_costs or role in (Role.FORWARD, Role.EITHER)):
        view_like = storage is not None or node.target is operator.getitem
        cost = roofline_seconds(node_flops(node), bytes_moved(node, view_like), profile)
    return Node(
        name=node.name,
        role=role,
        inputs=tuple(dict.fromkeys(i.name for i in node.all_input_nodes)) + extra_inputs,
        bytes=nbytes,
        storage=storage,
        cost=cost,
        banned=banned,
        must_recompute=must_recompute,
        saveable=saveable,
        allocated_by=(node.args[0].name if node.target is operator.getitem
                      and isinstance(node.args[0], fx.Node) else None),
        op=(("rng_state" if node.target is rng_state_capture else str(node.target))
            if node.op == "call_function" else node.op),
        module=module,
        offload_ban=offload_ban(node, role, storage, forward_outputs=fwd_outputs, op_types=op_types),
    )


def parameters_of(joint_module: fx.GraphModule, input_roles: list[str] | None,
                  bwd_outputs: list[Any]) -> tuple[Parameter, ...]:
    """The trained parameters among the joint graph's primals (``param NAME`` in the capture's
    input roles), each with its gradient: AOTAutograd returns one gradient per primal, in order."""
    if not input_roles:
        return ()
    primals = [n for n in joint_module.graph.find_nodes(op="placeholder") if n.name.startswith("primals_")]
    out = []
    for i, (node, role) in enumerate(zip(primals, input_roles)):
        val = node.meta.get("val")
        if not role.startswith("param ") or not isinstance(val, torch.Tensor):
            continue
        grad = bwd_outputs[i] if i < len(bwd_outputs) and isinstance(bwd_outputs[i], fx.Node) else None
        numel = int(optimization_hint(val.numel(), fallback=0))
        dim0 = int(optimization_hint(val.shape[0], fallback=1)) if val.dim() else 1
        out.append(Parameter(node=node.name, path=role.removeprefix("param "), numel=numel, dim0=dim0,
                             grad=grad.name if grad is not None else None))
    return tuple(out)


def build_problem(
    joint_module: fx.GraphModule,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: list[int] | None = None,
    device: str | DeviceProfile | Mapping[str, Any] = "h100",
    count_input_bytes: bool = False,
    node_info: tp.NodeInfo | None = None,
    costs: str = "roofline",
    input_roles: list[str] | None = None,
    backward_costs: bool = False,
) -> Problem:
    """The save/recompute problem of a (prepared) joint graph; node names are the FX names.
    ``costs``: "roofline" (estimated from flops and bytes on ``device``'s profile) or "profile"
    (each recomputable op timed on the device its values live on, ``opt_remat.profile_costs``).
    ``input_roles`` (the capture's, per primal) name the parameters, for the rank's memory.
    ``backward_costs``: backward values get their roofline time too (what offload's transfers hide
    behind, ``solvers.offload``; ~15% of the build, so only when asked)."""
    if costs not in ("roofline", "profile"):
        raise ValueError(f"costs must be 'roofline' or 'profile', got {costs!r}")
    profile = get_profile(device)
    info = node_info or classify(joint_module, num_fwd_outputs, static_lifetime_input_indices)
    op_types = tp.get_default_op_list()
    impure = _impurity()
    inputs = set(info.inputs)
    fwd_outputs, bwd_outputs, _, _ = tp._extract_fwd_bwd_outputs(joint_module, num_fwd_outputs=num_fwd_outputs)
    bwd_out_nodes = {o for o in bwd_outputs if isinstance(o, fx.Node)}
    fwd_out_nodes = {o for o in fwd_outputs if isinstance(o, fx.Node)}

    nodes: list[Node] = []
    required: set[str] = set()
    ban_reasons: dict[str, str] = {}
    tagged_recompute: set[str] = set()  # storage owners tagged to be recomputed
    storages = _Storages()
    module_classes: dict[str, str] = {}
    timed: list[fx.Node] = []  # the ops "profile" measures
    state_of = {s.meta[STATE_META]: s.name for s in state_nodes(joint_module.graph)}  # random op -> state
    stack_of = _module_stacks()
    for node in joint_module.graph.nodes:
        if node.op == "output":
            continue
        role = _role(node, info, inputs)
        if role is not Role.BACKWARD and (node in info.required_bw_nodes or node in bwd_out_nodes):
            required.add(node.name)
        stack = stack_of(node)
        made = _node(node, _meta_val(node), role, storages, state_of, op_types, impure,
                     tagged_recompute, ban_reasons, profile, stack[-1][0] if stack else "", fwd_out_nodes,
                     backward_costs)
        nodes.append(made)
        module_classes.update(stack)
        if (costs == "profile" and node.op == "call_function" and role in (Role.FORWARD, Role.EITHER)
                and made.storage is None and node.target is not operator.getitem):
            timed.append(node)  # views cost nothing to recompute: not timed
    nodes = resolve_tag_conflicts(nodes, ban_reasons)
    if timed:
        from .profile_costs import profile_costs
        measured = profile_costs(timed)
        nodes = [dataclasses.replace(n, cost=measured[n.name]) if n.name in measured else n for n in nodes]
    return Problem(tuple(nodes), required=frozenset(required), storage_bytes=storages.nbytes,
                   count_input_bytes=count_input_bytes, name=joint_module.__class__.__name__,
                   forward_outputs=frozenset(n.name for n in fwd_out_nodes),
                   backward_outputs=frozenset(n.name for n in bwd_out_nodes),
                   module_classes=module_classes,
                   parameters=parameters_of(joint_module, input_roles, list(bwd_outputs)),
                   ban_reasons={n.name: ban_reasons[n.name] for n in nodes if n.banned and n.name in ban_reasons})


def problem_from_joint(joint: Any, *, device: str | DeviceProfile | Mapping[str, Any] = "h100",
                       rng_replay: bool = True, costs: str = "roofline") -> tuple[Any, Problem]:
    """A prepared copy of a captured ``opt_remat.capture.JointGraph`` (the graph plans are lowered
    on) and its problem: the capture -> problem stage in one call."""
    prepared = joint.copy()
    prepared.module = prepare_joint(prepared.module, rng_replay=rng_replay)
    problem = build_problem(prepared.module, num_fwd_outputs=prepared.num_fwd_outputs,
                            static_lifetime_input_indices=prepared.static_lifetime_input_indices,
                            device=device, costs=costs, input_roles=prepared.input_roles)
    return prepared, problem
