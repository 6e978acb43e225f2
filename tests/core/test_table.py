"""The plain-text tables of the ``netcl`` command (and the cache's and the demo's): aligned
columns, right-aligned numbers, lines cut with ``…`` to ``COLUMNS`` and never to a pipe."""

from __future__ import annotations

import pytest

from netcl.core import _table


def test_columns_align_and_numbers_go_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest's stdout is no terminal: no limit
    rows = [("a", 1, "x"), ("longer", 1234, "")]
    assert _table.table(rows, ("NAME", "N", "NOTE"), right=(1,)) == [
        "NAME       N  NOTE",
        "a          1  x",
        "longer  1234",
    ]
    assert _table.table([]) == []


def test_lines_are_cut_to_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    lines = _table.table([("short", "a value much longer than the room left")], ("K", "VALUE"))
    assert all(len(line) <= 20 for line in lines), lines
    assert lines[1].startswith("short  ") and lines[1].endswith("…")
    (first, second) = _table.pairs([("label", "a value much longer than the room")])
    assert first == "label" and second.startswith("    a value") and second.endswith("…")
    assert _table.pairs([("k", "v"), ("longer", 2)]) == ["k       v", "longer  2"]


def test_plural() -> None:
    assert _table.plural(1, "entry", "entries") == "1 entry"
    assert _table.plural(2, "entry", "entries") == "2 entries"
    assert _table.plural(0, "file") == "0 files"


def test_human_sizes_step_up_by_1024() -> None:
    assert [_table.human(n) for n in (512, 1536, 5 << 20, 3 << 30, -2048)] == [
        "512 B", "1.5 KiB", "5.0 MiB", "3.0 GiB", "-2.0 KiB"]  # fmt: skip
