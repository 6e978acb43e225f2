"""The plain-text tables of the ``netcl`` command (and the cache's and the demo's): aligned
columns, right-aligned numbers, lines cut with ``…`` to ``COLUMNS`` and never to a pipe."""

from __future__ import annotations

import pytest

from netcl.core import table


def test_columns_align_and_numbers_go_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest's stdout is no terminal: no limit
    rows = [("a", 1, "x"), ("longer", 1234, "")]
    assert table.table(rows, ("NAME", "N", "NOTE"), right=(1,)) == [
        "NAME       N  NOTE",
        "a          1  x",
        "longer  1234",
    ]
    assert table.table([]) == []


def test_lines_are_cut_to_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    lines = table.table([("short", "a value much longer than the room left")], ("K", "VALUE"))
    assert all(len(line) <= 20 for line in lines), lines
    assert lines[1].startswith("short  ") and lines[1].endswith("…")
    (first, second) = table.pairs([("label", "a value much longer than the room")])
    assert first == "label" and second.startswith("    a value") and second.endswith("…")
    assert table.pairs([("k", "v"), ("longer", 2)]) == ["k       v", "longer  2"]


def test_plural() -> None:
    assert table.plural(1, "entry", "entries") == "1 entry"
    assert table.plural(2, "entry", "entries") == "2 entries"
    assert table.plural(0, "file") == "0 files"


def test_human_sizes_step_up_by_1024() -> None:
    assert [table.human(n) for n in (512, 1536, 5 << 20, 3 << 30, -2048)] == [
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
        "-2.0 KiB",
    ]


@pytest.mark.parametrize(
    ("columns", "rows", "headers", "right", "expected"),
    [
        # the widest column narrows first (the last of equals), down to 4 characters
        ("20", [("key", "a very long value here", "x")], None, (), ["key  a very long…  x"]),
        (
            "12",
            [("alpha-beta-gamma", 123456)],
            ("NAME", "SIZE"),
            (1,),
            ["NAME    SIZE", "alp…  123456"],
        ),
        # every column at 4 and still too wide: the line itself is cut
        ("10", [("abcdef", "ghijkl", "mnopqr")], None, (), ["abc…  ghi…"]),
        ("3", [("abcdef", "gh")], ("A", "B"), (), ["A …", "ab…"]),
        # a table that fits is left whole
        ("13", [("abcdef", "ghijk")], None, (), ["abcdef  ghijk"]),
    ],
)
def test_a_table_too_wide_for_the_terminal_is_narrowed_then_cut(
    columns: str,
    rows: list[tuple[object, ...]],
    headers: tuple[str, ...] | None,
    right: tuple[int, ...],
    expected: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``COLUMNS`` set, a too-wide table loses characters from its widest columns first
    (the last of equal ones), none below 4, each cut cell ending in ``…``; a line still too
    long is cut at the terminal's width."""
    monkeypatch.setenv("COLUMNS", columns)
    assert table.table(rows, headers, right=right) == expected
