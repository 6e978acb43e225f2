"""Hostile files at an entry's path (FIFO, links, folders, huge sparse files), writers killed
before their rename, running writers, and bad configuration: a correct program every time, no
hang, and `netcl cache` handles every kind of file it finds."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.core import cli
from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._config import DEFAULT_MAX_BYTES
from netcl.runtime.cache._entry import HEADER, EntryError, decode
from netcl.runtime.cache._store import DiskStore

GB8 = 8 << 30


def _huge_after_valid_header(p: Path) -> None:
    os.truncate(p, GB8)  # a valid entry followed by 8 GB of holes


def _header_claims_1tb(p: Path) -> None:
    data = bytearray(p.read_bytes())
    struct.pack_into("<Q", data, 16, 1 << 40)  # payload length
    p.write_bytes(bytes(data))


def _folder(p: Path) -> None:
    p.unlink()
    (p / "inner").mkdir(parents=True)
    (p / "inner" / "file").write_bytes(b"x" * 100)


def _link_to(target: str) -> Callable[[Path], None]:
    def make(p: Path) -> None:
        p.unlink()
        os.symlink(target, p)

    return make


def _link_to_copy(p: Path) -> None:
    # a link to a valid copy of the very entry: still refused (a link may point anywhere)
    copy = p.with_name("copy-elsewhere")
    os.replace(p, copy)
    os.symlink(copy, p)


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def _socket(p: Path) -> None:
    p.unlink()
    here = os.getcwd()
    os.chdir(p.parent)  # a relative name: socket paths are limited to 108 bytes
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(p.name)  # the file stays after close: open() on it fails with ENXIO
    finally:
        os.chdir(here)


def _sparse_zeros(p: Path) -> None:
    p.unlink()
    with open(p, "wb") as f:
        f.truncate(GB8)


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "symlink-dev-zero": _link_to("/dev/zero"),
    "symlink-to-valid-copy": _link_to_copy,
    "sparse-8GB-zeros": _sparse_zeros,
    "sparse-8GB-after-valid-entry": _huge_after_valid_header,
    "header-claims-1TB": _header_claims_1tb,
    "folder": _folder,
    "socket": _socket,
}


# what the warning says of each (the start of its reason)
REASONS = {
    "fifo": "special: a FIFO",
    "symlink-dev-zero": "special: a symbolic link",
    "symlink-to-valid-copy": "special: a symbolic link",
    "sparse-8GB-zeros": "truncated",  # read up to the header only: no magic there
    "sparse-8GB-after-valid-entry": "oversized",
    "header-claims-1TB": "oversized",
    "folder": "special: a directory",
    "socket": "special: a socket",
}


def _only_entries(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in (cache_dir / "programs").iterdir())


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_entry_is_rebuilt_once(
    kind: str,
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
    no_hang: None,
) -> None:
    src = add_src(4.0, f"hostile-{kind}")
    ProgramCache(cache_dir).get_program(ctx, src, device)
    (entry,) = ProgramCache(cache_dir).entries()
    HOSTILE[kind](entry.path)
    c = ProgramCache(cache_dir)
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
        check_add(c.get_program(ctx, src, device), 4.0)
    assert c.stats.recoveries == 1 and c.stats.corrupt == 1, c.stats
    assert c.stats.write_errors == 0 and c.stats.compiles == 1
    (event,) = log_events("cache_entry_corrupt")
    assert event.reason.startswith(REASONS[kind]), event.reason  # type: ignore[attr-defined]
    # rebuilt as a regular, valid file: the next process loads it, nothing is recovered again
    assert stat.S_ISREG(os.lstat(entry.path).st_mode)
    assert entry.path.stat().st_size < 1 << 20
    decode(entry.path.read_bytes(), entry.key)
    c2 = ProgramCache(cache_dir)
    check_add(c2.get_program(ctx, src, device), 4.0)
    assert c2.stats.disk_hits == 1 and c2.stats.recoveries == 0 and c2.stats.corrupt == 0
    # no temporary file or folder moved aside is left behind
    assert [n for n in _only_entries(cache_dir) if n.startswith(".")] == []


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_cli_handles_hostile_entry(
    kind: str,
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    capsys: pytest.CaptureFixture[str],
    no_hang: None,
) -> None:
    good_src, bad_src = add_src(1.0, f"cli-good-{kind}"), add_src(2.0, f"cli-bad-{kind}")
    c = ProgramCache(cache_dir)
    c.get_program(ctx, good_src, device)
    good = c.entries()[0]
    c.get_program(ctx, bad_src, device)
    (bad,) = [f for f in c.entries() if f.key != good.key]
    HOSTILE[kind](bad.path)
    d = ["--dir", str(cache_dir)]

    assert cli.main(["cache", "list", "--json", *d]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["entries"]}
    assert rows[good.key]["status"] == "ok"
    assert rows[bad.key]["status"].startswith("damaged"), rows[bad.key]
    assert rows[good.key]["bytes"] == good.path.stat().st_size
    if REASONS[kind].startswith("special"):  # what it holds is not the cache's: counted as 0
        assert rows[bad.key]["bytes"] == 0, rows[bad.key]
    elif kind.startswith("sparse"):  # the blocks it takes on disk, not its 8 GB
        assert rows[bad.key]["bytes"] == bad.path.stat().st_blocks * 512 < GB8, rows[bad.key]

    assert cli.main(["cache", *d, "stats", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["entries"] + st["other_files"] == 2
    assert st["bytes"] < 1 << 30  # a sparse file counts its blocks, not its 8 GB
    assert st["entry_bytes"] == rows[good.key]["bytes"] + rows[bad.key]["bytes"], st

    assert cli.main(["cache", "prune", *d, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["damaged"] == 1
    assert not os.path.lexists(bad.path)
    check_add(ProgramCache(cache_dir).get_program(ctx, good_src, device), 1.0)  # untouched

    # clear removes every kind (a link, not its target)
    c.get_program(ctx, add_src(3.0, f"cli-again-{kind}"), device)
    HOSTILE[kind](ProgramCache(cache_dir).entries()[-1].path)
    assert cli.main(["cache", "clear", *d]) == 0
    assert "removed 2 files" in capsys.readouterr().out
    assert [n for n in _only_entries(cache_dir) if n.endswith(".clprg")] == []
    assert os.path.exists("/dev/zero")


# writers killed before their rename, and writers still running --------------------------------

WRITER = textwrap.dedent("""
    import json, os, signal, sys, time
    from netcl.core import device
    from netcl.runtime.cache import ProgramCache

    root, mode, flag, src = sys.argv[1:5]
    real = os.replace

    def replace(a, b, *args, **kw):
        if str(a).endswith(".tmp") and str(b).endswith(".clprg"):  # the entry's rename
            open(flag + ".ready", "w").close()
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            deadline = time.time() + 60
            while not os.path.exists(flag + ".go") and time.time() < deadline:
                time.sleep(0.02)
        return real(a, b, *args, **kw)

    os.replace = replace
    ctx = device.default_context()
    c = ProgramCache(root)
    c.get_program(ctx, src, ctx.devices[0])
    print(json.dumps(c.stats.as_dict()))
