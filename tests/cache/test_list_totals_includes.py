"""What ``netcl cache list``, ``stats``, ``clear`` and ``zero`` show (in this process), and which
header a cached program depends on: a special file at an entry's name is listed as damaged with
its kind, the totals of two flushes add up (and those of a flush that failed, once one
succeeds), and a quoted include is looked up beside the header that includes it first (as the
compiler does), so editing that copy is a miss, never a stale hit. A hidden file with the
entry suffix is no entry; totals of exactly the largest size read are shown."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.core import cli
from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._store import _TMP_NAME, SUFFIX


def test_a_fifo_at_an_entry_name_is_listed_as_damaged_with_its_kind(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "list-fifo"), device)
    os.mkfifo(cache_dir / "programs" / f"{'f' * 64}{SUFFIX}")
    assert cli.main(["cache", "list", "--json", "--dir", str(cache_dir)]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["entries"]}
    assert rows["f" * 64]["status"] == "damaged (special: a fifo)"
    assert sorted(r["status"] for r in rows.values()) == ["damaged (special: a fifo)", "ok"]


def test_the_totals_of_two_flushes_add_up(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "totals-1"), device)  # a miss
    c.flush_stats()
    c.get_program(ctx, add_src(0.0, "totals-2"), device)  # another: the counter moves on
    for _ in range(3):
        c.get_program(ctx, add_src(0.0, "totals-2"), device)  # memory hits
    c.flush_stats()  # adds what came since the first flush, not the counters
    c.flush_stats()  # nothing new: adds nothing
    assert cli.main(["cache", "stats", "--json", "--dir", str(cache_dir)]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["misses"], st["memory_hits"]) == (2, 3)


def test_totals_that_cannot_be_saved_are_kept_for_the_next_flush(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "totals-blocked"), device)  # a miss
    (cache_dir / "stats.json").mkdir()  # where the totals go: a folder, so the write fails
    c.flush_stats()  # never raises: statistics do not fail an exit
    (event,) = log_events("cache_stats_not_saved")
    assert (event.path, event.levelname) == (str(cache_dir), "INFO")  # type: ignore[attr-defined]
    assert "Is a directory" in event.error  # type: ignore[attr-defined]  # what went wrong
    (cache_dir / "stats.json").rmdir()
    c.flush_stats()  # what the failed flush held comes now
    assert cli.main(["cache", "stats", "--json", "--dir", str(cache_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["misses"] == 1


def test_the_totals_are_written_under_a_name_the_cache_knows_as_its_own_temporary_file(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a writer killed before its rename leaves that file: prune and clear remove it by its name
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "totals-temp"), device)
    renamed: list[str] = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append(Path(a).name), replace(a, b)))
    c.flush_stats()
    (name,) = renamed
    assert _TMP_NAME.match(name) and name.startswith(".stats."), name


def test_a_quoted_include_is_found_beside_its_includer_first(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    tmp_path: Path,
    check_add: Callable[..., None],
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "offset.h").write_text('#include "value.h"\n#define OFFSET VALUE\n')
    (second / "value.h").write_text("#define VALUE 2.0f\n")  # the one the compiler takes
    (first / "value.h").write_text("#define VALUE 1.0f\n")  # earlier on -I, but not beside
    src = (
        "#include <offset.h>\n"
        "__kernel void add(__global const float *a, __global const float *b,"
        " __global float *c) { int i = get_global_id(0); c[i] = a[i] + b[i] + OFFSET; }\n"
    )
    opts = f"-I {first} -I {second}"
    check_add(ProgramCache(cache_dir).get_program(ctx, src, device, opts), 2.0)
    (second / "value.h").write_text("#define VALUE 3.0f\n")
    c = ProgramCache(cache_dir)
    check_add(c.get_program(ctx, src, device, opts), 3.0)
    assert c.stats.misses == 1 and c.stats.disk_hits == 0


def test_stats_text_shows_the_share_of_the_cap_and_one_line_per_counter(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "100K")
    monkeypatch.setenv("COLUMNS", "200")
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "stats-text"), device)
    c.flush_stats()
    d = ["cache", "stats", "--dir", str(cache_dir)]
    assert cli.main([*d, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert cli.main(d) == 0
    lines = capsys.readouterr().out.splitlines()
    share = 100 * doc["bytes"] / (100 * 1024)
    (size,) = [line for line in lines if line.startswith("cache size")]
    assert size.endswith(f" of 100.0 KiB ({share:.1f} %)")
    counters = [line.split()[0] for line in lines if line.startswith("  ")]
    assert counters[:3] == ["memory_hits", "disk_hits", "misses"]
    assert not [name for name in counters if name.startswith("bytes_")]  # shown on their own line
    assert [line for line in lines if line.startswith("bytes read/written")]


def test_clear_says_how_many_files_it_removed_and_where(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "clear-text"), device)
    assert cli.main(["cache", "clear", "--dir", str(cache_dir)]) == 0
    assert capsys.readouterr().out == f"removed 1 file from {cache_dir}\n"


def test_zero_resets_the_totals_and_keeps_the_entries(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = ["--dir", str(cache_dir)]
    assert cli.main(["cache", "zero", *d]) == 0
    assert capsys.readouterr().out == f"nothing to zero: {cache_dir} (not created yet)\n"
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "zero"), device)
    c.flush_stats()
    assert cli.main(["cache", "zero", *d]) == 0
    assert capsys.readouterr().out == f"statistics zeroed in {cache_dir} (1 entry kept)\n"
    assert cli.main(["cache", "zero", "--json", *d]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 1
    assert cli.main(["cache", "stats", "--json", *d]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["entries"], st["misses"]) == (1, 0)


def test_a_hidden_file_with_the_entry_suffix_is_not_an_entry(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a name starting with a dot is never one the cache writes as an entry: not listed, not
    # counted, not removed by clear
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "hidden-suffix"), device)
    hidden = cache_dir / "programs" / f".{'e' * 64}{SUFFIX}"
    hidden.write_bytes(b"not ours")
    c = ProgramCache(cache_dir)
    (entry,) = c.entries()  # the program's own
    assert not entry.path.name.startswith(".")
    assert cli.main(["cache", "list", "--json", "--dir", str(cache_dir)]) == 0
    assert [r["status"] for r in json.loads(capsys.readouterr().out)["entries"]] == ["ok"]
    assert c.clear() == 1 and hidden.exists()


def test_totals_of_exactly_the_largest_size_read_are_shown(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ProgramCache(cache_dir).entries()  # makes the folders
    body = b'{"disk_hits": 5, "misses": 7}'
    (cache_dir / "stats.json").write_bytes(body + b" " * ((1 << 20) - len(body)))  # 1 MiB
    assert cli.main(["cache", "stats", "--json", "--dir", str(cache_dir)]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["disk_hits"], st["misses"]) == (5, 7)
    (cache_dir / "stats.json").write_bytes(body + b" " * (1 << 20))  # larger: not read
    assert cli.main(["cache", "stats", "--json", "--dir", str(cache_dir)]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["disk_hits"], st["misses"]) == (0, 0)


def test_totals_that_are_not_an_object_or_not_counts_read_as_none(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stats.json another tool overwrote (a list, a number, counts that are not integers)
    shows zeros, not an error."""
    ProgramCache(cache_dir).entries()  # makes the folders
    for body in ("[1, 2]", "7", '{"misses": "7", "disk_hits": 2.5}'):
        (cache_dir / "stats.json").write_text(body)
        assert cli.main(["cache", "stats", "--json", "--dir", str(cache_dir)]) == 0
        st = json.loads(capsys.readouterr().out)
        assert (st["disk_hits"], st["misses"]) == (0, 0), body
