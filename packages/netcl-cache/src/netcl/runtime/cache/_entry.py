"""The on-disk entry format: a fixed header, JSON metadata and the program binary.

Layout (little endian)::

    0   8s  magic b"NETCLPRG"
    8   H   format version
    10  H   reserved (0)
    12  I   metadata length
    16  Q   payload (binary) length
    24  I   crc32 of the header (this field as 0), the metadata and the payload
    28  I   reserved (0)
    32  32s key (raw sha256)
    64      metadata (UTF-8 JSON object), then the payload

Nothing in a file is ever executed or unpickled: the reader checks sizes, key and checksum and
hands the payload to the OpenCL driver as an opaque binary. crc32 guards against torn or damaged
files (a hit verifies 125 kB in ~25 µs where sha256 takes ~80 µs); trust in the folder itself is
checked separately (owner and permissions). The checksum covers the whole header too (key,
lengths, reserved fields), so a flipped bit anywhere in a file is caught.

:func:`read_file` reads an entry from an open file without trusting it: only a regular file,
never more than the header declares, never more than :data:`MAX_ENTRY_BYTES`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import zlib
from typing import Any

from netcl.runtime.cache._key import FORMAT_VERSION

__all__ = [
    "HEADER", "MAGIC", "MAX_ENTRY_BYTES", "MAX_META_BYTES", "MAX_META_DEPTH", "EntryError",
    "decode", "encode", "parse_meta", "read_file", "read_meta",
]

MAGIC = b"NETCLPRG"
HEADER = struct.Struct("<8sHHIQII32s")
assert HEADER.size == 64
_CRC_AT = 24  # offset of the crc field, zeroed while the checksum is computed
_NO_CRC = b"\0\0\0\0"
#: The largest entry a reader accepts (header + metadata + binary): real binaries are kB to a few
#: MB; a header declaring more is damaged, and nothing larger is ever read into memory.
MAX_ENTRY_BYTES = 256 << 20
#: Metadata is a flat JSON object of a few hundred bytes; past these bounds it is not ours.
MAX_META_BYTES = 64 << 10
MAX_META_DEPTH = 8
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


class EntryError(Exception):
    """An entry that cannot be used; ``reason`` is a short word for logs and metrics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def encode(key_hex: str, binary: bytes, meta: dict[str, Any]) -> bytes:
    meta_b = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    key = bytes.fromhex(key_hex)
    head = bytearray(HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta_b), len(binary), 0, 0, key))
    crc = zlib.crc32(binary, zlib.crc32(meta_b, zlib.crc32(head)))
    head[_CRC_AT : _CRC_AT + 4] = crc.to_bytes(4, "little")
    return b"".join((head, meta_b, binary))


def _crc(view: memoryview) -> int:
    """crc32 of a whole entry with its crc field taken as 0."""
    crc = zlib.crc32(view[:_CRC_AT])
    crc = zlib.crc32(_NO_CRC, crc)
    return zlib.crc32(view[_CRC_AT + 4 :], crc)


def _check(data: bytes, key_hex: str | None) -> int:
    """The metadata length of a valid entry for ``key_hex`` (any key when None)."""
    if not data:
        raise EntryError("empty")
    if len(data) < HEADER.size:
        raise EntryError("truncated", f"{len(data)} bytes, header needs {HEADER.size}")
    magic, version, _, meta_len, payload_len, crc, _, key = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EntryError("foreign", f"magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise EntryError("version", f"format {version}, expected {FORMAT_VERSION}")
    if key_hex is not None and key != bytes.fromhex(key_hex):
        raise EntryError("foreign", f"entry holds key {key.hex()}")
    want = HEADER.size + meta_len + payload_len
    if len(data) != want:
        raise EntryError("truncated", f"{len(data)} bytes, header says {want}")
    if _crc(memoryview(data)) != crc:
        raise EntryError("checksum", "crc32 of header, metadata and binary does not match")
    return int(meta_len)


def decode(data: bytes, key_hex: str | None) -> memoryview:
    """The binary of a valid entry for ``key_hex`` (any key when None), or :class:`EntryError`."""
    meta_len = _check(data, key_hex)
    return memoryview(data)[HEADER.size + meta_len :]


def read_meta(data: bytes) -> tuple[str, dict[str, Any]]:
    """(key hex, metadata) of a valid entry, or :class:`EntryError`."""
    meta_len = _check(data, None)
    key = HEADER.unpack_from(data)[7].hex()
    return key, parse_meta(data[HEADER.size : HEADER.size + meta_len])


def parse_meta(raw: bytes) -> dict[str, Any]:
    """The JSON object of an entry's or a value's metadata; :class:`EntryError` ``metadata``
    for anything else: more than :data:`MAX_META_BYTES`, nested deeper than
    :data:`MAX_META_DEPTH` (checked before parsing: deep nesting would exhaust the parser's
    recursion), not UTF-8, not JSON, not an object."""
    if len(raw) > MAX_META_BYTES:
        raise EntryError("metadata", f"{len(raw)} bytes, at most {MAX_META_BYTES}")
    if raw.count(b"[") + raw.count(b"{") > MAX_META_DEPTH:  # else it cannot nest deeper
        depth = deepest = 0
        for m in _BRACKET.finditer(_STRING.sub(b"", raw)):
            depth += 1 if m.group() in b"[{" else -1
            deepest = max(deepest, depth)
        if deepest > MAX_META_DEPTH:
            raise EntryError("metadata", f"nested {deepest} deep, at most {MAX_META_DEPTH}")
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise EntryError("metadata", str(exc)[:200]) from exc
    if not isinstance(meta, dict):
        raise EntryError("metadata", "not a JSON object")
    return meta


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_file(fd: int) -> bytes:
    """The bytes of the entry open as ``fd`` (opened with ``O_NONBLOCK | O_NOFOLLOW``), read
    without trusting the file: :class:`EntryError` ``special`` unless it is a regular file,
    ``oversized`` when it or its header declares more than :data:`MAX_ENTRY_BYTES`; never
    reads past the lengths the header declares. Short or foreign files come back as they are
    (up to the header) for :func:`decode` to name what is wrong."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise EntryError("special", _kind(st.st_mode))
    head = _read_exactly(fd, min(HEADER.size, st.st_size))
    if len(head) < HEADER.size or head[:8] != MAGIC:
        return head
    want = HEADER.size + sum(HEADER.unpack_from(head)[3:5])
    if want > MAX_ENTRY_BYTES or st.st_size > MAX_ENTRY_BYTES:
        raise EntryError(
            "oversized", f"{max(want, st.st_size)} bytes, at most {MAX_ENTRY_BYTES} accepted"
        )
    if st.st_size > want:
        raise EntryError("oversized", f"{st.st_size} bytes, header says {want}")
    return head + _read_exactly(fd, min(want, st.st_size) - HEADER.size)


def _read_exactly(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes (fewer only at end of file)."""
    parts = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)
