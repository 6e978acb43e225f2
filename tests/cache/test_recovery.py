"""The corruption matrix: every damaged entry is compiled again, overwritten, logged, counted."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.core.device import device_identity
from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._entry import FORMAT_VERSION, HEADER, decode, encode


def _flip_payload(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[-100] ^= 0xFF
    p.write_bytes(bytes(data))


def _driver_rejects(p: Path) -> None:
    # a well-formed entry (right key, checksum and device identity) whose binary is garbage to
    # the driver (in no format whose lengths netcl checks first, so the driver refuses it)
    key = p.name.split(".")[0]
    meta, _ = decode(p.read_bytes(), key)
    p.write_bytes(encode(key, b"not really a binary" * 64, meta))


def _wrong_version(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[8] += 1
    p.write_bytes(bytes(data))


def _flip_at(offset: int) -> Callable[[Path], None]:
    def flip(p: Path) -> None:
        data = bytearray(p.read_bytes())
        data[offset] ^= 0x01
        p.write_bytes(bytes(data))

    return flip


DAMAGE: dict[str, Callable[[Path], None]] = {
    # the checksum covers the whole header: the reserved field and the lengths too; and itself
    "header-reserved-flip": _flip_at(10),
    "header-length-flip": _flip_at(12),
    "crc-flip": _flip_at(-1),
    "metadata-flip": _flip_at(HEADER.size + 3),
    "empty": lambda p: p.write_bytes(b""),
    "truncated-header": lambda p: p.write_bytes(p.read_bytes()[:40]),
    "truncated-payload": lambda p: p.write_bytes(p.read_bytes()[:-1000]),
    # bytes after the length the header declares: refused (unread), not cut off and loaded
    "trailing-bytes": lambda p: p.write_bytes(p.read_bytes() + b"appended"),
    "bit-flip": _flip_payload,
    "garbage": lambda p: p.write_bytes(b"#!/bin/sh\nrm -rf /\n" * 50),
    "wrong-version": _wrong_version,
    "driver-rejects": _driver_rejects,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_entry_is_recovered(
    damage: str,
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    src = add_src(3.0, f"damage-{damage}")
    ProgramCache(cache_dir).get_program(ctx, src, device)
    (entry,) = ProgramCache(cache_dir).entries()
    good = entry.path.read_bytes()
    DAMAGE[damage](entry.path)
    c = ProgramCache(cache_dir)
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
        prg = c.get_program(ctx, src, device)
    check_add(prg, 3.0)
    assert c.stats.recoveries == 1 and c.stats.corrupt == 1 and c.stats.compiles == 1
    events = log_events("cache_entry_corrupt")
    assert len(events) == 1
    assert events[0].path == str(entry.path)  # type: ignore[attr-defined]
    # the entry was overwritten with a valid one: the next fresh instance is a disk hit
    assert len(decode(entry.path.read_bytes(), entry.key)[1]) == len(decode(good, entry.key)[1])
    c2 = ProgramCache(cache_dir)
    check_add(c2.get_program(ctx, src, device), 3.0)
    assert c2.stats.disk_hits == 1 and c2.stats.recoveries == 0


def test_foreign_entry_under_another_name(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    """Another program's entry copied to this key's file: the checksum covers the key."""
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(1.0, "a"), device)
    c.get_program(ctx, add_src(2.0, "b"), device)
    a, b = sorted(c.entries(), key=lambda f: f.mtime)
    shutil.copyfile(a.path, b.path)  # b's file now holds a's (valid, checksummed) entry
    c2 = ProgramCache(cache_dir)
    check_add(c2.get_program(ctx, add_src(2.0, "b"), device), 2.0)  # not a's kernel
    assert c2.stats.recoveries == 1


def test_entry_header_is_plain_data(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "fmt"), device)
    (entry,) = ProgramCache(cache_dir).entries()
    data = entry.path.read_bytes()
    magic, version, _, meta_len, payload_len = HEADER.unpack_from(data)
    assert magic == b"NETCLPRG" and version == FORMAT_VERSION == 3
    assert len(data) == HEADER.size + meta_len + payload_len + 4  # the crc32 last
    assert decode(data, entry.key)[0]["identity"] == device_identity(device)
    assert b"pickle" not in data[: HEADER.size + meta_len]
    import json

    meta = json.loads(data[HEADER.size : HEADER.size + meta_len])
    assert meta["device"] == device.name and meta["options"] == ""


def test_an_entry_written_for_another_device_identity_is_refused(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    """Right key and checksum, another driver's binary: never handed to this driver (the disk
    tier reads the one entry format as the remote tier does, identity check included)."""
    src = add_src(6.0, "other-identity")
    ProgramCache(cache_dir).get_program(ctx, src, device)
    (entry,) = ProgramCache(cache_dir).entries()
    meta, binary = decode(entry.path.read_bytes(), entry.key)
    entry.path.write_bytes(encode(entry.key, bytes(binary), {**meta, "identity": "x|y|z"}))
    c = ProgramCache(cache_dir)
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
        check_add(c.get_program(ctx, src, device), 6.0)
    assert c.stats.recoveries == 1 and c.stats.compiles == 1 and c.stats.disk_hits == 0
    (event,) = log_events("cache_entry_corrupt")
    assert event.reason == "identity: written for 'x|y|z'"  # type: ignore[attr-defined]


HOLDER = """
import sys, time
from pathlib import Path
from netcl.runtime.cache._store import DiskStore

store = DiskStore(Path(sys.argv[1]))
with store.lock(sys.argv[2], 30.0) as held:
    print(held, flush=True)
    time.sleep(1.0)  # the other process finds no entry and waits for this lock
    store.path(sys.argv[2]).write_bytes(b"junk")  # a writer that left a damaged entry
"""


def test_an_entry_damaged_while_this_process_waited_for_the_lock_is_reported(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    tmp_path: Path,
    add_src: Callable[..., str],
) -> None:
    """No entry at first; another process holds the key's lock and leaves a damaged entry: found
    once the lock is ours, it is counted as corrupt and compiled again."""
    src = add_src(0.0, "damaged-while-waiting")
    probe = ProgramCache(tmp_path / "probe")
    probe.get_program(ctx, src, device)
    key = probe.entries()[0].key
    ProgramCache(cache_dir).entries()  # makes the folders
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(cache_dir), key], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        c = ProgramCache(cache_dir)
        c.get_program(ctx, src, device)
    finally:
        assert holder.wait(30) == 0
    assert (c.stats.corrupt, c.stats.compiles) == (1, 1)
    assert len(c.entries()) == 1 and c.entries()[0].size > 4  # written anew
