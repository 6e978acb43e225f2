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
    kernels = [
        struct.pack("<QQI", 20 + len(info) + len(files), len(files), len(info)) + info + files
    ]
    head = struct.pack(
        "<8sQIIQI41s", b"poclbin\0", 7, version, len(kernels), flags, len(roots), b"a" * 40 + b"\0"
    )
    if version >= 10 and flags & 2:
        head += struct.pack("<Q", 12345)  # the u64 after the hash
    return head + b"".join(struct.pack("<Q", len(r)) + r for r in roots) + b"".join(kernels)


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


def _message(binary: bytes) -> str:
    with pytest.raises(EntryError) as info:
        check_binary(binary)
    assert info.value.reason == "binary"
    return str(info.value)


def test_each_refusal_names_the_record_where_it_ends_and_the_binarys_length() -> None:
    """What a refused PoCL binary is told apart by in the warning: the record that runs past
    its end (a root entry, a file inside one, a kernel record) with the byte where it ends and
    the length it had to fit in, or where the records end when bytes follow them."""
    whole = _pocl(9, 0)
    n = len(whole)
    root_at = struct.calcsize("<8sQIIQI41s")  # the root entry's u64 size
    (root_size,) = struct.unpack_from("<Q", whole, root_at)
    kernel_at = root_at + 8 + root_size

    past = bytearray(whole)
    struct.pack_into("<Q", past, root_at, 1000)
    assert _message(bytes(past)) == (
        f"binary: a root entry ends at byte {root_at + 8 + 1000}, the binary has {n}"
    )

    inner = bytearray(whole)  # the name length of program.bc, inside its root entry
    struct.pack_into("<I", inner, root_at + 8, 100)
    root_end = kernel_at
    assert _message(bytes(inner)) == (
        f"binary: a file record ends at byte {root_at + 8 + 4 + 100}, the binary has {root_end}"
    )

    long_kernel = bytearray(whole)
    (size,) = struct.unpack_from("<Q", whole, kernel_at)
    struct.pack_into("<Q", long_kernel, kernel_at, size + 1)
    assert _message(bytes(long_kernel)) == (
        f"binary: a kernel record ends at byte {kernel_at + size + 1}, the binary has {n}"
    )

    files_over = bytearray(whole)  # its files said to be larger than the record itself
    struct.pack_into("<Q", files_over, kernel_at + 8, size + 1)
    assert _message(bytes(files_over)) == (
        f"binary: a kernel record ends at byte {kernel_at + size}, the binary has {n}"
    )

    assert _message(whole + b"\0\0") == f"binary: {n + 2} bytes, its records end at byte {n}"
    assert _message(whole[:40]).startswith("binary: cut inside a header (")


def test_a_binary_before_format_9_has_one_bitcode_file_then_its_kernels() -> None:
    """Formats before 9 (PoCL 3.0 and older): the program's bitcode as one serialized file
    right after the header, checked like the rest; a binary may end with its last root entry
    (no kernels)."""
    bitcode = _file(b"program.bc", b"BC\xc0\xde" * 2)
    head = struct.pack("<8sQIIQ41s", b"poclbin\0", 7, 8, 0, 0, b"a" * 40 + b"\0")
    check_binary(head + bitcode)
    root = _file(b"program.bc", b"BC\xc0\xde")  # format 9, no kernels: a root entry ends it
    check_binary(
        struct.pack("<8sQIIQI41s", b"poclbin\0", 7, 9, 0, 0, 1, b"a" * 40 + b"\0")
        + struct.pack("<Q", len(root))
        + root
    )
    cut = head + bitcode[:-1]
    assert _message(cut) == (
        f"binary: a file record ends at byte {len(head + bitcode)}, the binary has {len(cut)}"
    )
