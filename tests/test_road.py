"""One road: the same graph and settings through the API and through a YAML run give the same plan,
and both check their settings with the same function (``opt_remat.request.make_request``)."""

from __future__ import annotations

import pytest
import torch

import opt_remat
from opt_remat import models
from opt_remat.errors import RequestError
from opt_remat.request import make_request
from opt_remat.runs import ConfigError, load_config, materialize
from opt_remat.runs.execute import solve_one
from opt_remat.verify import training_step

CONFIG = """\
model:
  factory: opt_remat.models:gpt2
  kwargs: {{vocab: 64, d_model: 32, heads: 2, layers: 1, seq: 16, dropout: 0.1}}
  inputs: [{{shape: [2, 16], dtype: int64, high: 64}}]
capture: {{compiler: eager, decompositions: inductor}}
device: h100
rng_replay: {rng_replay}
count_input_bytes: {count_input_bytes}
budgets: [{budget}]
solvers: [{solver}]
verify: {{gradients: false, measure_memory: false}}
output: {{dir: out, formats: [json]}}
"""


def _api_plan(solver: str | None, budget: object, **settings: object) -> tuple[frozenset[str], object]:
    """The plan the API's partitioner makes on the model's training step, as canonical ids."""
    torch.manual_seed(0)
    model = models.gpt2(vocab=64, d_model=32, heads=2, layers=1, seq=16, dropout=0.1)
    inputs = (torch.randint(0, 64, (2, 16)),)
    torch._dynamo.reset()
    be = opt_remat.backend(solver, compiler="eager", decompositions="inductor", **settings,
                           **({"peak_budget": budget["peak"]} if isinstance(budget, dict) else {"budget": budget}))
    training_step(model, inputs, be)
    rec = be.partitioner.history[-1]
    ids = {v["name"]: v["id"] for v in rec.values}
    return frozenset(ids[n] for n in rec.plan.saved), rec.plan


def _yaml_plan(tmp_path, solver: str, budget: object, *, rng_replay: bool, count_input_bytes: bool
               ) -> tuple[frozenset[str], object]:
    path = tmp_path / "c.yaml"
    written = "{peak: %d}" % budget["peak"] if isinstance(budget, dict) else budget
    path.write_text(CONFIG.format(solver=solver, budget=written, rng_replay=str(rng_replay).lower(),
                                  count_input_bytes=str(count_input_bytes).lower()))
    cfg = load_config(path)
    work = materialize(cfg)
    spec = cfg.budgets[0]
    plan, _ = solve_one(work, cfg.solvers[0].name, spec, options=dict(cfg.solvers[0].options))
    ids = {v["name"]: v["id"] for v in work.values}
    assert any(n.op == "rng_state" for n in work.problem.nodes) == rng_replay  # the setting reached the graph
    assert work.request.count_input_bytes == work.problem.count_input_bytes == count_input_bytes
    return frozenset(ids[n] for n in plan.saved), plan


@pytest.mark.parametrize("solver,budget,rng_replay,count_input_bytes", [
    ("default", 0.5, True, False),  # the default path: HiGHS from min-cut starts, on the steered problem
    ("mincut", 0.3, False, False),  # dropout saved, never recomputed
    ("greedy", 0.6, True, True),  # inputs' bytes counted
    ("default", {"peak": 300_000}, True, False),  # the fast peak default
])
def test_api_and_yaml_give_the_same_plan(tmp_path, monkeypatch, solver, budget, rng_replay, count_input_bytes):
    monkeypatch.setenv("OPT_REMAT_PLAN_MEMORY", "0")  # each solve on its inputs alone
    api_ids, api_plan = _api_plan(None if solver == "default" else solver, budget, rng_replay=rng_replay,
                                  count_input_bytes=count_input_bytes)
    yaml_ids, yaml_plan = _yaml_plan(tmp_path, solver, budget, rng_replay=rng_replay,
                                     count_input_bytes=count_input_bytes)
    assert api_ids == yaml_ids
    assert (api_plan.saved_bytes, api_plan.recompute_cost, api_plan.solver) == \
        (yaml_plan.saved_bytes, yaml_plan.recompute_cost, yaml_plan.solver)


def test_a_bad_setting_is_the_same_error_through_the_api_and_yaml(tmp_path):
    with pytest.raises(RequestError) as api:
        opt_remat.partitioner("cpsat", 0.5, warm_start_cutz=3)
    assert api.value.field == "options.warm_start_cutz"
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.format(solver="{name: cpsat, warm_start_cutz: 3}", budget=0.5, rng_replay="true",
                                  count_input_bytes="false"))
    with pytest.raises(ConfigError) as cfg:
        load_config(path)
    assert str(api.value) in str(cfg.value) and "solvers[0].warm_start_cutz" in str(cfg.value)
    with pytest.raises(RequestError, match="rng_replay must be true or false"):
        make_request(rng_replay="yes")  # type: ignore[arg-type]


def test_a_missing_plan_file_is_a_file_not_found_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "plan.json"
    with pytest.raises(FileNotFoundError, match=f"plan file '{missing}' not found"):
        opt_remat.backend(plan=missing)


TAGGED = '''\
import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


def _policy(ctx, op, *args, **kwargs):
    if op is torch.ops.aten.addmm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class Tagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(lambda y, layer=layer: torch.sin(layer(y)).cos(), x, use_reentrant=False,
                           context_fn=functools.partial(create_selective_checkpoint_contexts, _policy))
        return x


def make():
    torch.manual_seed(0)
    return Tagged()
'''


def test_must_save_steering_applies_in_runs_as_in_the_api(tmp_path, monkeypatch):
    (tmp_path / "tagged_model.py").write_text(TAGGED)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.format(solver="default", budget=0.5, rng_replay="true", count_input_bytes="false")
                    .replace("opt_remat.models:gpt2", "tagged_model:make")
                    .replace("{vocab: 64, d_model: 32, heads: 2, layers: 1, seq: 16, dropout: 0.1}", "{}")
                    .replace("[{shape: [2, 16], dtype: int64, high: 64}]", "[{shape: [8, 16], dtype: float32}]"))
    cfg = load_config(path)
    work = materialize(cfg)
    assert work.must_save  # the policy's MUST_SAVE values reach the run's solves
    plan, _ = solve_one(work, "default", cfg.budgets[0])
    ids = {v["name"]: v["id"] for v in work.values}

    import tagged_model
    torch.manual_seed(cfg.seed)
    model = tagged_model.make()
    inputs = (torch.randn(8, 16),)
    torch._dynamo.reset()
    be = opt_remat.backend(None, 0.5, compiler="eager", decompositions="inductor")
    training_step(model, inputs, be)
    rec = be.partitioner.history[-1]
    api_ids = {v["name"]: v["id"] for v in rec.values}
    assert frozenset(api_ids[n] for n in rec.plan.saved) == frozenset(ids[n] for n in plan.saved)
    assert (rec.plan.saved_bytes, rec.plan.recompute_cost) == (plan.saved_bytes, plan.recompute_cost)
