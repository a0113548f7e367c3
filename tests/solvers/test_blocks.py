"""Repeated blocks read from module paths (``solvers.blocks``), on hand-made problems: which modules
are blocks, what enters them, and the checkpointing, symmetry and layer split built on them,
cross-checked against the graph-only heuristics where those work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from solvers import Node, Problem, Role, check_plan
from solvers.baselines import boundary_groups, uniform_checkpoint
from solvers.blocks import find_blocks, graph_boundaries, narrow_cut_values
from solvers.peak.layers import find_layers
from solvers.symmetry import find_repeated

F, B, IN = Role.FORWARD, Role.BACKWARD, Role.INPUT


def _model(n_blocks: int = 4, *, context: bool = True, block: str = "layers.{}",
           cls: str = "pkg.Block", classes: dict[str, str] | None = None,
           extra_first: bool = False, experts: int = 0) -> Problem:
    """A pre-norm residual stack: an embedding, blocks (norm, mlp, residual add), a head and a
    loss, and a backward through all of it. ``context``: the norms and the head read a weight
    input and the mlps a table made before the blocks (paths that bypass the residual stream)."""
    nodes = [Node("x", IN, bytes=64), Node("w", IN, bytes=64),
             Node("emb", F, ("x", "w"), bytes=100, cost=1.0, module="embed")]
    mods = {"embed": "pkg.Embedding", "head": "pkg.Linear", "rope": "pkg.Rope"}
    if context:
        nodes.append(Node("rope", F, ("x",), bytes=10, cost=1.0, module="rope"))
    prev = "emb"
    inputs_of: dict[int, str] = {}
    for b in range(n_blocks):
        path = block.format(b)
        mods.update({path: cls, f"{path}.norm": "pkg.Norm", f"{path}.mlp": "pkg.MLP"})
        inputs_of[b] = prev
        nodes.append(Node(f"n{b}", F, (prev, "w") if context else (prev,), bytes=100, cost=1.0,
                          module=f"{path}.norm"))
        if extra_first and b == 0:  # a value every block reads, made in the first block only
            nodes.append(Node("shared", F, ("x",), bytes=10, cost=1.0, module=f"{path}.mlp"))
        mlp_in = (f"n{b}", "shared") if extra_first else (f"n{b}",)
        nodes.append(Node(f"m{b}", F, mlp_in + (("rope",) if context else ()), bytes=400, cost=4.0,
                          module=f"{path}.mlp"))
        for e in range(experts):
            mods[f"{path}.mlp.experts.{e}"] = "pkg.Expert"
            nodes.append(Node(f"e{b}_{e}", F, (f"m{b}",), bytes=50, cost=1.0,
                              module=f"{path}.mlp.experts.{e}"))
        nodes.append(Node(f"r{b}", F, (prev, f"m{b}") + tuple(f"e{b}_{e}" for e in range(experts)),
                          bytes=100, cost=1.0, module=path))
        prev = f"r{b}"
    nodes += [Node("logits", F, (prev, "w") if context else (prev,), bytes=300, cost=3.0, module="head"),
              Node("lse", F, ("logits",), bytes=4, cost=1.0, module="head"),
              Node("loss", F, ("lse",), bytes=4, cost=1.0),
              Node("g_head", B, ("logits", prev), bytes=100, module="head")]
    grad = "g_head"
    for b in reversed(range(n_blocks)):
        path = block.format(b)
        nodes += [Node(f"gm{b}", B, (grad, f"n{b}", f"m{b}"), bytes=100, module=f"{path}.mlp"),
                  Node(f"gn{b}", B, (f"gm{b}", inputs_of[b]), bytes=100, module=f"{path}.norm")]
        grad = f"gn{b}"
    nodes.append(Node("g_w", B, (grad, "x"), bytes=64, module="embed"))
    return Problem(tuple(nodes), name="stack", forward_outputs=frozenset(["loss"]),
                   backward_outputs=frozenset(["g_w"]),
                   module_classes=mods if classes is None else classes)


def test_blocks_entries_and_exit() -> None:
    p = _model(4)
    blocks = find_blocks(p)
    assert blocks is not None
    assert blocks.paths == ("layers.0", "layers.1", "layers.2", "layers.3")
    assert blocks.module_class == "pkg.Block"
    # the shared table enters every block: context, not a boundary
    assert blocks.entries == (("emb",), ("r0",), ("r1",), ("r2",))
    assert blocks.exit == ("r3",)
    assert blocks.boundaries == [("emb",), ("r0",), ("r1",), ("r2",), ("r3",)]
    # backward values belong to their forward value's block
    assert {v: blocks.block_of[v] for v in ("n2", "m2", "r2", "gm2", "gn2")} == dict.fromkeys(
        ("n2", "m2", "r2", "gm2", "gn2"), 2)
    assert "emb" not in blocks.block_of and "logits" not in blocks.block_of


def test_without_module_paths_the_graph_heuristics_decide() -> None:
    p = _model(4)
    bare = replace(p.with_nodes([replace(n, module="") for n in p.nodes]), module_classes={})
    assert find_blocks(bare) is None
    groups, mode = boundary_groups(bare)
    assert mode != "modules" and groups == [(b,) for b in graph_boundaries(bare)[0]]
    # file ids as module strings (published graph files) and no classes: no blocks either
    ids = replace(p.with_nodes([replace(n, module=str(i)) for i, n in enumerate(p.nodes)]),
                  module_classes={})
    assert find_blocks(ids) is None


def test_modules_agree_with_dominators_where_those_work() -> None:
    # without the shared table every path runs through the residual stream: the graph's
    # dominators are the block outputs, the same checkpoints the module paths give
    p = _model(5, context=False)
    groups, mode = boundary_groups(p)
    assert mode == "modules"
    dominators, how = graph_boundaries(p)
    assert how == "dominators"
    # (the head's values dominate the loss too; they lie in no block)
    assert [v for g in groups for v in g] == [v for v in dominators if v not in ("logits", "lse")]
    # with paths around the stream, only the head's values dominate the loss; the module paths
    # still find the stream
    assert graph_boundaries(_model(5)) == (["logits", "lse"], "dominators")
    assert boundary_groups(_model(5)) == ([("emb",), ("r0",), ("r1",), ("r2",), ("r3",), ("r4",)], "modules")


@pytest.mark.parametrize("every", [1, 2, 3])
def test_checkpoint_every_k_saves_block_inputs_only(every: int) -> None:
    p = _model(6)
    plan = uniform_checkpoint(p, None, every=every)
    assert check_plan(p, plan).valid
    groups = find_blocks(p).boundaries
    chosen = {v for g in groups[every - 1::every] for v in g}
    saved = {v for v in plan.saved if p.by_name[v].role is not IN}
    assert saved == chosen  # nothing inside the blocks, nothing of the head
    assert plan.extra["boundary_mode"] == "modules" and plan.extra["n_boundaries"] == 7


def test_indexed_names_and_what_is_not_a_block() -> None:
    named = _model(3, block="encoder.layers.encoder_layer_{}")
    assert find_blocks(named).paths == tuple(f"encoder.layers.encoder_layer_{i}" for i in range(3))
    # "layer1", "fc2": names, not indices
    assert find_blocks(_model(3, block="layer{}")) is None
    # indices that skip one (another class between them) are not one container
    p = _model(3)
    gap = dict(p.module_classes, **{"layers.1": "pkg.Other"})
    assert find_blocks(replace(p, module_classes=gap)) is None
    # a single indexed module is no repetition
    assert find_blocks(_model(1)) is None


def _moved(p: Problem, moves: dict[str, str], **classes: str) -> Problem:
    """``p`` with its modules moved (``moves``: old path -> new path, children going along) and
    ``classes`` added to its module classes."""
    def move(path: str) -> str:
        for old, new in moves.items():
            if path == old or path.startswith(old + "."):
                return new + path[len(old):]
        return path

    return replace(p.with_nodes([replace(n, module=move(n.module)) for n in p.nodes]),
                   module_classes={**{move(k): v for k, v in p.module_classes.items()}, **classes})


def test_outermost_container_wins_and_parents_merge() -> None:
    # experts inside each layer are indexed too; the layers are the blocks
    blocks = find_blocks(_model(3, experts=2))
    assert blocks.paths == ("layers.0", "layers.1", "layers.2")
    assert blocks.block_of["e1_1"] == 1
    # a ResNet's stages: blocks indexed under two parents, one class, one depth
    p = _model(4, block="stage.{}")
    resnet = _moved(p, {f"stage.{b}": f"stages.s{b // 2 + 1}.{b % 2}" for b in range(4)})
    assert find_blocks(resnet).paths == ("stages.s1.0", "stages.s1.1", "stages.s2.0", "stages.s2.1")
    # stages indexed too, but torch's Sequential: the blocks inside them are the blocks
    moves = {f"stage.{b}": f"stages.{b // 2}.{b % 2}" for b in range(4)}
    seq = "torch.nn.modules.container.Sequential"
    effnet = _moved(p, moves, **{"stages.0": seq, "stages.1": seq})
    assert find_blocks(effnet).paths == ("stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1")
    # with a class of its own the stage is the block: the outermost
    own = _moved(p, moves, **{"stages.0": "pkg.Stage", "stages.1": "pkg.Stage"})
    assert find_blocks(own).paths == ("stages.0", "stages.1")


def test_interleaved_modules_are_not_a_chain() -> None:
    # two indexed branches whose forward values interleave run side by side: not blocks
    nodes = [Node("x", IN, bytes=8)]
    for step in range(3):
        for br in range(2):
            prev = "x" if step == 0 else f"b{br}_{step - 1}"
            nodes.append(Node(f"b{br}_{step}", F, (prev,), bytes=8, cost=1.0, module=f"branches.{br}"))
    nodes += [Node("out", F, ("b0_2", "b1_2"), bytes=8, cost=1.0),
              Node("g", B, ("b0_1", "b1_1", "out"), bytes=8)]
    p = Problem(tuple(nodes), module_classes={"branches.0": "pkg.Branch", "branches.1": "pkg.Branch"})
    assert find_blocks(p) is None


def test_symmetry_and_layers_follow_the_blocks() -> None:
    p = _model(5, extra_first=True)  # the first block holds one value more than the others
    sym = find_repeated(p)
    assert sym.layers == 5
    # one group per position of the block, each across the five blocks, in block order
    assert sorted(sym.groups) == sorted([[f"{k}{b}" for b in range(5)] for k in "nmr"])
    layers = find_layers(p)
    assert layers is not None
    assert layers.slots == tuple((f"n{b}", f"m{b}", f"r{b}") for b in range(5))
    assert layers.layer_of["shared"] == 0 and layers.layer_of["logits"] == 4
    assert "emb" not in layers.layer_of
    assert find_layers(_model(3)) is None  # too few layers to mix


def test_narrow_cuts_within_the_blocks() -> None:
    # the loss's statistics are narrower than any cut between blocks: over the whole forward the
    # narrowest cut sits in the head, within the blocks it is the residual stream (and the exit)
    p = _model(4, context=False)
    assert narrow_cut_values(p) == ["lse"]
    assert narrow_cut_values(p, within=find_blocks(p).span) == ["r0", "r1", "r2", "r3"]