""")


def _writer(cache_dir: Path, mode: str, flag: Path, src: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(cache_dir), mode, str(flag), src],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 90
    while not Path(str(flag) + ".ready").exists():
        assert proc.poll() is None or mode == "kill", proc.communicate()
        assert time.time() < deadline, "the writer never reached its rename"
        time.sleep(0.05)
    return proc


def _stats(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    assert cli.main(["cache", "stats", "--dir", str(cache_dir), "--json"]) == 0
    doc: dict[str, int] = json.loads(capsys.readouterr().out)
    return doc


def test_killed_writer_temp_is_counted_and_pruned(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "killed-old"), device)
    src = add_src(7.0, "killed")
    proc = _writer(cache_dir, "kill", tmp_path / "flag", src)
    proc.communicate(timeout=60)
    assert proc.returncode == -9
    (temp,) = DiskStore(cache_dir).temp_files()
    assert temp.pid == proc.pid and not temp.alive
    assert temp.path.name.startswith(".") and f".{proc.pid}." in temp.path.name
    st = _stats(cache_dir, capsys)
    assert st["temp_files"] == 1 and st["live_temp_files"] == 0
    assert st["temp_bytes"] == temp.size > 10_000
    assert st["bytes"] == st["entry_bytes"] + st["temp_bytes"]
    # the temporary file counts against the cap: one entry alone would fit, both do not
    (old,) = DiskStore(cache_dir).entries()
    assert len(DiskStore(cache_dir).evict(old.size + temp.size - 1, keep=old.key)) == 0
    assert len(DiskStore(cache_dir).evict(old.size + temp.size - 1)) == 1
    # prune removes it at once: its writer is gone (not an hour later)
    assert cli.main(["cache", "prune", "--json", "--dir", str(cache_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["temp"] == 1
    assert DiskStore(cache_dir).temp_files() == []
    check_add(ProgramCache(cache_dir).get_program(ctx, src, device), 7.0)


def test_clear_and_prune_spare_a_running_writer(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = add_src(8.0, "live-writer")
    flag = tmp_path / "flag"
    proc = _writer(cache_dir, "wait", flag, src)
    try:
        st = _stats(cache_dir, capsys)
        assert st["temp_files"] == 1 and st["live_temp_files"] == 1
        d = ["--dir", str(cache_dir), "--json"]
        assert cli.main(["cache", "prune", *d]) == 0
        assert json.loads(capsys.readouterr().out)["temp"] == 0
        assert cli.main(["cache", "clear", *d]) == 0
        assert json.loads(capsys.readouterr().out)["kept_temp_files"] == 1
    finally:
        Path(str(flag) + ".go").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["write_errors"] == 0  # its rename still found its file
    c = ProgramCache(cache_dir)
    check_add(c.get_program(ctx, src, device), 8.0)
    assert c.stats.disk_hits == 1


# configuration errors ---------------------------------------------------------------------------


def test_bad_max_bytes_env_never_fails_get_program(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = f"10X-{cache_dir.parent.name}"  # a value this process has not warned about yet
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", bad)
    c = ProgramCache(cache_dir)
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
        for i in range(2):  # misses: compile, write, evict under the default cap
            check_add(c.get_program(ctx, add_src(float(i), "badenv"), device), float(i))
        check_add(c.get_program(ctx, add_src(0.0, "badenv"), device), 0.0)  # a hit
        check_add(ProgramCache(cache_dir).get_program(ctx, add_src(1.0, "badenv"), device), 1.0)
    (event,) = log_events("cache_config_invalid")  # once, not per call or per instance
    assert event.variable == "NETCL_CACHE_MAX_BYTES" and event.value == bad  # type: ignore[attr-defined]
    # why the value was refused, in the words `netcl config` uses, and what is used instead
    assert event.error == (
        "NETCL_CACHE_MAX_BYTES: expected a byte count such as "  # type: ignore[attr-defined]
        f"1073741824, 500M or 2G, got {bad!r}"
    )
    assert event.using == str(DEFAULT_MAX_BYTES)  # type: ignore[attr-defined]
    assert c.max_bytes == DEFAULT_MAX_BYTES and len(c.entries()) == 2


def test_bad_disable_env_warns_and_keeps_the_disk_tier(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NETCL_CACHE_DISABLE", f"maybe-{cache_dir.parent.name}")
    c = ProgramCache(cache_dir)
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
        check_add(c.get_program(ctx, add_src(2.0, "baddisable"), device), 2.0)
        check_add(c.get_program(ctx, add_src(3.0, "baddisable"), device), 3.0)
    (event,) = log_events("cache_config_invalid")
    assert (event.variable, event.value, event.using) == (  # type: ignore[attr-defined]
        "NETCL_CACHE_DISABLE",
        f"maybe-{cache_dir.parent.name}",
        "False",
    )
    assert event.error == (  # type: ignore[attr-defined]
        f"NETCL_CACHE_DISABLE='maybe-{cache_dir.parent.name}': expected 1 to turn the disk tier "
        "off or 0 for off (true/false, yes/no and on/off work too)"
    )
    assert c.enabled and len(c.entries()) == 2


# the in-process tier ----------------------------------------------------------------------------


def test_memory_tier_holds_contexts_weakly(
    device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    c = ProgramCache(cache_dir)
    own = cl.Context(devices=[device])
    ref = weakref.ref(own)
    prg = c.get_program(own, add_src(0.0, "weak"), device)
    assert len(c._memory) == 1
    del own, prg
    gc.collect()
    assert ref() is None  # the cache did not keep the context alive
    assert len(c._memory) == 0  # and its programs went with it


def test_memory_tier_is_bounded(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    c = ProgramCache(cache_dir, max_programs=2)
    a, b, third = (add_src(0.0, f"bound-{n}") for n in "abc")
    c.get_program(ctx, a, device)
    c.get_program(ctx, b, device)
    c.get_program(ctx, a, device)  # a used again: b is the least recently used
    c.get_program(ctx, third, device)
    assert len(c._memory) == 2
    assert {k[2] for k in c._memory} == {a, third}
    c.get_program(ctx, b, device)  # b again: from disk, not compiled
    assert c.stats.disk_hits == 1 and c.stats.compiles == 3
    with pytest.raises(ValueError, match="max_programs must be an int >= 1, got 0"):
        ProgramCache(cache_dir, max_programs=0)
    one = ProgramCache(cache_dir, max_programs=1)  # the smallest bound: the last program only
    one.get_program(ctx, a, device)
    one.get_program(ctx, b, device)
    assert [k[2] for k in one._memory] == [b]
    one.get_program(ctx, b, device)
    assert one.stats.memory_hits == 1


def test_header_lengths_are_bounded(
    cache_dir: Path, ctx: cl.Context, device: cl.Device, add_src: Callable[..., str]
) -> None:
    """The reader never reads past what the header declares, and refuses huge declarations."""
    from netcl.runtime.cache._entry import EntryError

    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "bounded"), device)
    (entry,) = c.entries()
    store = DiskStore(cache_dir)
    _header_claims_1tb(entry.path)
    with pytest.raises(EntryError, match="oversized"):
        store.read(entry.key)
    assert HEADER.size == 24


def test_an_oversized_or_special_entry_is_named_with_its_sizes(
    cache_dir: Path, ctx: cl.Context, device: cl.Device, add_src: Callable[..., str]
) -> None:
    """Why an entry is refused, as the warning and `netcl cache list` show it: the size found
    (or declared) against the bound of 256 MiB or against what the header says, or the kind of
    file that sits at the entry's name."""
    bound = 256 << 20
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "sizes-named"), device)
    (entry,) = c.entries()
    store = DiskStore(cache_dir)
    valid = entry.path.read_bytes()
    meta_len, payload_len = HEADER.unpack_from(valid)[3:5]
    assert len(valid) == HEADER.size + meta_len + payload_len + 4  # header, body, crc32

    def why() -> str:
        with pytest.raises(EntryError) as info:
            store.read(entry.key)
        return str(info.value)

    entry.path.write_bytes(valid + b"\0")
    assert why() == f"oversized: {len(valid) + 1} bytes, header says {len(valid)}"
    entry.path.write_bytes(valid)
    _huge_after_valid_header(entry.path)
    assert why() == f"oversized: {GB8} bytes, at most {bound}"
    entry.path.write_bytes(valid)
    _header_claims_1tb(entry.path)
    assert why() == f"oversized: {HEADER.size + meta_len + (1 << 40) + 4} bytes, at most {bound}"
    _folder(entry.path)
    assert why() == "special: a directory"
