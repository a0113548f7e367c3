"""Offline plans used in training: a LLaMA-style model planned on a fake capture (no weights) and the
real model trained with that plan through ``opt_remat.backend(plan=...)``, inductor and eager."""

from __future__ import annotations

import json

import pytest
import torch

import opt_remat
from opt_remat.errors import PlanMismatchError
from opt_remat.formats.plan_file import read_plan_file
from opt_remat.memory import PeakMeter
from opt_remat.models import Llama
from opt_remat.solve import choose_peak_plan, choose_plan, resolve_budget
from opt_remat.verify import compare_steps, default_loss, save_all_backend
from solvers.liveness import simulate_plan

SEQ = 32


def _factory(layers: int = 2):
    return lambda: Llama(layers=layers, d_model=64, heads=4, seq=SEQ)


def _tokens(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 256, (batch, SEQ), generator=torch.Generator().manual_seed(3))


def _settings(compiler: str) -> dict:
    return {"compiler": compiler, "decompositions": "inductor"}


LLAMA = """\
model:
  factory: opt_remat.models:llama
  kwargs: {{layers: 2, d_model: 64, heads: 4, seq: {seq}}}
  inputs: [{{shape: [2, {seq}], dtype: int64, low: 0, high: 256}}]
capture: {{compiler: {compiler}, decompositions: inductor, meta: true}}
budgets: [0.3]
solvers: [cpsat]
"""


def write_plans(path, config: str, solve) -> tuple[list, list]:
    """A plan file as ``opt-remat solve`` writes one: the configuration's graphs captured
    (``runs.materialize_all``), each solved by ``solve(problem)``, written by ``runs.plan_files.write_plan``."""
    from opt_remat.runs import load_config, materialize_all
    from opt_remat.runs.plan_files import write_plan

    path.with_suffix(".yaml").write_text(config)
    cfg = load_config(path.with_suffix(".yaml"))
    works = materialize_all(cfg)
    plans = [solve(w.problem) for w in works]
    write_plan(path, cfg, works, plans)
    return works, plans


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Per compiler, plan files solved by cpsat on a fake capture: at a saved-byte budget and at a
    peak budget, with the problem they were solved on."""
    folder = tmp_path_factory.mktemp("plans")
    out = {}
    for compiler in ("eager", "inductor"):
        for kind in ("saved", "peak"):
            def solve(problem, kind=kind):
                if kind == "saved":
                    return choose_plan(problem, "cpsat", resolve_budget(problem, 0.3), {"time_limit_s": 4})
                save_all_peak = simulate_plan(problem, choose_plan(problem, "save-all", None).saved).peak
                return choose_peak_plan(problem, "cpsat", int(0.8 * save_all_peak), None, {"time_limit_s": 4})

            path = folder / f"{compiler}-{kind}.json"
            [work], [plan] = write_plans(path, LLAMA.format(seq=SEQ, compiler=compiler), solve)
            weights = [n for n in work.prepared.module.graph.find_nodes(op="placeholder")
                       if isinstance(n.meta["val"], torch._subclasses.FakeTensor)]
            assert weights  # traced with fake tensors: nothing was allocated
            out[compiler, kind] = (path, plan, work.problem)
    return out


def _train(model, x, backend):
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    torch.manual_seed(1)
    loss = default_loss(compiled(x))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), grads


def _saved_for_backward_bytes(model, x, backend) -> int:
    """Bytes of the tensors the compiled forward really hands to autograd for the backward (each
    storage once; parameters and inputs excluded, as the plan's saved bytes exclude them)."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), x]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = compiled(x)
    default_loss(out).backward()
    return sum(seen.values())


@pytest.mark.parametrize("kind", ["saved", "peak"])
# inductor's compile is the slow part; the eager runs check the same plans
@pytest.mark.parametrize("compiler", [pytest.param("inductor", marks=pytest.mark.slow), "eager"])
def test_fake_capture_plan_trains_the_real_model(plans, compiler, kind):
    path, plan, problem = plans[compiler, kind]
    doc = read_plan_file(path)
    torch.manual_seed(0)
    model, x = _factory()(), _tokens()
    be = opt_remat.backend(plan=str(path), compiler=compiler,
                           **({"decompositions": "inductor"} if compiler == "eager" else {}))
    loss, grads = _train(model, x, be)

    # exactly the plan's saved set: mapped value for value, and what the forward hands over
    [rec] = be.partitioner.history
    ids = {v["name"]: v["id"] for v in rec.values}
    plan_ids = {v[0]: v[1] for v in doc["graphs"][0]["values"]}
    assert {ids[n] for n in rec.plan.saved} == {plan_ids[n] for n in doc["graphs"][0]["saved"]}
    fw_out = rec.fw_module.graph.find_nodes(op="output")[0].args[0]
    assert {n.name for n in fw_out[rec.num_fwd_outputs:]} == set(rec.plan.saved)
    assert rec.plan.saved_bytes == plan.saved_bytes and rec.plan.recompute_cost == pytest.approx(plan.recompute_cost)

    # save-all's gradients, with the same compiler
    ref_be = save_all_backend("inductor") if compiler == "eager" else opt_remat.backend("save-all", compiler="inductor")
    ref = _train(model, x, ref_be)
    check = compare_steps((loss, grads), ref)
    assert check.ok and check.max_rel_error <= 1e-5

    # the bytes really saved for the backward, and (graphs run as they are) the step's peak
    measured = _saved_for_backward_bytes(model, x, opt_remat.backend(plan=str(path), compiler=compiler, **(
        {"decompositions": "inductor"} if compiler == "eager" else {})))
    assert abs(measured - plan.saved_bytes) <= 0.01 * plan.saved_bytes
    if compiler == "eager":  # inductor's generated code cannot be metered op by op
        meter = PeakMeter()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=opt_remat.backend(plan=str(path), compiler=meter,
                                                                  decompositions="inductor"))
        torch.manual_seed(1)
        compiled(x)
        meter.reset()
        base = meter.current
        torch.manual_seed(1)
        default_loss(compiled(x)).backward()
        predicted = simulate_plan(problem, plan.saved).peak
        assert abs((meter.peak - base) - predicted) <= 0.01 * predicted


