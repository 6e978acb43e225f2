"""Every ``netcl`` command's ``--help`` (each package's commands included) as users read it, at
100 columns, against the text kept in tests/core/data/cli_help.txt: a changed word in a help
string, a lost option or metavar shows here. After changing a help text on purpose, write the
file again with ``NETCL_WRITE_HELP=1`` and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from netcl.core import cli

KEPT = Path(__file__).with_name("data") / "cli_help.txt"
CACHE_ACTIONS = ("stats", "list", "clear", "zero", "prune")
COMMANDS = [
    [],
    ["info"],
    ["config"],
    ["cache"],
    *(["cache", a] for a in CACHE_ACTIONS),
    ["capture"],
    ["capture", "inspect"],
]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == 0
    return f"$ netcl {' '.join([*argv, '--help'])}\n{capsys.readouterr().out}"


def test_every_commands_help_reads_as_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    text = "\n".join(_help(argv, capsys) for argv in COMMANDS)
    if os.environ.get("NETCL_WRITE_HELP") == "1":
        KEPT.write_text(text)
    # compared as words: how argparse wraps and pads differs between Python versions
    assert text.split() == KEPT.read_text().split()
