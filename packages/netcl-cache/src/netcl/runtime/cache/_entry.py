"""Cache entries: the key a program is stored under, and the one entry format of both tiers.

The key is the sha256 over format version, device identity, build options, source and the
content of every header the source reaches through ``#include``. The entry (a file on disk, a
value in Redis), little endian::

    0   8s  magic b"NETCLPRG"
    8   H   format version (FORMAT_VERSION, also part of the key)
    10  H   reserved (0)
    12  I   metadata length
    16  Q   binary length
    24      metadata (UTF-8 JSON object), then the binary
    end     tag over the cache key and every byte before it: crc32 (4 bytes) on disk,
            HMAC-SHA256 with the fleet's secret (32 bytes) in Redis

Readers check the lengths, then the tag (constant-time), and only then parse the metadata; the
guide's "On-disk format and safety" says why crc32 suffices on disk and what is never done.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shlex
import stat
import struct
import zlib
from collections.abc import Sequence
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "MAX_ENTRY_BYTES",
    "MAX_META_BYTES",
    "EntryError",
    "compute_key",
    "decode",
    "encode",
    "include_dirs",
    "parse_meta",
    "read_file",
    "tag_size",
]

#: Version of the entry format (disk and remote) and of the key recipe; bumping it misses every
#: old entry (3: one format for both tiers).
FORMAT_VERSION = 3

# the key ----------------------------------------------------------------------------------------
# `#include "a.h"` and `#include <a.h>`; conditional includes are hashed too (over-inclusion only
# costs a read, missing a header would serve a stale binary).
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)


def include_dirs(options: str) -> list[str]:
    """The ``-I`` folders named in ``options`` (``-I dir``, ``-Idir``, ``/I dir``), in order."""
    try:
        words = shlex.split(options)
    except ValueError:  # unbalanced quotes: the driver will complain; key on the raw words
        words = options.split()
    dirs: list[str] = []
    for before, word in zip(["", *words], words, strict=False):
        if before in ("-I", "/I"):
            dirs.append(word)
        elif word.startswith(("-I", "/I")) and len(word) > 2:
            dirs.append(word[2:].lstrip("="))
    return dirs


def _includes(source: bytes, dirs: Sequence[str]) -> list[tuple[bytes, bytes | None]]:
    """(name, content) of every header reachable from ``source``; content None when not found
    (a header of the driver itself, or a missing one: the name still goes into the key)."""
    found: list[tuple[bytes, bytes | None]] = []
    seen: set[str] = set()
    todo: list[tuple[bytes, str | None]] = [(source, None)]
    while todo:
        text, here = todo.pop()
        for m in _INCLUDE.finditer(text):
            name = m.group(2).decode("utf-8", "surrogateescape").strip()
            search = ([here] if here is not None and m.group(1) == b'"' else []) + list(dirs)
            candidates = (os.path.join(d, name) for d in search)
            path = next((os.path.realpath(c) for c in candidates if os.path.isfile(c)), None)
            if path is None:
                found.append((m.group(2), None))
                continue
            if path in seen:
                continue
            seen.add(path)
            with open(path, "rb") as f:
                content = f.read()
            found.append((m.group(2), content))
            todo.append((content, os.path.dirname(path)))
    return found


def compute_key(source: bytes, options: str, identity: str) -> str:
    """The hex sha256 key of a program: every input is length-framed, so no two differ only in
    where one part ends and the next begins."""
    parts = [
        (b"fmt", str(FORMAT_VERSION).encode()),
        (b"dev", identity.encode("utf-8", "surrogateescape")),
        (b"opt", options.encode("utf-8", "surrogateescape")),
        (b"src", source),
    ]
    if b"include" in source:
        for name, content in _includes(source, include_dirs(options)):
            parts += ((b"inc", name), (b"miss", b"") if content is None else (b"dat", content))
    h = hashlib.sha256()
    for tag, data in parts:
        h.update(tag + _U64(len(data)) + data)
    return h.hexdigest()


# the format -------------------------------------------------------------------------------------
MAGIC = b"NETCLPRG"
HEADER = struct.Struct("<8sHHIQ")
#: The largest entry a reader accepts: real binaries are kB to a few MB.
MAX_ENTRY_BYTES = 256 << 20
#: Metadata is a flat JSON object of a few hundred bytes; past these bounds it is not ours.
MAX_META_BYTES = 64 << 10
MAX_META_DEPTH = 8
_U64 = struct.Struct("<Q").pack
_JSON = json.JSONDecoder()
_DOMAIN = b"netcl-cache entry\0"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


class EntryError(Exception):
    """An entry that cannot be used; ``reason`` is a short word for logs and metrics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def tag_size(secret: bytes | None) -> int:
    """Bytes of the tag: crc32 without a secret, HMAC-SHA256 with one."""
    return 4 if secret is None else 32


def _tag(key_hex: str, body: bytes | memoryview, secret: bytes | None) -> bytes:
    key = bytes.fromhex(key_hex)
    if secret is None:
        return zlib.crc32(body, zlib.crc32(key)).to_bytes(4, "little")
    mac = hmac.new(secret, _DOMAIN, hashlib.sha256)
    mac.update(key)
    mac.update(body)
    return mac.digest()


