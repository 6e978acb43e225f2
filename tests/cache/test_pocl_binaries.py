"""PoCL program binaries of the formats 9 and 10 (PoCL 3.1 and later) are checked against their
own lengths before a cached one goes to the driver: the root entries (each sized), the u64 that
format 10 puts after the build hash when flag bit 1 is set, and the kernel records; a binary
whose records do not end where it ends is refused, naming both."""

from __future__ import annotations

import struct

import pytest

from netcl.runtime.cache._build import check_binary
from netcl.runtime.cache._entry import EntryError


def _file(name: bytes, content: bytes) -> bytes:
    """One serialized file: u32 name length, name, u32 size, content."""
    return struct.pack("<I", len(name)) + name + struct.pack("<I", len(content)) + content


def _pocl(version: int, flags: int) -> bytes:
    """A PoCL binary of ``version``: one root entry (program.bc) and one kernel record."""
    roots = [_file(b"program.bc", b"BC\xc0\xde" * 4)]
    files = _file(b"k/kernel.so", b"\x7fELF-ish" * 3)
    info = b"arg-info"
    kernels = [struct.pack("<QQI", 20 + len(info) + len(files), len(files), len(info)) + info
               + files]  # fmt: skip
    head = struct.pack("<8sQIIQI41s", b"poclbin\0", 7, version, len(kernels), flags, len(roots),
                       b"a" * 40 + b"\0")  # fmt: skip
    if version >= 10 and flags & 2:
        head += struct.pack("<Q", 12345)  # the u64 after the hash
    return (head + b"".join(struct.pack("<Q", len(r)) + r for r in roots)
            + b"".join(kernels))  # fmt: skip


@pytest.mark.parametrize(("version", "flags"), [(9, 0), (9, 2), (10, 0), (10, 2), (11, 3)])
def test_a_pocl_binary_is_checked_against_its_own_lengths(version: int, flags: int) -> None:
    whole = _pocl(version, flags)
    check_binary(whole)  # fine as it is
    for bad in (whole[:-1], whole + b"\0"):
        with pytest.raises(EntryError, match="binary"):
            check_binary(bad)


def test_the_u64_after_the_hash_is_there_only_with_flag_bit_1_from_format_10() -> None:
    # the same bytes read as the other layout: their records do not end where the binary does
    with_u64 = _pocl(10, 2)
    for other in (9, 10):  # format 9 never has it; format 10 without the flag neither
        relabeled = bytearray(with_u64)
        struct.pack_into("<IIQ", relabeled, 16, other, 1, 2 if other == 9 else 0)
        with pytest.raises(EntryError, match="binary"):
            check_binary(bytes(relabeled))
