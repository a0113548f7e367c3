"""Peak budgets on real library models (torchvision's mobilenet_v3_small and efficientnet_b0, timm's
convnext_atto; the optional ``models`` extra): at the simulated peak of torch's own plan at
``activation_memory_budget`` 0.5 and 0.2, made valid by saving the random ops' outputs it would
recompute, opt-remat's peak path (``peak_budget=`` through ``torch.compile``) finds a plan that fits
within 60 s, and its gradients equal save-all's."""

import functools

import pytest
import torch

_MISSING = "needs torchvision and timm: pip install -e '.[models]' (see pyproject.toml)"
torchvision = pytest.importorskip("torchvision", reason=_MISSING)
timm = pytest.importorskip("timm", reason=_MISSING)

import opt_remat  # noqa: E402  (after the skips: nothing to import when the extra is missing)
from opt_remat.build import classify, problem_from_joint  # noqa: E402
from opt_remat.capture import capture  # noqa: E402
from opt_remat.torch_reference import torch_plan  # noqa: E402
from opt_remat.verify import compare_steps, save_all_backend, training_step  # noqa: E402
from solvers import check_plan, recompute_closure  # noqa: E402
from solvers.liveness import simulate_plan  # noqa: E402

# a 60 s solve per budget and a capture per model: run by .ci/run, not by the fast set
pytestmark = [pytest.mark.slow, pytest.mark.models, pytest.mark.usefixtures("reset_dynamo")]

TIME_LIMIT_S = 60
MODELS = {  # small batches and 64x64 images: seconds per step on a CPU
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(), 8),
    "efficientnet_b0": (lambda: torchvision.models.efficientnet_b0(), 4),
    "convnext_atto": (lambda: timm.create_model("convnext_atto", pretrained=False), 8),
}


@functools.lru_cache(maxsize=None)
def _setup(name):
    """The model, its inputs, save-all's step and the problem of its joint graph (once per model)."""
    factory, batch = MODELS[name]
    torch.manual_seed(0)
    model = factory()
    inputs = (torch.randn(batch, 3, 64, 64),)
    ref = training_step(model, inputs, save_all_backend("inductor"), seed=5)
    prepared, problem = problem_from_joint(capture(model, inputs, decompositions="inductor"))
    return model, inputs, ref, prepared, problem


def _torch_valid_peak(prepared, problem, fraction):
    """The simulated step peak of torch's plan at ``fraction`` with the random ops it recomputes
    saved instead (torch would recompute them without their RNG state: other numbers)."""
    copy = prepared.copy()  # torch's partitioner annotates the graph it is given
    info = classify(copy.module, copy.num_fwd_outputs, copy.static_lifetime_input_indices)
    ref = torch_plan(copy.module, info, problem, fraction=fraction)
    saved = set(ref.saved)
    for name in ref.extra["recomputes_banned"]:
        if problem.by_name[name].op == "rng_state":  # opt-remat's replay state: save its draw instead
            saved |= {u for u in problem.users[name] if u in ref.recomputed}
        else:
            saved.add(name)
    recomputed, errors = recompute_closure(problem, saved)
    assert not errors and not any(not problem.can_recompute(r) for r in recomputed), errors
    return simulate_plan(problem, saved).peak


@pytest.mark.parametrize("fraction", [0.5, 0.2])
@pytest.mark.parametrize("name", list(MODELS))
def test_peak_of_torchs_valid_plan_is_met(name, fraction):
    model, inputs, ref, prepared, problem = _setup(name)
    peak_budget = _torch_valid_peak(prepared, problem, fraction)
    be = opt_remat.backend("cpsat", peak_budget=peak_budget, time_limit_s=TIME_LIMIT_S,
                           compiler="eager", decompositions="inductor")
    step = training_step(model, inputs, be, seed=5)
    rec = be.partitioner.history[-1]
    assert rec.problem.nodes == problem.nodes  # the graph the budget was measured on
    assert check_plan(rec.problem, rec.plan).valid
    assert simulate_plan(rec.problem, rec.plan.saved).peak == rec.plan.extra["peak"] <= peak_budget
    # the solve keeps to its limit (a little over for the last simulation it finishes)
    assert rec.plan.solve_time_s <= 1.1 * TIME_LIMIT_S, rec.plan.solve_time_s
    check = compare_steps(step, ref)
    assert check.ok and check.max_rel_error <= 1e-6, check
