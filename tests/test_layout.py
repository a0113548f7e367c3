"""The house's rules, read from the source (every import counted, those inside functions too):
nothing in ``solvers/`` imports torch or ``opt_remat``; in ``opt_remat/`` no stage imports a later
stage or the entry layer; no import cycle; no module over 450 lines, no function over 100."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 100

# opt_remat's modules by layer, lowest first: a module may import its own layer and those below.
# The stages run capture -> build -> solve -> lower -> verify -> report; ``road`` composes them;
# the entry layer (API, CLI, runs/) calls the road. A module missing here fails the test: place it.
LAYERS: list[tuple[str, set[str]]] = [
    ("base", {"errors", "interrupt", "formats", "disk_cache"}),
    ("compile set-up", {"compile_setup", "canonical", "costs", "profile_costs", "models", "hf"}),
    ("capture", {"capture"}),
    ("build", {"rng_replay", "graph_rules", "prepare", "tags", "torch_budget", "offload", "build"}),
    ("solve", {"options", "request", "plan_memory", "solve", "plans"}),
    ("lower", {"extract", "lower"}),
    ("verify", {"memory", "torch_reference", "verify", "step_memory"}),
    ("report", {"report"}),
    ("road", {"road", "step_capture"}),
    ("entry", {"api", "cli", "cli_text", "runs", "__init__"}),
]


def _py_files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute names), at any depth of the file."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # ``from . import x`` names a module
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def _stage_of(module: str) -> str | None:
    """The first name under ``opt_remat`` (``opt_remat.runs.loop`` -> ``runs``); None outside it."""
    parts = module.split(".")
    if parts[0] != "opt_remat":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(stage: str) -> int:
    for i, (_, names) in enumerate(LAYERS):
        if stage in names:
            return i
    raise AssertionError(f"opt_remat/{stage}: place it in a layer of tests/test_layout.py's LAYERS")


def test_solvers_import_neither_torch_nor_opt_remat() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in _py_files("solvers")
           for line, name in _imports(p) if name.split(".")[0] in ("torch", "opt_remat")]
    assert not bad, "\n".join(bad)


def test_no_stage_imports_a_later_stage_or_the_entry_layer() -> None:
    bad = []
    for path in _py_files("opt_remat"):
        stage = _stage_of(_module_name(path))
        assert stage is not None
        mine = _layer(stage)
        seen: set[tuple[int, str]] = set()
        for line, name in _imports(path):
            target = _stage_of(name)
            if target is None or target == stage or target == "__init__" and name.count(".") == 0:
                continue
            if _layer(target) > mine and (line, target) not in seen:
                seen.add((line, target))
                bad.append(f"{path.relative_to(ROOT)}:{line} ({LAYERS[mine][0]}) imports {name} "
                           f"({LAYERS[_layer(target)][0]})")
    assert not bad, "\n".join(bad)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in ("solvers", "opt_remat") for p in _py_files(pkg)}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, name in _imports(path):
            # the longest known module the name starts with (``pkg.mod.attr`` -> ``pkg.mod``)
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            target = ".".join(parts)
            if target and target != module and not modules[target].name == "__init__.py":
                edges[module].add(target)
    return edges


def test_no_import_cycle() -> None:
    edges = _graph()
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("package", ["solvers", "opt_remat", "benchmarks"])
def test_sizes(package: str) -> None:
    bad = []
    for path in _py_files(package):
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            bad.append(f"{path.relative_to(ROOT)}: {lines} lines (> {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines "
                               f"(> {MAX_FUNCTION_LINES})")
    assert not bad, "\n".join(bad)