def encode(key_hex: str, binary: bytes, meta: dict[str, Any], secret: bytes | None = None) -> bytes:
    """The entry of ``binary`` under cache key ``key_hex``, tagged with ``secret`` (None: crc32)."""
    meta_b = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    body = b"".join(
        (HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta_b), len(binary)), meta_b, binary)
    )
    return body + _tag(key_hex, body, secret)


def decode(
    data: bytes,
    key_hex: str,
    *,
    secret: bytes | None = None,
    ident: str | None = None,
    max_bytes: int = MAX_ENTRY_BYTES,
) -> tuple[dict[str, Any], memoryview]:
    """(metadata, binary) of an intact entry for ``key_hex`` tagged with ``secret`` and, unless
    ``ident`` is None, written for that device identity. Else :class:`EntryError` naming why:
    empty, oversized, truncated, foreign, version, checksum (disk) or signature (remote),
    metadata, identity."""
    n, tag_n = len(data), tag_size(secret)
    if not n:
        raise EntryError("empty")
    if n > max_bytes:
        raise EntryError("oversized", f"{n} bytes, bound {max_bytes}")
    if n < HEADER.size + tag_n:
        raise EntryError("truncated", f"{n} bytes")
    magic, version, _, meta_len, bin_len = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EntryError("foreign", f"magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise EntryError("version", f"format {version}, expected {FORMAT_VERSION}")
    if meta_len > MAX_META_BYTES:
        raise EntryError("oversized", f"metadata of {meta_len} bytes")
    end = HEADER.size + meta_len + bin_len
    if n != end + tag_n:
        raise EntryError("truncated", f"{n} bytes, header says {end + tag_n}")
    view = memoryview(data)
    if not hmac.compare_digest(_tag(key_hex, view[:end], secret), view[end:]):
        if secret is None:
            raise EntryError("checksum", "crc32 of key, header, metadata and binary differs")
        raise EntryError("signature", "HMAC tag does not match (tampered, or another key)")
    meta = parse_meta(view[HEADER.size : HEADER.size + meta_len].tobytes())
    if ident is not None and meta.get("identity") != ident:
        raise EntryError("identity", f"written for {meta.get('identity')!r}")
    return meta, view[HEADER.size + meta_len : end]


def parse_meta(raw: bytes) -> dict[str, Any]:
    """The JSON object of an entry's metadata; :class:`EntryError` ``metadata`` when too large,
    nested too deep (checked first: it would exhaust the parser's recursion), not UTF-8, not
    JSON (whitespace around it included: :func:`encode` writes none), not an object."""
    if len(raw) > MAX_META_BYTES:
        raise EntryError("metadata", f"{len(raw)} bytes, at most {MAX_META_BYTES}")
    if raw.count(b"[") + raw.count(b"{") > MAX_META_DEPTH:  # else it cannot nest deeper
        depth = deepest = 0
        for m in _BRACKET.finditer(_STRING.sub(b"", raw)):
            depth += 1 if m.group() in b"[{" else -1
            deepest = max(deepest, depth)
        if deepest > MAX_META_DEPTH:
            raise EntryError("metadata", f"nested {deepest} deep, at most {MAX_META_DEPTH}")
    try:  # raw_decode: json.loads less its encoding sniffing and whitespace skipping (~2 µs)
        text = raw.decode()
        meta, end = _JSON.raw_decode(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise EntryError("metadata", str(exc)[:200]) from exc
    if not isinstance(meta, dict) or end != len(text):
        raise EntryError("metadata", "not a JSON object" if end == len(text) else "extra data")
    return meta


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def read_file(fd: int) -> tuple[bytes, float]:
    """(bytes, mtime) of the disk entry open as ``fd`` (``O_NONBLOCK | O_NOFOLLOW``), never
    read past what its header declares: :class:`EntryError` ``special`` unless it is a regular
    file, ``oversized`` past :data:`MAX_ENTRY_BYTES` or its header. A short or foreign file
    comes back as it is (up to the header) for :func:`decode` to name what is wrong."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise EntryError("special", next((n for t, n in _KINDS if t(st.st_mode)), "not a file"))
    # the header, then the whole entry from its start: no copy joins two reads (~1-6 µs)
    head = os.pread(fd, HEADER.size, 0)
    if len(head) < HEADER.size or head[:8] != MAGIC:
        return head, st.st_mtime
    want = HEADER.size + sum(HEADER.unpack_from(head)[3:5]) + tag_size(None)
    if want > MAX_ENTRY_BYTES or st.st_size > MAX_ENTRY_BYTES:
        raise EntryError("oversized", f"{max(want, st.st_size)} bytes, at most {MAX_ENTRY_BYTES}")
    if st.st_size > want:
        raise EntryError("oversized", f"{st.st_size} bytes, header says {want}")
    data = os.pread(fd, st.st_size, 0)  # short only at the end of the file (or on a network one)
    while len(data) < st.st_size and (more := os.pread(fd, st.st_size - len(data), len(data))):
        data += more
    return data, st.st_mtime
