"""``read_file`` names the kind of a special file it refuses (found by the mutation run: the
names were never checked), on real special files."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from netcl.runtime.cache._entry import EntryError, read_file


def _refusal(path: str, flags: int) -> str:
    fd = os.open(path, flags)
    try:
        with pytest.raises(EntryError) as info:
            read_file(fd)
    finally:
        os.close(fd)
    assert info.value.reason == "special"
    return str(info.value)


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        yield path


def test_directory_fifo_link_socket_and_devices_are_named(tmp_path: Path, sock: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    ro_nb = os.O_RDONLY | os.O_NONBLOCK
    assert _refusal(str(tmp_path), ro_nb) == "special: a directory"
    assert _refusal(str(fifo), ro_nb) == "special: a FIFO"
    assert _refusal(str(link), os.O_PATH | os.O_NOFOLLOW) == "special: a symbolic link"
    assert _refusal(sock, os.O_PATH) == "special: a socket"
    assert _refusal("/dev/null", ro_nb) == "special: a character device"


def test_a_block_device_is_named() -> None:
    devs = (f"/dev/{n}" for n in sorted(os.listdir("/dev")))
    dev = next((d for d in devs if stat.S_ISBLK(os.stat(d).st_mode)), None)
    if dev is None:
        pytest.skip("no block device under /dev")
    assert _refusal(dev, os.O_PATH) == "special: a block device"


def test_an_entry_read_in_short_parts_comes_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read may return less than asked (a network file system): the reader asks again, and
    hands back the entry's bytes with its mtime; a file that shrank comes back short."""
    from netcl.runtime.cache import _entry

    data = _entry.encode("ab" * 32, bytes(range(256)) * 40, {"identity": "x"})
    path = tmp_path / "entry"
    path.write_bytes(data)
    real_pread = os.pread
    monkeypatch.setattr(_entry.os, "pread", lambda fd, n, at: real_pread(fd, min(n, 1000), at))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_file(fd) == (data, os.fstat(fd).st_mtime)
        os.truncate(path, 5000)  # the header still declares the whole entry: decode says so
        assert read_file(fd)[0] == data[:5000]
    finally:
        os.close(fd)
