"""The extras table of the documentation (docs/getting-started.md, "Extras"; the root README links
to it) lists exactly the extras the distributions declare."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info < (3, 11):
    pytest.skip("tomllib (Python 3.11+) reads the pyproject files", allow_module_level=True)
import tomllib

_ROOT = Path(__file__).resolve().parents[2]
_PAGE = _ROOT / "docs" / "getting-started.md"


def _declared() -> set[tuple[str, str]]:
    found = set()
    for pyproject in sorted((_ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for extra in project.get("optional-dependencies", {}):
            found.add((project["name"], extra))
    return found


def _documented() -> set[tuple[str, str]]:
    page = _PAGE.read_text(encoding="utf-8")
    table = page[page.index("Extras (optional dependencies") :]
    rows = re.findall(r"^\| `([\w-]+)` \| `([\w-]+)` \|", table, flags=re.MULTILINE)
    return set(rows)


def test_the_extras_table_matches_the_distributions() -> None:
    declared, documented = _declared(), _documented()
    assert declared, "no distribution declares an extra: the test reads the wrong files"
    assert documented == declared, (
        f"{_PAGE.relative_to(_ROOT)} extras table: missing {sorted(declared - documented)}, "
        f"stale {sorted(documented - declared)}"
    )
