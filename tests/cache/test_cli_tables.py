"""`netcl cache stats|list` read like tables: a gap between every label and its value, a header
on lists, the right plural, and a narrow terminal (COLUMNS) respected."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from netcl.core import device
from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._store import CacheStats

NETCL = str(Path(sys.executable).with_name("netcl"))
SRC = "__kernel void f(__global int *a) { a[0] = 1; }"


def _netcl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [NETCL, *args], capture_output=True, text=True, timeout=120, env={**run_env, **(env or {})}
    )


def _one_entry(root: Path) -> None:
    ctx = device.default_context()
    ProgramCache(cache_dir=root).get_program(ctx, SRC, ctx.devices[0])


def test_stats_labels_never_touch_their_values(tmp_path: Path) -> None:
    _one_entry(tmp_path)
    proc = _netcl("cache", "stats", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc
    for name in CacheStats.__dataclass_fields__:
        if not name.startswith("bytes_"):
            assert re.search(rf"^\s*{name}\s+\d+$", proc.stdout, re.M), (name, proc.stdout)
    assert re.search(r"^entries\s+1$", proc.stdout, re.M), proc.stdout


def test_list_has_a_header_and_the_right_plural(tmp_path: Path) -> None:
    _one_entry(tmp_path)
    out = _netcl("cache", "list", "--dir", str(tmp_path)).stdout.splitlines()
    assert out[0].split() == ["KEY", "SIZE", "LAST", "USED", "DEVICE", "OPTIONS"], out
    assert out[-1] == "1 entry, 0 temporary files", out
    none = _netcl("cache", "list", "--dir", str(tmp_path / "new")).stdout
    assert none.startswith("0 entries, 0 temporary files\n"), none


def test_narrow_terminal_lines_are_cut_with_a_marker(tmp_path: Path) -> None:
    _one_entry(tmp_path)
    for action in ("list", "stats"):
        wide = _netcl("cache", action, "--dir", str(tmp_path)).stdout
        narrow = _netcl("cache", action, "--dir", str(tmp_path), env={"COLUMNS": "40"}).stdout
        assert max(map(len, wide.splitlines())) > 40  # the test means something
        assert max(map(len, narrow.splitlines())) <= 40, narrow
    assert "…" in _netcl("cache", "list", "--dir", str(tmp_path), env={"COLUMNS": "40"}).stdout
