"""The version changes with the CHANGELOG: pyproject's version is the one its newest heading names."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _changelog_versions() -> list[str]:
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings, "CHANGELOG.md has no '## ' heading"
    return [m.group(1) for h in headings if (m := re.match(r"## (\d+\.\d+\.\d+) - \d{4}-\d{2}-\d{2}", h))]


def test_pyproject_version_is_the_changelogs_newest() -> None:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)  # no tomllib on 3.10
    assert found, "pyproject.toml has no version line"
    version = found.group(1)
    newest = (ROOT / "CHANGELOG.md").read_text().split("\n## ", 1)[1].splitlines()[0]
    assert re.match(r"\d+\.\d+\.\d+ - \d{4}-\d{2}-\d{2}", newest), (
        f"CHANGELOG.md's newest heading '## {newest}' names no version: write '## {version} - DATE'")
    assert newest.split(" - ")[0] == version, (
        f"pyproject.toml says {version}, CHANGELOG.md's newest heading '## {newest}': bump one to the other")


def test_versions_only_go_up() -> None:
    versions = [tuple(int(p) for p in v.split(".")) for v in _changelog_versions()]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
