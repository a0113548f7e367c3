"""The drop-in default under a peak budget on HF models the other tests do not cover (the ``hf``
extra; small configs, random init): MoE (Mixtral's ``grouped_mm_fallback`` experts, Qwen3-MoE),
an encoder-decoder (T5) and sliding plus global attention (Gemma3). Each is captured by
``torch.compile``, planned by the default under a peak budget between the floor and save-all's
peak, and trained with the plan: its step fits the budget in the simulation, and gives save-all's
loss and gradients."""

import pytest

pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[hf]'")

import opt_remat  # noqa: E402  (after the skip)
from opt_remat.verify import compare_steps, save_all_backend, training_step  # noqa: E402
from solvers import check_plan  # noqa: E402
from solvers.baselines import save_all  # noqa: E402
from solvers.liveness import peak_lower_bound, simulate_plan  # noqa: E402
from tests.hf_small import factory, inputs  # noqa: E402

pytestmark = pytest.mark.usefixtures("reset_dynamo")


@pytest.mark.parametrize("name", ["mixtral", "qwen3-moe", pytest.param("t5", marks=pytest.mark.slow),
                                  pytest.param("gemma3", marks=pytest.mark.slow)])
def test_trained_with_the_defaults_peak_plan_gives_save_alls_gradients(name):
    model = factory(name)()
    # the graph's peak range, from a first compile with save-all's partition
    probe = opt_remat.backend("save-all", compiler="eager")
    training_step(model, inputs(), probe, seed=1)
    problem = probe.partitioner.history[-1].problem
    floor, top = peak_lower_bound(problem), simulate_plan(problem, save_all(problem).saved).peak
    budget = int(floor + 0.4 * (top - floor))

    be = opt_remat.backend(None, peak_budget=budget, compiler="eager")
    ours = training_step(model, inputs(), be, seed=1)
    ref = training_step(model, inputs(), save_all_backend(), seed=1)
    check = compare_steps(ours, ref)
    assert check.ok and check.max_rel_error <= 1e-5, check
    record = be.partitioner.history[-1]
    assert check_plan(record.problem, record.plan).valid
    assert simulate_plan(record.problem, record.plan.saved).peak <= budget
    assert record.plan.recomputed, "a budget below save-all's peak needs recomputation"