def _refusal(model, x, backend) -> str:
    """The refusal's message; it reaches the caller of the compiled model as the exported
    opt_remat.PlanMismatchError itself, not wrapped in torch's BackendCompilerFailed."""
    with pytest.raises(opt_remat.PlanMismatchError) as info:
        _train(model, x, backend)
    assert isinstance(info.value, PlanMismatchError) and opt_remat.unwrap(info.value) is info.value
    return str(info.value)


def test_plan_refused_for_other_shapes_layers_or_compiler(plans):
    path = str(plans["eager", "saved"][0])
    eager = dict(compiler="eager", decompositions="inductor")
    msg = _refusal(_factory()(), _tokens(batch=4), opt_remat.backend(plan=path, **eager))
    assert "first differing value here primals_1 (input idx int64[4, 32])" in msg
    assert "int64[2, 32] in the plan's graph" in msg and "shapes" in msg and "solve again" in msg

    msg = _refusal(_factory(layers=3)(), _tokens(), opt_remat.backend(plan=path, **eager))
    assert "the model differs" in msg and "param blocks.2." in msg and "only in this graph" in msg
    assert "first differing value here" in msg and "aten." in msg

    msg = _refusal(_factory()(), _tokens(), opt_remat.backend(plan=path, compiler="inductor"))
    assert "compiler" in msg and "compiler='eager'" in msg and "compiler='inductor'" in msg


def test_unwrap_finds_the_plan_mismatch_inside_torchs_wrapping(plans):
    """A user's own aot_autograd backend does not pass the error through: unwrap finds it."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    pfn = opt_remat.partitioner(plan=str(plans["eager", "saved"][0]))
    own = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=pfn)
    with pytest.raises(Exception) as info:
        _train(_factory()(), _tokens(batch=4), own)
    assert not isinstance(info.value, opt_remat.PlanMismatchError)
    inner = opt_remat.unwrap(info.value)
    assert isinstance(inner, opt_remat.PlanMismatchError) and "int64[4, 32]" in str(inner)


class Broken(torch.nn.Module):
    """Two compiled regions (a graph break): a plan file holds a plan for each."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.a(x)).sin()
        torch._dynamo.graph_break()
        return self.b(h.cos()).tanh()


def test_graph_breaks_get_a_plan_each(tmp_path):
    config = """\
model: {factory: "test_offline_plans:Broken", inputs: [{shape: [4, 16]}]}
capture: {meta: true}
budgets: [0.0]
solvers: [cpsat]
"""
    path = tmp_path / "plan.json"
    works, _ = write_plans(path, config, lambda problem: choose_plan(problem, "cpsat", 0, {"time_limit_s": 2}))
    assert len(works) == 2
    doc = json.loads(path.read_text())
    doc["graphs"].reverse()  # matched by canonical id, not by order
    path.write_text(json.dumps(doc))
    entries = read_plan_file(path)["graphs"]
    x = torch.randn(4, 16)
    torch.manual_seed(0)
    model = Broken()
    be = opt_remat.backend(plan=str(path), compiler="eager", decompositions="inductor")
    check = compare_steps(_train(model, x, be), _train(model, x, save_all_backend("inductor")))
    assert check.ok and check.bitwise
    assert [r.plan.solver for r in be.partitioner.history] == ["plan:cpsat", "plan:cpsat"]
    assert {r.graph_id for r in be.partitioner.history} == {e["graph_id"] for e in entries}


def test_bad_plan_files_are_one_line_errors(plans, tmp_path):
    doc = json.loads(plans["eager", "saved"][0].read_text())
    cases = {"binary": b"\x89PNG\r\n\x1a\n\x00\xff", "truncated": json.dumps(doc).encode()[:500],
             "unknown": None, "schema": json.dumps({"format": 2, "graphs": [{"saved": "x"}]}).encode()}
    doc["graphs"][0]["saved"] += ["no_such_value", "nor_this"]
    cases["unknown"] = json.dumps(doc).encode()
    expect = {"binary": "is binary", "truncated": "is truncated (line 1", "unknown": "no_such_value, nor_this",
              "schema": "is not an opt-remat plan file: at graphs/0"}
    for name, data in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        with pytest.raises(PlanMismatchError) as info:
            opt_remat.partitioner(plan=path)
        assert expect[name] in str(info.value) and "\n" not in str(info.value), (name, str(info.value))
