"""Size cap with LRU eviction, prune, and the `netcl cache` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._cli import register
from netcl.runtime.cache._config import parse_size
from netcl.runtime.cache._store import TOUCH_S


class cli:  # noqa: N801 - stands in for `netcl` without needing the installed entry point
    @staticmethod
    def main(argv: list[str]) -> int:
        parser = argparse.ArgumentParser(prog="netcl")
        register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)


def _set_mtime(c: ProgramCache, key_order: list[str]) -> None:
    by_key = {f.key: f for f in c.entries()}
    for i, key in enumerate(key_order):
        os.utime(by_key[key].path, (1_000_000 + i, 1_000_000 + i))


def test_lru_eviction_order(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    srcs = {name: add_src(0.0, f"lru-{name}") for name in "abcd"}
    c = ProgramCache(cache_dir)
    keys = {}
    for name in "abc":
        c.get_program(ctx, srcs[name], device)
        keys[name] = c._memory[(weakref.ref(ctx), device, srcs[name], None)].key
    size = max(f.size for f in c.entries())
    _set_mtime(c, [keys["a"], keys["b"], keys["c"]])  # a oldest
    # a disk hit on `a` from a fresh instance makes it the most recently used
    ProgramCache(cache_dir).get_program(ctx, srcs["a"], device)
    capped = ProgramCache(cache_dir, max_bytes=3 * size + size // 2)
    capped.get_program(ctx, srcs["d"], device)  # 4 entries > cap: the LRU one (b) goes
    left = {f.key for f in capped.entries()}
    assert keys["b"] not in left
    assert {keys["a"], keys["c"]} <= left and len(left) == 3
    assert capped.stats.evictions == 1


def test_an_entry_that_cannot_be_evicted_is_logged_and_the_lookup_still_succeeds(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    """An old entry the file system will not let go (immutable: even root cannot unlink it):
    the eviction fails with a warning naming the folder and why, the new program is stored."""
    c = ProgramCache(cache_dir, max_bytes=1)  # every older entry is over the cap
    c.get_program(ctx, add_src(0.0, "evict-stuck-a"), device)  # kept: the one just written
    (old,) = c.entries()
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(old.path)]).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a file system with it)")
    try:
        check_add(c.get_program(ctx, add_src(1.0, "evict-stuck-b"), device), 1.0)
        assert len(c.entries()) == 2 and c.stats.evictions == 0
    finally:
        subprocess.run([chattr, "-i", str(old.path)], check=True)
    (event,) = log_events("cache_evict_failed")
    assert event.path == str(cache_dir / "programs")  # type: ignore[attr-defined]
    assert "Operation not permitted" in event.error  # type: ignore[attr-defined]


def test_a_hit_touches_its_entry_at_a_granularity_of_a_minute(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    """A disk hit refreshes its entry's mtime only when that is TOUCH_S or more away from now
    (older, or in the future: a clock set back); one used or written just now is left as is."""
    src = add_src(0.0, "touch")
    ProgramCache(cache_dir).get_program(ctx, src, device)
    (entry,) = ProgramCache(cache_dir).entries()
    for offset, touched in (
        (-TOUCH_S / 2, False),
        (TOUCH_S / 2, False),
        (-TOUCH_S - 5, True),
        (TOUCH_S + 5, True),
        (-1e6, True),
    ):
        before = time.time()
        os.utime(entry.path, (before + offset, before + offset))
        c = ProgramCache(cache_dir)
        c.get_program(ctx, src, device)
        assert c.stats.disk_hits == 1
        mtime = entry.path.stat().st_mtime
        if touched:
            assert before - 1 <= mtime <= time.time() + 1, offset
        else:
            assert mtime == pytest.approx(before + offset, abs=1e-3), offset


def test_max_bytes_env_and_parse(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    assert parse_size("2G", "x") == 2 << 30
    assert parse_size("500M", "x") == 500 << 20
    assert parse_size("1024", "x") == 1024
    assert parse_size("1.5KiB", "x") == 1536
    # a unit in any case, with or without B (1000s are not meant: the units are binary)
    for text in ("500MB", "500mb", "500 MiB", "500m"):
        assert parse_size(text, "x") == 500 << 20, text
    assert parse_size("1024B", "x") == parse_size("1024b", "x") == 1024
    with pytest.raises(ValueError, match="NETCL_CACHE_MAX_BYTES: expected a byte count"):
        parse_size("lots", "NETCL_CACHE_MAX_BYTES")
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "64M")
    assert ProgramCache(cache_dir).max_bytes == 64 << 20
    assert ProgramCache(cache_dir, max_bytes=10).max_bytes == 10
    with pytest.raises(ValueError, match="got '-3'"):
        parse_size("-3", "NETCL_CACHE_MAX_BYTES")


def test_cli_stats_list_prune_clear(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "cli-1"), device)
    c.get_program(ctx, add_src(0.0, "cli-1"), device)
    c.get_program(ctx, add_src(0.0, "cli-2"), device)
    c.flush_stats()  # what happens at exit
    bad = c.entries()[0]
    bad.path.write_bytes(b"junk")
    (cache_dir / "programs" / f".{'d' * 64}.abc123.tmp").write_bytes(b"x")  # older naming
    os.utime(cache_dir / "programs" / f".{'d' * 64}.abc123.tmp", (1, 1))
    d = ["cache", "--dir", str(cache_dir)]

    assert cli.main([*d, "stats", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["entries"] == 2 and st["memory_hits"] == 1 and st["misses"] == 2
    assert st["temp_files"] == 1 and st["live_temp_files"] == 0  # no pid: an hour-old left-over
    assert cli.main([*d, "stats"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^hits +1 \(33\.3 % of 3 lookups\)$", out, re.M), out

    assert cli.main([*d, "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert sorted(r["status"].split(" ")[0] for r in rows) == ["damaged", "ok"]
    assert cli.main([*d, "list"]) == 0
    assert "2 entries, 1 temporary file" in capsys.readouterr().out

    assert cli.main([*d, "prune"]) == 0
    assert "removed 1 damaged entry, 1 temporary file" in capsys.readouterr().out
    assert len(ProgramCache(cache_dir).entries()) == 1

    assert cli.main([*d, "prune", "--max-bytes", "0"]) == 0
    assert "evicted 1 entry" in capsys.readouterr().out
    c.get_program(ctx, add_src(0.0, "cli-3"), device)
    assert cli.main([*d, "clear"]) == 0
    assert "removed 1 file" in capsys.readouterr().out
    assert ProgramCache(cache_dir).entries() == []
    assert not (cache_dir / "stats.json").exists()


def test_cli_entry_point_installed(cache_dir: Path) -> None:
    """`netcl cache` comes from this package's entry point (console script, new process)."""
    exe = Path(sys.executable).with_name("netcl")
    out = subprocess.run(
        [str(exe), "cache", "--dir", str(cache_dir), "stats"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert str(cache_dir) in out.stdout


def test_cli_refuses_untrusted_folder(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cache_dir / "programs").mkdir(parents=True)
    (cache_dir / "programs" / "keep.clprg").write_bytes(b"x")
    os.chmod(cache_dir, 0o777)
    assert cli.main(["cache", "--dir", str(cache_dir), "clear"]) == 1  # refused
    assert "not trusted" in capsys.readouterr().err
    assert cli.main(["cache", "stats", "--dir", str(cache_dir), "--json"]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["exit_code"] == 1 and "entries" not in json.loads(out.out)
    assert (cache_dir / "programs" / "keep.clprg").exists()


def test_a_cap_equal_to_what_the_entries_take_keeps_them_all(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The cap is "at most": entries taking exactly ``--max-bytes`` stay; a byte less evicts."""
    c = ProgramCache(cache_dir)
    for name in "ab":
        c.get_program(ctx, add_src(0.0, f"cap-{name}"), device)
    total = sum(f.size for f in c.entries())
    for cap, left in ((total, 2), (total - 1, 1)):
        assert cli.main(["cache", "prune", "--max-bytes", str(cap), "--dir", str(cache_dir)]) == 0
        capsys.readouterr()
        assert len(ProgramCache(cache_dir).entries()) == left, cap
