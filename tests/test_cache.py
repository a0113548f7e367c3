"""Compile caching with the inductor backend: a second process with the same settings takes
inductor's and AOTAutograd's cached compilation (the partitioner is not even called); one with
other settings (budget, solver options, device profile) compiles and partitions again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import opt_remat

REPO = Path(__file__).resolve().parents[1]
STEP = textwrap.dedent("""
    import json, sys
    import torch, opt_remat
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    be = opt_remat.backend(**json.loads(sys.argv[1]))
    torch.compile(model, backend=be)(torch.randn(4, 8)).sum().backward()
    print(json.dumps({"partitioned": len(be.partitioner.history),
                      "aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
                      "fx_hits": counters["inductor"]["fxgraph_cache_hit"]}))
""")


def _compile_in_a_new_process(cache_dir: Path, **settings) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", STEP, json.dumps(settings)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # three processes compiling with inductor: run by .ci/run
def test_same_settings_hit_the_compile_caches_other_settings_miss(tmp_path):
    first = _compile_in_a_new_process(tmp_path, solver="mincut", budget=0.5)
    assert first["partitioned"] == 1 and first["aot_hits"] == 0
    again = _compile_in_a_new_process(tmp_path, solver="mincut", budget=0.5)
    assert again["partitioned"] == 0 and again["aot_hits"] == 1 and again["fx_hits"] >= 1
    other = _compile_in_a_new_process(tmp_path, solver="mincut", budget=0.2)
    assert other["partitioned"] == 1 and other["aot_hits"] == 0


def test_uuid_follows_every_setting_that_decides_the_plan(tmp_path):
    base = opt_remat.partitioner("cpsat", 0.5, time_limit_s=5)
    assert base.uuid() == opt_remat.partitioner("cpsat", 0.5, time_limit_s=5).uuid()
    others = [opt_remat.partitioner("mincut", 0.5), opt_remat.partitioner("cpsat", 0.2, time_limit_s=5),
              opt_remat.partitioner("cpsat", 0.5, time_limit_s=6),
              opt_remat.partitioner("cpsat", 0.5, time_limit_s=5, device="a100"),
              opt_remat.partitioner("cpsat", 0.5, time_limit_s=5, count_input_bytes=True),
              opt_remat.partitioner("cpsat", 0.5, time_limit_s=5, peak_budget="1MiB"),
              opt_remat.partitioner("cpsat", 0.5, time_limit_s=5, rng_replay=False),
              opt_remat.partitioner("cpsat", 0.5, time_limit_s=5, costs="profile"),
              opt_remat.partitioner("cpsat", 0.5, time_limit_s=5, peak_budget="1MiB",
                                    count_gradients=False)]
    assert len({base.uuid()} | {p.uuid() for p in others}) == 1 + len(others)
    for content in ("a", "b"):  # a plan file: its content, not its name
        (tmp_path / "plan.json").write_text(content)
        p = opt_remat.Partitioner(solver="mincut")
        p.plan = tmp_path / "plan.json"
        others.append(p.uuid())
    assert others[-1] != others[-2]


def test_inductor_cache_key_holds_the_partitioners_settings_not_its_history():
    """Inductor pickles its config, the custom partitioner included, into its FX graph cache key:
    the key must not change with what the partitioner planned before (nor pickle all of it)."""
    import pickle

    import torch
    from torch._inductor.codecache import FxGraphCachePickler

    from opt_remat.api import _OptRematPartitionFn
    from opt_remat.verify import training_step

    pfn = opt_remat.partitioner("mincut", 0.5)
    backend = opt_remat.backend(compiler="eager", partition_fn=pfn)  # sets the settings its uuid keys on
    custom = _OptRematPartitionFn(pfn)
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    before = FxGraphCachePickler(gm).dumps(custom)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    training_step(model, (torch.randn(4, 8),), backend, seed=0)
    torch._dynamo.reset()
    assert len(pfn.history) == 1
    assert FxGraphCachePickler(gm).dumps(custom) == before
    back = pickle.loads(pickle.dumps(custom))
    assert back.uuid() == pfn.uuid() and len(pickle.dumps(custom)) < 500
    with pytest.raises(RuntimeError, match="unpickled"):
        back(gm, [])
