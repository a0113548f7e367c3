"""The YAML side of run configurations: documents with the line of every key, ``--set`` overrides,
and ``ConfigError``, whose message is one line: ``FILE:LINE: FIELD: what was expected``."""

from __future__ import annotations

import re
from typing import Any, Sequence

import yaml

from ..errors import OptRematError


class ConfigError(OptRematError, ValueError):
    """Bad configuration input; ``str()`` is one line naming the place, the field and what was expected."""

    def __init__(self, where: str, field_name: str, message: str) -> None:
        self.where = where
        self.field = field_name
        self.detail = message
        text = f"{where}: {field_name}: {message}" if field_name else f"{where}: {message}"
        super().__init__(" ".join(text.split()))


def field_name(path: Sequence[Any]) -> str:
    """``("solvers", 1, "time_limit_s")`` -> ``solvers[1].time_limit_s``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


# ---- YAML with line numbers ---------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """Safe YAML, with YAML 1.2 floats: ``1e12`` is a number (YAML 1.1 reads it as a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def load_yaml(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """The document and, for every key and list item, the 1-based line it starts on."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(f"{source}:1", "",
                              "the file is empty: expected a mapping with model, budgets and solvers")
        lines: dict[tuple, int] = {(): node.start_mark.line + 1}
        _walk(loader, node, (), lines, source)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError(f"{source}:{line}", "", f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}:1", "", f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    return data, lines


def _walk(loader: yaml.SafeLoader, node: yaml.Node, path: tuple, lines: dict[tuple, int], source: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{source}:{line}", field_name(path + (key,)), "duplicate key")
            seen.add(key)
            lines[path + (key,)] = line
            _walk(loader, value_node, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(loader, item, path + (i,), lines, source)


# ---- overrides ------------------------------------------------------------------------------
def parse_override(text: str) -> tuple[tuple, Any]:
    """``"solvers.1.time_limit_s=5"`` -> (("solvers", 1, "time_limit_s"), 5); the value is YAML."""
    if "=" not in text:
        raise ConfigError("--set", text, "expected key=value (e.g. verify.gradients=false or budgets=[0.5])")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError("--set", key or text, "expected a dotted key such as output.dir or solvers.1.time_limit_s")
    path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
    try:
        parsed = yaml.load(value, Loader=_Loader) if value.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError("--set", key, f"value {value!r} is not valid YAML: {exc}") from None
    return path, parsed


def apply_override(data: Any, path: tuple, value: Any) -> Any:
    if not isinstance(data, dict):
        raise ConfigError("--set", field_name(path), "the configuration is not a mapping")
    target = data
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(target, dict):
            if part not in target or not isinstance(target[part], (dict, list)):
                target[part] = [] if isinstance(nxt, int) else {}
            target = target[part]
        elif isinstance(target, list) and isinstance(part, int) and part < len(target):
            if not isinstance(target[part], (dict, list)):
                if isinstance(target[part], str) and not isinstance(nxt, int):  # solvers: "mincut" -> {name: mincut}
                    target[part] = {"name": target[part]}
                else:
                    raise ConfigError("--set", field_name(path[:i + 1]), "is not a mapping or list")
            target = target[part]
        else:
            raise ConfigError("--set", field_name(path[:i + 1]), "no such item")
    last = path[-1]
    if isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list) and isinstance(last, int) and last <= len(target):
        if last == len(target):
            target.append(value)
        else:
            target[last] = value
    else:
        raise ConfigError("--set", field_name(path), "no such item")
    return data
