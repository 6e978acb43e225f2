"""The on-disk entry format: a fixed header, JSON metadata and the program binary.

Layout (little endian)::

    0   8s  magic b"NETCLPRG"
    8   H   format version
    10  H   reserved (0)
    12  I   metadata length
    16  Q   payload (binary) length
    24  I   crc32 of metadata + payload
    28  I   reserved (0)
    32  32s key (raw sha256)
    64      metadata (UTF-8 JSON object), then the payload

Nothing in a file is ever executed or unpickled: the reader checks sizes, key and checksum and
hands the payload to the OpenCL driver as an opaque binary. crc32 guards against torn or damaged
files (a hit verifies 125 kB in ~25 µs where sha256 takes ~80 µs); trust in the folder itself is
checked separately (owner and permissions).
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from netcl.runtime.cache._key import FORMAT_VERSION

__all__ = ["HEADER", "MAGIC", "EntryError", "decode", "encode", "read_meta"]

MAGIC = b"NETCLPRG"
HEADER = struct.Struct("<8sHHIQII32s")
assert HEADER.size == 64


class EntryError(Exception):
    """An entry that cannot be used; ``reason`` is a short word for logs and metrics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def encode(key_hex: str, binary: bytes, meta: dict[str, Any]) -> bytes:
    meta_b = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    crc = zlib.crc32(binary, zlib.crc32(meta_b))
    head = HEADER.pack(
        MAGIC, FORMAT_VERSION, 0, len(meta_b), len(binary), crc, 0, bytes.fromhex(key_hex)
    )
    return b"".join((head, meta_b, binary))


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
    view = memoryview(data)
    start = HEADER.size + meta_len
    if zlib.crc32(view[start:], zlib.crc32(view[HEADER.size : start])) != crc:
        raise EntryError("checksum", "crc32 of metadata and binary does not match")
    return int(meta_len)


def decode(data: bytes, key_hex: str | None) -> memoryview:
    """The binary of a valid entry for ``key_hex`` (any key when None), or :class:`EntryError`."""
    meta_len = _check(data, key_hex)
    return memoryview(data)[HEADER.size + meta_len :]


def read_meta(data: bytes) -> tuple[str, dict[str, Any]]:
    """(key hex, metadata) of a valid entry, or :class:`EntryError`."""
    meta_len = _check(data, None)
    key = HEADER.unpack_from(data)[7].hex()
    try:
        meta = json.loads(data[HEADER.size : HEADER.size + meta_len])
    except ValueError as exc:
        raise EntryError("metadata", str(exc)) from exc
    if not isinstance(meta, dict):
        raise EntryError("metadata", "not a JSON object")
    return key, meta
