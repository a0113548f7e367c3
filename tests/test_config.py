"""Run configurations: schema and semantic validation with one-line errors naming field and line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opt_remat.cli import main
from opt_remat.runs import load_config

REPO = Path(__file__).resolve().parents[1]

BASE = """\
model:
  factory: opt_remat.models:mlp
  kwargs: {d_in: 16, hidden: 32, layers: 2}
  inputs: [{shape: [4, 16], dtype: float32}]
  loss: sum
capture: {decompositions: inductor, dtype: float32}
device: h100
budgets: [0.5, "64KiB"]
solvers:
  - mincut
  - {name: cpsat, time_limit_s: 5, threads: 1}
verify: {gradients: true, measure_memory: true}
output: {dir: out, formats: [table, json]}
"""


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_error(capsys, tmp_path: Path, text: str, *extra: str) -> str:
    """Run the CLI on a bad config: exit 2, one line on stderr, nothing written."""
    path = write(tmp_path, text)
    rc = main(["run", str(path), *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("opt-remat: error: ")
    assert not (tmp_path / "out").exists(), "nothing may be written for a bad config"
    return err


# ---- the good case ----------------------------------------------------------------------------
def test_base_config_loads_with_defaults_and_paths(tmp_path):
    cfg = load_config(write(tmp_path, BASE))
    assert [b.label for b in cfg.budgets] == ["0.5", "64KiB"]
    assert [(s.name, s.options) for s in cfg.solvers] == [("mincut", {}), ("cpsat", {"time_limit_s": 5, "threads": 1})]
    assert cfg.output_dir == (tmp_path / "out").resolve()  # relative to the config file
    assert cfg.formats == ["table", "json"]
    assert cfg.compiler == "eager" and cfg.decompositions == "inductor" and cfg.seed == 0


def test_overrides_and_yaml12_floats(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(write(tmp_path, BASE), ["budgets=[0.25]", "solvers.1.time_limit_s=2",
                                              "device={peak_flops: 1e12, bandwidth: 5e10}", "output.dir=elsewhere"])
    assert [b.raw for b in cfg.budgets] == [0.25]
    assert cfg.solvers[1].options["time_limit_s"] == 2
    assert cfg.device == {"peak_flops": 1e12, "bandwidth": 5e10}  # 1e12 is a number, not a string
    assert cfg.output_dir == (tmp_path / "elsewhere").resolve()  # --set paths: relative to the cwd
    cfg = load_config(write(tmp_path, BASE), ["solvers.0.backend=networkx"])  # a bare name becomes a mapping
    assert cfg.solvers[0].options == {"backend": "networkx"}


def test_shipped_configs_validate():
    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert {p.stem for p in configs} >= {"gpt2", "llama", "resnet", "mlp", "checkmate-resnet50"}
    for path in configs:
        cfg = load_config(path)  # the Checkmate graph is shipped: configs/data/checkmate/
        assert cfg.budgets and cfg.solvers


# ---- each class of bad input: exit 2, one line naming the field and the line -------------------
@pytest.mark.parametrize("old,new,field,line,expect", [
    ("  loss: sum\n", "  loss: sum\n  colour: red\n", "model.colour", 6, "unknown key"),
    ("verify: {gradients: true", "verify: {gradients: yes please", "verify.gradients", 12, "expected true or false"),
    ("time_limit_s: 5", "time_limit_s: soon", "solvers[1].time_limit_s", 11, "expected a number"),
    ("time_limit_s: 5", "time_limt_s: 5", "solvers[1].time_limt_s", 11, "unknown option"),
    ("time_limit_s: 5", "symmetry: layers", "solvers[1].symmetry", 11, "expected one of"),
    ("  - mincut\n", "  - simplex\n", "solvers[0]", 10, "unknown solver 'simplex'"),
    ("opt_remat.models:mlp", "opt_remat.no_such_module:mlp", "model.factory", 2, "cannot import module"),
    ("opt_remat.models:mlp", "opt_remat.models:no_such_factory", "model.factory", 2, "no attribute"),
    ("opt_remat.models:mlp", "opt_remat.models", "model.factory", 2, "module:callable"),
    ('"64KiB"', '"64 parsecs"', "budgets[1]", 8, "cannot parse budget"),
    ("[0.5,", "[1.5,", "budgets[0]", 8, "fraction in [0, 1]"),
    ("[0.5,", "[7,", "budgets[0]", 8, "7 bytes"),
    ("device: h100", "device: tpu9", "device", 7, "expected one of"),
    ("device: h100", "device: {peak_flops: 1e12}", "device", 7, "missing key 'bandwidth'"),
    ("dtype: float32}]", "dtype: float31}]", "model.inputs[0].dtype", 4, "expected one of"),
    ("shape: [4, 16]", "shape: [4, sixteen]", "model.inputs[0].shape[1]", 4, "expected an integer"),
    ("formats: [table, json]", "formats: [table, pdf]", "output.formats[1]", 13, "expected one of"),
    ("budgets: [0.5, \"64KiB\"]\n", "", "(top level)", 1, "missing key 'budgets'"),
])
def test_schema_errors_name_field_and_line(capsys, tmp_path, old, new, field, line, expect):
    assert old in BASE
    err = run_error(capsys, tmp_path, BASE.replace(old, new, 1))
    assert f"run.yaml:{line}: {field}: " in err, err
    assert expect in err, err


@pytest.mark.parametrize("old,new,field,line,expect", [
    ("shape: [4, 16]", "shape: [4, 17]", "model.inputs", 4, "do not fit the model"),
    ("kwargs: {d_in: 16,", "kwargs: {d_inn: 16,", "model.kwargs", 3, "does not take these arguments"),
])
def test_model_errors_found_by_the_dry_capture(capsys, tmp_path, old, new, field, line, expect):
    err = run_error(capsys, tmp_path, BASE.replace(old, new, 1))
    assert f"run.yaml:{line}: {field}: " in err, err
    assert expect in err and "4x17" in err if "17" in new else expect in err, err


def test_a_factory_from_the_config_folder(capsys, tmp_path):
    (tmp_path / "my_models.py").write_text("import torch\n\ndef make(**kw):\n    return 'not a module'\n")
    err = run_error(capsys, tmp_path, BASE.replace("opt_remat.models:mlp", "my_models:make"))
    assert "model.factory" in err and "nn.Module" in err


def test_yaml_syntax_and_duplicates(capsys, tmp_path):
    err = run_error(capsys, tmp_path, BASE.replace("budgets: [0.5,", "budgets: [0.5,,"))
    assert "run.yaml:8" in err and "not valid YAML" in err
    err = run_error(capsys, tmp_path, BASE + "device: a100\n")
    assert re.search(r"run\.yaml:14: device: duplicate key", err), err


def test_set_errors_name_the_override(capsys, tmp_path):
    err = run_error(capsys, tmp_path, BASE, "--set", "verify.colour=1")
    assert "--set: verify.colour: unknown key" in err
    err = run_error(capsys, tmp_path, BASE, "--set", "budgets=0.3")
    assert "--set: budgets: expected a list" in err
    err = run_error(capsys, tmp_path, BASE, "--set", "nonsense")
    assert "expected key=value" in err


def test_missing_file_and_bad_options(capsys, tmp_path):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    path = write(tmp_path, BASE)
    assert main(["run", str(path), "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err
    assert main(["solve", str(path), "--solver", "mincut", "--budget", "lots", "-o", str(tmp_path / "p.json")]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["solve", str(path), "--solver", "nope", "-o", str(tmp_path / "p.json")]) == 2
    assert "--solver" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()
