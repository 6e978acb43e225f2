"""Cache keys: sha256 over format version, device identity, build options, source and the content
of every header the source reaches through ``#include``."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Sequence

__all__ = ["FORMAT_VERSION", "compute_key", "include_dirs", "normalize_options"]

#: Version of the entry format (disk and remote) and of the key recipe; bumping it misses every
#: old entry (3: one format for both tiers).
FORMAT_VERSION = 3

# `#include "a.h"` and `#include <a.h>`; conditional includes are hashed too (over-inclusion only
# costs a read, missing a header would serve a stale binary).
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)


def normalize_options(options: str | Sequence[str] | None) -> str:
    """Build options as the one string handed to the driver (a sequence is joined by spaces)."""
    if options is None:
        return ""
    if isinstance(options, str):
        return options
    if isinstance(options, (bytes, bytearray)) or not all(isinstance(o, str) for o in options):
        raise TypeError(f"get_program: options must be a str or a sequence of str, got {options!r}")
    return " ".join(options)


def include_dirs(options: str) -> list[str]:
    """The ``-I`` folders named in ``options`` (``-I dir``, ``-Idir``, ``/I dir``), in order."""
    if "-I" not in options and "/I" not in options:
        return []
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
            path = None
            for d in search:
                candidate = os.path.join(d, name)
                if os.path.isfile(candidate):
                    path = os.path.realpath(candidate)
                    break
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
    h = hashlib.sha256()

    def feed(tag: bytes, data: bytes) -> None:
        h.update(tag + len(data).to_bytes(8, "little"))
        h.update(data)

    feed(b"fmt", str(FORMAT_VERSION).encode())
    feed(b"dev", identity.encode("utf-8", "surrogateescape"))
    opts = options.encode("utf-8", "surrogateescape")
    feed(b"opt", opts)
    feed(b"src", source)
    if b"include" in source:
        for name, content in _includes(source, include_dirs(options)):
            feed(b"inc", name)
            if content is None:
                feed(b"miss", b"")
            else:
                feed(b"dat", content)
    return h.hexdigest()
