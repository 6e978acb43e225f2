"""The signed value format of the remote tier: header, JSON metadata, binary, HMAC tag.

Layout (little endian)::

    0   8s  magic b"NETCLRMT"
    8   H   format version
    10  H   reserved (0)
    12  I   metadata length
    16  Q   binary length
    24      metadata (UTF-8 JSON object), then the binary
    end-32  HMAC-SHA256 tag

The tag covers a domain label, the raw cache key, the header, the metadata and the binary, so a
value cannot be moved to another key, truncated, extended or edited without the secret. The
reader checks lengths first (against the bounds it was given), then the tag (constant-time),
and only then parses the metadata. Nothing is unpickled or executed: the binary goes to the
OpenCL driver as opaque bytes, and only after it was authenticated.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any

from netcl.runtime.cache._entry import MAX_META_BYTES, EntryError, parse_meta

__all__ = [
    "HEADER", "MAGIC", "TAG_BYTES", "VERSION", "decode_value", "encode_value", "open_value",
]

MAGIC = b"NETCLRMT"
VERSION = 1
HEADER = struct.Struct("<8sHHIQ")
assert HEADER.size == 24
TAG_BYTES = 32
_DOMAIN = b"netcl-cache remote v1\0"


def _tag(secret: bytes, key_hex: str, signed: memoryview | bytes) -> bytes:
    mac = hmac.new(secret, _DOMAIN, hashlib.sha256)
    mac.update(bytes.fromhex(key_hex))
    mac.update(signed)
    return mac.digest()


def encode_value(secret: bytes, key_hex: str, binary: bytes, meta: dict[str, Any]) -> bytes:
    """The signed value of ``binary`` stored under cache key ``key_hex``."""
    meta_b = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    body = b"".join((HEADER.pack(MAGIC, VERSION, 0, len(meta_b), len(binary)), meta_b, binary))
    return body + _tag(secret, key_hex, body)


def decode_value(
    secret: bytes, key_hex: str, data: bytes, max_bytes: int
) -> tuple[dict[str, Any], memoryview]:
    """(metadata, binary) of an authentic value for ``key_hex``, else :class:`EntryError` whose
    ``reason`` is one of: empty, truncated, oversized, foreign, version, signature, metadata."""
    if not data:
        raise EntryError("empty")
    if len(data) > max_bytes:
        raise EntryError("oversized", f"{len(data)} bytes, bound {max_bytes}")
    if len(data) < HEADER.size + TAG_BYTES:
        raise EntryError("truncated", f"{len(data)} bytes")
    magic, version, _, meta_len, bin_len = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EntryError("foreign", f"magic {magic[:8]!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise EntryError("version", f"format {version}, expected {VERSION}")
    if meta_len > MAX_META_BYTES:
        raise EntryError("oversized", f"metadata of {meta_len} bytes")
    want = HEADER.size + meta_len + bin_len + TAG_BYTES
    if len(data) != want:
        raise EntryError("truncated", f"{len(data)} bytes, header says {want}")
    view = memoryview(data)
    end = want - TAG_BYTES
    if not hmac.compare_digest(_tag(secret, key_hex, view[:end]), view[end:]):
        raise EntryError("signature", "HMAC tag does not match (tampered, or another key)")
    meta = parse_meta(view[HEADER.size : HEADER.size + meta_len].tobytes())
    return meta, view[HEADER.size + meta_len : end]


def open_value(
    secret: bytes, key_hex: str, ident: str, data: bytes, max_bytes: int
) -> memoryview:
    """The binary of an authentic value for ``key_hex`` written for the device identity
    ``ident``; :class:`EntryError` as :func:`decode_value`, or ``identity`` when it was written
    for another device (a binary of another driver must never reach this one)."""
    meta, binary = decode_value(secret, key_hex, data, max_bytes)
    if meta.get("identity") != ident:
        raise EntryError("identity", f"written for {meta.get('identity')!r}")
    return binary
