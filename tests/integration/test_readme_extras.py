"""The root README's extras table lists exactly the extras the distributions declare."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info < (3, 11):
    pytest.skip("tomllib (Python 3.11+) reads the pyproject files", allow_module_level=True)
import tomllib

_ROOT = Path(__file__).resolve().parents[2]


def _declared() -> set[tuple[str, str]]:
    found = set()
    for pyproject in sorted((_ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for extra in project.get("optional-dependencies", {}):
            found.add((project["name"], extra))
    return found


def _documented() -> set[tuple[str, str]]:
    readme = (_ROOT / "README.md").read_text()
    table = readme[readme.index("Extras (optional dependencies") :]
    rows = re.findall(r"^\| `([\w-]+)` \| `([\w-]+)` \|", table, flags=re.MULTILINE)
    return set(rows)


def test_readme_extras_table_matches_the_distributions() -> None:
    declared, documented = _declared(), _documented()
    assert declared, "no distribution declares an extra: the test reads the wrong files"
    assert documented == declared, (
        f"README.md extras table: missing {sorted(declared - documented)}, "
        f"stale {sorted(documented - declared)}"
    )
