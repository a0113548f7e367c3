"""Custom ops are recomputable as torch's partitioner treats them (``opt_remat.build``): HF
Mixtral runs its experts through ``transformers.grouped_mm_fallback``, a functional custom op;
saved-byte budgets down to what torch's partitioner saves are met, with eager's gradients. Ops
that are not pure functions stay banned, and the problem says why."""

import pytest
import torch

pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")

import opt_remat
from opt_remat.build import classify, problem_from_joint
from opt_remat.capture import capture
from opt_remat.torch_reference import torch_plan
from opt_remat.verify import compare_steps, save_all_backend, training_step
from solvers import check_plan
from tests.hf_small import factory, inputs

pytestmark = pytest.mark.usefixtures("reset_dynamo")


def _torch_saved_bytes(name: str, fraction: float) -> int:
    prepared, problem = problem_from_joint(capture(factory(name), inputs()))
    info = classify(prepared.module, prepared.num_fwd_outputs, prepared.static_lifetime_input_indices)
    return torch_plan(prepared.module, info, problem, fraction=fraction).saved_bytes


def test_grouped_mm_experts_are_recomputable():
    _, problem = problem_from_joint(capture(factory("mixtral"), inputs()))
    experts = [n for n in problem.nodes if n.op == "transformers.grouped_mm_fallback.default"]
    assert experts and not any(n.banned for n in experts)
    assert not any(n.banned for n in problem.nodes)


@pytest.mark.parametrize("fraction", [0.5, 0.0])
def test_mixtral_meets_torchs_saved_bytes_with_eagers_gradients(fraction):
    budget = _torch_saved_bytes("mixtral", fraction)
    model = factory("mixtral")()
    be = opt_remat.backend(None, budget, compiler="eager")
    ours = training_step(model, inputs(), be, seed=1)
    ref = training_step(model, inputs(), save_all_backend(), seed=1)
    check = compare_steps(ours, ref)
    assert check.ok and check.max_rel_error <= 1e-5, check
    eager_model = __import__("copy").deepcopy(model)
    loss = eager_model(*inputs())
    loss.backward()
    eager = (loss.detach(), {n: p.grad for n, p in eager_model.named_parameters() if p.grad is not None})
    assert compare_steps(ours, eager).max_rel_error <= 1e-4
    for record in be.partitioner.history:
        assert record.plan.saved_bytes <= max(budget, 0) or record.plan.saved_bytes == 0
        assert check_plan(record.problem, record.plan).valid
    assert any(n.op.startswith("transformers.grouped_mm") for r in be.partitioner.history
               for n in r.problem.nodes if n.name in r.plan.recomputed)


def test_impure_custom_ops_stay_banned_with_the_reason():
    lib = torch.library.Library("optrematt", "FRAGMENT")  # noqa: F841  (kept alive for the test)

    @torch.library.custom_op("optrematt::pure", mutates_args=())
    def pure(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    @pure.register_fake
    def _(x):
        return torch.empty_like(x)

    pure.register_autograd(lambda ctx, g: g * ctx.saved_tensors[0].cos(),
                           setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))

    @torch.library.custom_op("optrematt::noisy", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @noisy.register_fake
    def _(x):
        return torch.empty_like(x)

    noisy.register_autograd(lambda ctx, g: g * 2, setup_context=lambda ctx, inputs, output: None)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return (noisy(pure(x @ self.w)) @ self.w).sin().sum()

    _, problem = problem_from_joint(capture(M(), (torch.randn(4, 8),)))
    by_op = {n.op: n for n in problem.nodes}
    assert not by_op["optrematt.pure.default"].banned
    assert by_op["optrematt.noisy.default"].banned
    assert "nondeterministic_seeded" in problem.ban_reasons[by_op["optrematt.noisy.default"].name]


def test_the_plans_report_says_why_values_are_never_recomputed():
    from opt_remat.report import describe_plan
    from solvers.baselines import save_all

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x.sin(), 0.5).cos().sum()

    _, problem = problem_from_joint(capture(Noisy(), (torch.randn(4, 8, requires_grad=True),)),
                                    rng_replay=False)
    assert "random op" in set(problem.ban_reasons.values())
    assert "never recomputed   : random op x" in describe_plan(problem, save_all(problem))
