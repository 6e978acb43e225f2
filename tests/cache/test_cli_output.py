"""The whole of what each `netcl cache` action prints, as text and as JSON, on a folder whose
every file the test made: labels, values, plurals, column headers and alignment, the notes on a
folder not created yet or turned off, the one-line errors (and their JSON documents) with their
exit codes, and the help of every action. Sizes are read from the files themselves (bytes on
disk); paths come from the test's own folders."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyopencl as cl
import pytest

from netcl.core import cli, table
from netcl.core.table import human
from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._store import COUNTERS, SUFFIX, DiskStore

CAP = 1 << 20  # NETCL_CACHE_MAX_BYTES=1M in these tests
LIVE_TEMP = f".{'d' * 64}.{os.getpid()}.abc123.tmp"  # a writer still running: this process
DEAD_TEMP = f".{'e' * 64}.abc123.tmp"  # the older naming, an hour old: a writer that is gone
#: distinct totals for every counter, so that a sum or a label taken from the wrong one shows
TOTALS = {name: 10 + i for i, name in enumerate(COUNTERS)} | {
    "bytes_read": 3 << 10,
    "bytes_written": 5 << 20,
}


@pytest.fixture(autouse=True)
def _plain_terminal(fresh_remote: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No remote, no cache settings but the cap, no terminal width: whole lines."""
    for name in ("COLUMNS", "NETCL_CACHE_DISABLE", "NETCL_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "1M")


def _on_disk(path: Path) -> int:
    """Bytes a file takes as the cache counts them: its size, or its allocated blocks when
    fewer (a sparse file); 0 for what is not a regular file."""
    st = os.lstat(path)
    return min(st.st_size, st.st_blocks * 512) if path.is_file() and not path.is_symlink() else 0


def _run(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> tuple[str, str]:
    """``netcl cache ARGV`` in this process: (stdout, stderr), its exit code checked."""
    assert cli.main(["cache", *argv]) == code, capsys.readouterr()
    out, err = capsys.readouterr()
    return out, err


def _json(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> Any:
    """The one JSON document of ``netcl cache ARGV --json``, checked to be printed sorted with
    an indent of 2 and one final newline."""
    out, _ = _run(capsys, *argv, "--json", code=code)
    doc = json.loads(out)
    assert out == json.dumps(doc, indent=2, sort_keys=True) + "\n", out
    return doc


def _folder(root: Path) -> None:
    """The cache's folders (0700), as the cache makes them."""
    ProgramCache(root).entries()


def _temps(root: Path) -> dict[str, Path]:
    """A temporary file of a running writer (100 bytes) and one of a writer gone (200 bytes)."""
    live, dead = root / "programs" / LIVE_TEMP, root / "programs" / DEAD_TEMP
    live.write_bytes(b"l" * 100)
    dead.write_bytes(b"g" * 200)
    os.utime(dead, (1, 1))
    return {"live": live, "dead": dead}


# stats --------------------------------------------------------------------------------------


def _stats_folder(root: Path) -> dict[str, int]:
    """Two regular entries (1000 and 3000 bytes: `stats` counts files, it does not read them),
    a FIFO at an entry's name, two temporary files and the totals; the bytes of each part."""
    _folder(root)
    programs = root / "programs"
    (programs / f"{'a' * 64}{SUFFIX}").write_bytes(b"a" * 1000)
    (programs / f"{'b' * 64}{SUFFIX}").write_bytes(b"b" * 3000)
    os.mkfifo(programs / f"{'c' * 64}{SUFFIX}")
    temps = _temps(root)
    (root / "stats.json").write_text(json.dumps(TOTALS))
    entry_bytes = sum(_on_disk(p) for p in programs.glob(f"*{SUFFIX}"))
    return {"entry_bytes": entry_bytes, "temp_bytes": sum(map(_on_disk, temps.values()))}


def _stats_doc(root: Path, **over: Any) -> dict[str, Any]:
    hits = TOTALS["memory_hits"] + TOTALS["disk_hits"] + TOTALS["remote_hits"]
    doc = {
        "cache_dir": str(root),
        "exists": True,
        **TOTALS,
        "enabled": True,
        "entries": 2,
        "other_files": 1,
        "temp_files": 2,
        "live_temp_files": 1,
        "max_bytes": CAP,
        "hits": hits,
        "lookups": hits + TOTALS["misses"],
        "remote": {"configured": False},
    }
    doc.update(over)
    return doc


def _stats_text(
    doc: dict[str, Any],
    dir_note: str = "",
    entries: str = "2 (+1 not regular files)",
    hits: str | None = None,
) -> str:
    """The text of `stats` for ``doc``: the labels a column 22 wide, two spaces, the value."""
    used, cap, lookups = doc["bytes"], doc["max_bytes"], doc["lookups"]
    share = f"{100 * used / cap:.1f}" if cap else "0.0"
    if hits is None:
        hits = f"{doc['hits']} ({100 * doc['hits'] / lookups:.1f} % of {lookups} lookups)"
    lines = [
        f"cache dir               {doc['cache_dir']}{dir_note}",
        f"entries                 {entries}",
        f"cache size              {human(used)} of {human(cap)} ({share} %)",
        f"temporary files         {doc['temp_files']} ({human(doc['temp_bytes'])}, "
        f"{doc['live_temp_files']} of running writers)",
        f"hits                    {hits}",
        f"  memory_hits           {doc['memory_hits']}",
        f"  disk_hits             {doc['disk_hits']}",
        f"  misses                {doc['misses']}",
        f"  compiles              {doc['compiles']}",
        f"  recoveries            {doc['recoveries']}",
        f"  corrupt               {doc['corrupt']}",
        f"  write_errors          {doc['write_errors']}",
        f"  lock_timeouts         {doc['lock_timeouts']}",
        f"  evictions             {doc['evictions']}",
        f"  remote_hits           {doc['remote_hits']}",
        f"  remote_writes         {doc['remote_writes']}",
        f"  remote_errors         {doc['remote_errors']}",
        f"  remote_rejected       {doc['remote_rejected']}",
        f"  remote_waits          {doc['remote_waits']}",
        f"  remote_lock_timeouts  {doc['remote_lock_timeouts']}",
        f"bytes read/written      {human(doc['bytes_read'])} / {human(doc['bytes_written'])}",
        f"remote                  {doc['remote_line']}",
    ]
    return "\n".join(lines) + "\n"


def test_stats_prints_every_total_size_and_file_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stats` on a folder with entries, a FIFO, a running and a dead writer's temporary file
    and totals: the JSON document and the text, whole."""
    root = tmp_path / "cache"
    sizes = _stats_folder(root)
    expected = _stats_doc(root, **sizes, bytes=sizes["entry_bytes"] + sizes["temp_bytes"])
    assert _json(capsys, "stats", "--dir", str(root)) == expected
    out, err = _run(capsys, "stats", "--dir", str(root))
    expected["remote_line"] = "not configured (NETCL_CACHE_REMOTE)"
    assert out == _stats_text(expected) and err == ""


def test_stats_notes_a_folder_turned_off_or_not_created_and_a_cap_of_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NETCL_CACHE_DISABLE=1 is named after the folder; a folder not there yet reads as empty
    (no lookups: no share of hits), and a cap of 0 is shown as 0.0 % used."""
    root = tmp_path / "cache"
    sizes = _stats_folder(root)
    monkeypatch.setenv("NETCL_CACHE_DISABLE", "1")
    doc = _json(capsys, "stats", "--dir", str(root))
    assert doc == _stats_doc(
        root, **sizes, bytes=sizes["entry_bytes"] + sizes["temp_bytes"], enabled=False
    )
    out, _ = _run(capsys, "stats", "--dir", str(root))
    doc["remote_line"] = "not configured (NETCL_CACHE_REMOTE)"
    assert out == _stats_text(doc, " (disabled by NETCL_CACHE_DISABLE)")

    monkeypatch.delenv("NETCL_CACHE_DISABLE")
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "0")
    missing = tmp_path / "not-yet"
    doc = _json(capsys, "stats", "--dir", str(missing))
    zeros = dict.fromkeys(COUNTERS, 0)
    assert doc == {
        **_stats_doc(missing, **zeros),
        "exists": False,
        "entries": 0,
        "other_files": 0,
        "entry_bytes": 0,
        "temp_files": 0,
        "temp_bytes": 0,
        "live_temp_files": 0,
        "bytes": 0,
        "max_bytes": 0,
        "hits": 0,
        "lookups": 0,
    }
    out, _ = _run(capsys, "stats", "--dir", str(missing))
    doc["remote_line"] = "not configured (NETCL_CACHE_REMOTE)"
    assert out == _stats_text(doc, " (not created yet)", entries="0", hits="0")
    assert not missing.exists()


@pytest.mark.parametrize(
    ("url", "line"),
    [
        (
            "redis://:pw@127.0.0.1:{port}/0?socket_timeout=0",
            "redis://***@127.0.0.1:{port}/0?socket_timeout=0  not used (see the cache_remote_* "
            "warning)",
        ),
        ("redis://:pw@127.0.0.1:{port}/0", "redis://***@127.0.0.1:{port}/0  unreachable ({error})"),
    ],
)
def test_stats_says_why_a_configured_remote_is_not_used(
    url: str,
    line: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    unused_port: int,
) -> None:
    """A remote whose URL redis-py refuses is "not used", one nobody listens on "unreachable"
    with the error of the PING; the password is never shown."""
    pytest.importorskip("redis", reason="redis-py missing: pip install 'netcl-cache[redis]'")
    root = tmp_path / "cache"
    _folder(root)
    monkeypatch.setenv("NETCL_CACHE_REMOTE", url.format(port=unused_port))
    monkeypatch.setenv("NETCL_CACHE_REMOTE_KEY", "k")
    remote = _json(capsys, "stats", "--dir", str(root))["remote"]
    out, _ = _run(capsys, "stats", "--dir", str(root))
    expected = line.format(port=unused_port, error=remote.get("error"))
    assert out.splitlines()[-1] == f"remote                  {expected}"
    assert ":pw@" not in out


@pytest.fixture
def unused_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# list ---------------------------------------------------------------------------------------


@pytest.fixture
def list_folder(
    ctx: cl.Context, device: cl.Device, tmp_path: Path, add_src: Callable[..., str]
) -> Path:
    """Two valid entries (one built with options), a damaged one, a FIFO at an entry's name,
    each last used at a time of its own, and the two temporary files."""
    root = tmp_path / "cache"
    c = ProgramCache(root)
    c.get_program(ctx, add_src(0.0, "list-plain"), device)
    c.get_program(ctx, add_src(0.0, "list-opts"), device, options="-DX=1")
    programs = root / "programs"
    (programs / f"{'f' * 64}{SUFFIX}").write_bytes(b"junk")
    os.mkfifo(programs / f"{'0' * 64}{SUFFIX}")
    for age, entry in enumerate(sorted(programs.glob(f"*{SUFFIX}"))):
        os.utime(entry, (1_000_000_000 + 3600 * age,) * 2, follow_symlinks=False)
    _temps(root)
    return root


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def test_list_prints_each_entry_and_temporary_file(
    list_folder: Path, device: cl.Device, capsys: pytest.CaptureFixture[str]
) -> None:
    """`list`: one row per entry, least recently used first (key, size, last use, device and
    options, or why it is damaged), then the temporary files with their writer's state."""
    root = list_folder
    doc = _json(capsys, "list", "--dir", str(root))
    programs = root / "programs"
    files = sorted(programs.glob(f"*{SUFFIX}"), key=lambda p: os.lstat(p).st_mtime)
    rows = []
    for p in files:
        key = p.name.removesuffix(SUFFIX)
        row = {
            "key": key,
            "kind": "fifo" if key == "0" * 64 else "file",
            "bytes": _on_disk(p),
            "last_used": os.lstat(p).st_mtime,
            "status": "ok",
            "device": device.name,
            "options": "",
        }
        if key == "0" * 64:
            row.update(status="damaged (special: a fifo)", device=None, options=None)
        elif key == "f" * 64:
            row.update(status="damaged (truncated: 4 bytes)", device=None, options=None)
        rows.append(row)
    with_opts = [r for r in rows if r["status"] == "ok"]
    assert len(with_opts) == 2
    by_key = {r["key"]: r for r in doc["entries"]}
    for r in with_opts:  # which of the two was built with the options
        r["options"] = by_key[r["key"]]["options"]
    assert sorted(r["options"] for r in with_opts) == ["", "-DX=1"]
    live = programs / LIVE_TEMP
    temp_files = [
        {
            "name": LIVE_TEMP,
            "bytes": _on_disk(live),
            "mtime": live.stat().st_mtime,
            "pid": os.getpid(),
            "writer_running": True,
        },
        {
            "name": DEAD_TEMP,
            "bytes": _on_disk(programs / DEAD_TEMP),
            "mtime": 1.0,
            "pid": None,
            "writer_running": False,
        },
    ]
    assert sorted(doc["temp_files"], key=lambda t: t["name"]) == temp_files  # in folder order
    assert doc == {
        "cache_dir": str(root),
        "exists": True,
        "entries": rows,
        "temp_files": doc["temp_files"],
    }

    out, err = _run(capsys, "list", "--dir", str(root))
    entry_rows = [
        (
            r["key"][:16],
            human(r["bytes"]),
            _when(r["last_used"]),
            *((r["device"], r["options"] or "-") if r["status"] == "ok" else (r["status"], "")),
        )
        for r in rows
    ]
    temp_rows = [
        (t["name"], human(t["bytes"]), t["pid"], "running" if t["writer_running"] else "gone")
        for t in doc["temp_files"]
    ]
    lines = [
        *table.table(entry_rows, ["KEY", "SIZE", "LAST USED", "DEVICE", "OPTIONS"], right=[1]),
        "",
        *table.table(temp_rows, ["TEMPORARY FILE", "SIZE", "WRITER", "STATE"], right=[1, 2]),
        "4 entries, 2 temporary files",
    ]
    assert out == "\n".join(lines) + "\n" and err == ""
    # the columns as a reader sees them: sizes and pids right-aligned under their headers
    head, first = out.splitlines()[0], out.splitlines()[1]
    assert head.startswith("KEY               ") and first.startswith(rows[0]["key"][:16] + "  ")
    assert head.index("LAST USED") == first.index(_when(rows[0]["last_used"]))
    temp_head = out.splitlines()[6]
    assert temp_head.startswith("TEMPORARY FILE".ljust(len(LIVE_TEMP)) + "  ")
    assert temp_head.endswith("SIZE  WRITER  STATE")


def test_list_of_temporary_files_only_and_of_a_folder_not_created_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No entries: no entry table (and no blank line before the temporary files); a folder not
    there yet says so after the counts."""
    root = tmp_path / "cache"
    _folder(root)
    _temps(root)
    out, _ = _run(capsys, "list", "--dir", str(root))
    lines = out.splitlines()
    assert lines[0].split() == ["TEMPORARY", "FILE", "SIZE", "WRITER", "STATE"]
    assert lines[1].startswith(LIVE_TEMP) or lines[1].startswith(DEAD_TEMP)
    assert lines[-1] == "0 entries, 2 temporary files" and len(lines) == 4
    assert {line.split()[-1] for line in lines[1:3]} == {"running", "gone"}
    assert f"{os.getpid()}  running" in out

    missing = tmp_path / "not-yet"
    out, _ = _run(capsys, "list", "--dir", str(missing))
    assert out == f"0 entries, 0 temporary files\ncache dir: {missing} (not created yet)\n"
    assert _json(capsys, "list", "--dir", str(missing)) == {
        "cache_dir": str(missing),
        "exists": False,
        "entries": [],
        "temp_files": [],
    }


# clear, zero, prune -------------------------------------------------------------------------


def test_clear_zero_and_prune_say_what_they_did(
    list_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each action's one line and JSON document, counts in the right plural."""
    root = list_folder
    (root / "stats.json").write_text(json.dumps(TOTALS))
    d = ["--dir", str(root)]
    # prune: the damaged entry and the FIFO, the dead writer's file; the cap of the environment
    assert _json(capsys, "prune", *d) == {
        "cache_dir": str(root),
        "exists": True,
        "max_bytes": CAP,
        "damaged": 2,
        "temp": 1,
        "evicted": 0,
    }
    (root / "programs" / DEAD_TEMP).write_bytes(b"g")
    os.utime(root / "programs" / DEAD_TEMP, (1, 1))
    out, _ = _run(capsys, "prune", "--max-bytes", "1", *d)
    assert out == (
        "removed 0 damaged entries, 1 temporary file of writers that are gone, evicted 2 entries\n"
    )
    assert len(ProgramCache(root).entries()) == 0

    (root / "programs" / f"{'f' * 64}{SUFFIX}").write_bytes(b"junk")
    (root / "programs" / f"{'1' * 64}{SUFFIX}").write_bytes(b"junk")
    out, _ = _run(capsys, "prune", "--max-bytes", "1", *d)
    assert out == (
        "removed 2 damaged entries, 0 temporary files of writers that are gone, evicted 0 entries\n"
    )

    # zero: the totals go, the entries stay
    for key in "ab":
        (root / "programs" / f"{key * 64}{SUFFIX}").write_bytes(b"x")
    out, _ = _run(capsys, "zero", *d)
    assert out == f"statistics zeroed in {root} (2 entries kept)\n"
    assert _json(capsys, "zero", *d) == {
        "cache_dir": str(root),
        "exists": True,
        "zeroed": False,
        "entries": 2,
    }
    (root / "stats.json").write_text(json.dumps(TOTALS))
    assert _json(capsys, "zero", *d)["zeroed"] is True

    # clear: every entry and the totals; the running writer's file stays
    (root / "stats.json").write_text(json.dumps(TOTALS))
    out, _ = _run(capsys, "clear", *d)
    assert out == f"removed 2 files from {root} (kept 1 temporary file of running writers)\n"
    assert not (root / "stats.json").exists()
    (root / "programs" / f"{'a' * 64}{SUFFIX}").write_bytes(b"x")
    assert _json(capsys, "clear", *d) == {
        "cache_dir": str(root),
        "exists": True,
        "removed": 1,
        "kept_temp_files": 1,
    }
    (root / "programs" / LIVE_TEMP).unlink()
    out, _ = _run(capsys, "clear", *d)
    assert out == f"removed 0 files from {root}\n"

    missing = root.parent / "not-yet"
    assert _json(capsys, "zero", "--dir", str(missing)) == {
        "cache_dir": str(missing),
        "exists": False,
        "zeroed": False,
        "entries": 0,
    }
    out, _ = _run(capsys, "prune", "--dir", str(missing))
    assert out == (
        "removed 0 damaged entries, 0 temporary files of writers that are gone, evicted 0 entries\n"
    )


def test_the_folder_defaults_to_netcl_cache_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --dir every action works on NETCL_CACHE_DIR; without NETCL_CACHE_MAX_BYTES the
    cap is 1 GiB."""
    root = tmp_path / "from-env"
    monkeypatch.setenv("NETCL_CACHE_DIR", str(root))
    monkeypatch.delenv("NETCL_CACHE_MAX_BYTES")
    for action in ("stats", "list", "clear", "zero", "prune"):
        assert _json(capsys, action)["cache_dir"] == str(root), action
    assert _json(capsys, "prune")["max_bytes"] == _json(capsys, "stats")["max_bytes"] == 1 << 30
    assert _run(capsys, "zero")[0] == f"nothing to zero: {root} (not created yet)\n"


# errors -------------------------------------------------------------------------------------


def test_a_folder_the_cache_refuses_is_one_line_and_one_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 1 and "netcl cache ACTION: unusable: <why>" on stderr, nothing on stdout; with
    --json the document names the folder, the error and the exit code, and nothing else."""
    untrusted = tmp_path / "untrusted"
    untrusted.mkdir()
    os.chmod(untrusted, 0o777)
    why = f"unusable: {untrusted} is not trusted (writable by group or others (mode 0777))"
    too_long = tmp_path / ("x" * 300)  # the folder cannot even be looked at
    long_why = f"unusable: {too_long}: File name too long"
    for root, message in ((untrusted, why), (too_long, long_why)):
        for action in ("stats", "list", "clear", "zero", "prune"):
            out, err = _run(capsys, action, "--dir", str(root), code=1)
            assert (out, err) == ("", f"netcl cache {action}: {message}\n")
            doc = _json(capsys, action, "--dir", str(root), code=1)
            assert doc == {"cache_dir": str(root), "error": message, "exit_code": 1}


def test_a_bad_setting_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad NETCL_CACHE_MAX_BYTES or NETCL_CACHE_DISABLE: exit 2, the setting's own message."""
    root = str(tmp_path / "cache")
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "10X")
    message = (
        "NETCL_CACHE_MAX_BYTES: expected a byte count such as 1073741824, 500M or 2G, got '10X'"
    )
    for action in ("stats", "prune"):
        assert _run(capsys, action, "--dir", root, code=2) == (
            "",
            f"netcl cache {action}: {message}\n",
        )
        assert _json(capsys, action, "--dir", root, code=2) == {
            "cache_dir": root,
            "error": message,
            "exit_code": 2,
        }
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "1M")
    monkeypatch.setenv("NETCL_CACHE_DISABLE", "maybe")
    _, err = _run(capsys, "stats", "--dir", root, code=2)
    assert err.startswith("netcl cache stats: NETCL_CACHE_DISABLE") and err.count("\n") == 1


def test_a_bad_max_bytes_option_names_the_option_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-bytes is checked by the parser: exit 2 and argparse's line with parse_size's
    message, without its own name in front."""
    with pytest.raises(SystemExit) as info:
        cli.main(["cache", "prune", "--max-bytes", "lots", "--dir", str(tmp_path)])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "netcl cache prune: error: argument --max-bytes: expected a byte count such as "
        "1073741824, 500M or 2G, got 'lots' (see 'netcl cache prune --help')"
    )


@pytest.mark.parametrize(
    ("action", "refused"),
    [("clear", "programs"), ("clear", "stats.json"), ("zero", "stats.json"), ("prune", "programs")],
)
def test_a_change_the_file_system_refuses_is_one_line_naming_the_folder(
    action: str,
    refused: str,
    list_folder: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EROFS on a removal of an entry or of the totals (tests run as root, whom chmod does not
    stop): exit 1, "cannot change <folder>: Read-only file system", nothing on stdout."""
    root = list_folder
    (root / "stats.json").write_text(json.dumps(TOTALS))
    target = root / refused
    real_unlink = os.unlink

    def unlink(path: str | os.PathLike[str], *a: Any, **kw: Any) -> None:
        if str(path).startswith(str(target)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    message = f"cannot change {root}: Read-only file system"
    assert _run(capsys, action, "--dir", str(root), code=1) == (
        "",
        f"netcl cache {action}: {message}\n",
    )
    assert _json(capsys, action, "--dir", str(root), code=1) == {
        "cache_dir": str(root),
        "error": message,
        "exit_code": 1,
    }


# help ---------------------------------------------------------------------------------------


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The help of ``netcl ARGV --help``, its whitespace folded."""
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_help_names_every_action_and_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`netcl --help`, `netcl cache --help` and each action's help say what it does."""
    monkeypatch.setenv("COLUMNS", "200")
    assert "cache the OpenCL program cache: stats, list, clear, zero, prune" in _help(capsys)
    text = _help(capsys, "cache")
    options = (
        "--dir DIR cache folder (default: NETCL_CACHE_DIR or ~/.cache/netcl) "
        "--json print exactly one JSON document on stdout (messages go to stderr)"
    )
    assert text.startswith(
        "usage: netcl cache [-h] [--dir DIR] [--json] ACTION ... "
        "Exit codes: 0 done, 1 refused or failed, 2 usage. "
    )
    assert text.endswith(options)
    docs = {
        "stats": "size, entries, temporary files and hit/miss totals",
        "list": "one line per entry (least recently used first) and temporary file",
        "clear": "delete every entry and the hit/miss totals (a running writer's temporary "
        "file stays)",
        "zero": "reset the hit/miss statistics to zero (entries stay)",
        "prune": "delete damaged entries and temporary files of writers that are gone, then "
        "evict least recently used entries down to the size cap",
    }
    assert "ACTION " + " ".join(f"{a} {d}" for a, d in docs.items()) + " options:" in text
    for action, doc in docs.items():
        sub = _help(capsys, "cache", action)
        extra = " [--max-bytes SIZE]" if action == "prune" else ""
        assert sub.startswith(
            f"usage: netcl cache {action} [-h] [--dir DIR] [--json]{extra} {doc} options:"
        ), sub
        assert options in sub
    assert _help(capsys, "cache", "prune").endswith(
        "--max-bytes SIZE cap to prune to, e.g. 500M (default: the cache's cap)"
    )


def test_list_goes_on_past_an_entry_removed_meanwhile(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry another process removes between the folder's listing and the reading of its
    metadata is left out of `list`; the entries after it are still listed."""
    root = tmp_path / "cache"
    c = ProgramCache(root)
    c.get_program(ctx, add_src(0.0, "gone-first"), device)
    c.get_program(ctx, add_src(0.0, "stays"), device)
    files = sorted((root / "programs").glob(f"*{SUFFIX}"))
    os.utime(files[0], (1_000_000_000,) * 2)  # the oldest: listed first
    os.utime(files[1], (1_000_003_600,) * 2)
    listing = DiskStore.entries

    def entries_then_remove(self: DiskStore) -> list[Any]:
        found = listing(self)
        files[0].unlink(missing_ok=True)  # another process prunes it now
        return found

    monkeypatch.setattr(DiskStore, "entries", entries_then_remove)
    doc = _json(capsys, "list", "--dir", str(root))
    assert [r["key"] for r in doc["entries"]] == [files[1].name.removesuffix(SUFFIX)]
    assert doc["entries"][0]["status"] == "ok" and doc["entries"][0]["device"] == device.name
