"""What a user gets back from the cache's maintenance calls and settings: ``prune`` evicts to
the size it is given (not the cap), ``clear`` of memory only removes no file, a setting or
option that is not a number is refused with its text, never read as some default, and a folder
the system refuses is named with the system's reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.core import cli
from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._config import REMOTE_TIMEOUT, parse_size


def test_prune_evicts_down_to_the_size_given(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    c = ProgramCache(cache_dir, max_bytes=1 << 30)  # a cap far above what is stored
    c.get_program(ctx, add_src(0.0, "limit-1"), device)
    c.get_program(ctx, add_src(0.0, "limit-2"), device)
    assert c.prune() == {"damaged": 0, "temp": 0, "evicted": 0}  # the cap: nothing to evict
    assert c.prune(0) == {"damaged": 0, "temp": 0, "evicted": 2}
    assert c.entries() == []


def test_clearing_memory_only_removes_no_file(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "memory-only"), device)
    assert c.clear(disk=False) == 0
    assert len(c.entries()) == 1


@pytest.mark.parametrize("raw", ["soon", "0", "-1", "inf", "nan"])
def test_a_remote_timeout_that_is_not_a_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("NETCL_CACHE_REMOTE_TIMEOUT", raw)
    with pytest.raises(
        ValueError,
        match=r"^NETCL_CACHE_REMOTE_TIMEOUT: expected a number of "
        rf"seconds > 0 such as 1 or 0\.5, got '{raw}'$",
    ):
        REMOTE_TIMEOUT.value()
    monkeypatch.setenv("NETCL_CACHE_REMOTE_TIMEOUT", "0.25")
    assert REMOTE_TIMEOUT.value() == 0.25


@pytest.mark.parametrize("raw", ["inf", "1e400", "-1", "2X", ""])
def test_a_size_that_is_not_a_finite_byte_count_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=rf"^the cap: expected a byte count .*, got '{raw}'$"):
        parse_size(raw, "the cap")
    assert parse_size(" 1.5 KiB", "the cap") == 1536


def test_a_size_option_that_is_not_a_size_is_refused_with_its_text(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["cache", "prune", "--max-bytes", "lots", "--dir", str(cache_dir)])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "netcl cache prune: error: argument --max-bytes: expected a byte count such as "
        "1073741824, 500M or 2G, got 'lots' (see 'netcl cache prune --help')\n"
    )


def test_a_folder_the_system_cannot_name_is_refused_with_the_systems_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / ("n" * 300)  # longer than a file name may be
    assert cli.main(["cache", "stats", "--dir", str(folder)]) == 1
    assert capsys.readouterr().err == (
        f"netcl cache stats: unusable: {folder}: File name too long\n"
    )
