"""ELF program binaries (what drivers other than PoCL hand back) are checked against their own
header before a cached one goes to the driver: 64- and 32-bit, either byte order; headers or a
section past the end are refused with where they end, a .bss section takes no bytes, and a
binary cut inside its header is refused as cut."""

from __future__ import annotations

import struct

import pytest

from netcl.runtime.cache._build import check_binary
from netcl.runtime.cache._entry import EntryError


def _elf(wide: bool, order: str, sections: list[tuple[int, int, int]]) -> bytes:
    """An ELF file: its header, one program header, then ``(type, offset, size)`` sections."""
    ph_size, sh_size, head_size = (56, 64, 64) if wide else (32, 40, 52)
    ph_off, sh_off = head_size, head_size + ph_size
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if order == "<" else 2, 1]) + bytes(9)
    layout, entry = ("HHIQQQIHHHHHH", "IIQQQQIIQQ") if wide else ("HHIIIIIHHHHHH", "I" * 10)
    head = ident + struct.pack(
        order + layout,
        2,
        62,
        1,
        0,
        ph_off,
        sh_off,
        0,
        head_size,
        ph_size,
        1,
        sh_size,
        len(sections),
        0,
    )
    table = b"".join(
        struct.pack(order + entry, 0, kind, 0, 0, off, size, 0, 0, 0, 0)
        for kind, off, size in sections
    )
    return head + bytes(ph_size) + table


@pytest.mark.parametrize(("wide", "order"), [(True, "<"), (True, ">"), (False, "<"), (False, ">")])
def test_an_elf_binary_is_checked_against_its_own_header(wide: bool, order: str) -> None:
    whole = _elf(wide, order, [(1, 0, 16)])
    check_binary(whole)  # fine as it is
    with pytest.raises(EntryError) as info:
        check_binary(whole[:-1])  # the section table cut by one byte
    n = len(whole)
    assert str(info.value) == f"binary: section headers ends at byte {n}, the binary has {n - 1}"
    past = _elf(wide, order, [(1, 0, 16), (1, 8, 10_000)])
    with pytest.raises(EntryError) as info:
        check_binary(past)
    assert str(info.value) == f"binary: section 1 ends at byte 10008, the binary has {len(past)}"
    check_binary(_elf(wide, order, [(8, 8, 10_000)]))  # .bss: no bytes in the file
    head = 64 if wide else 52
    program = _elf(wide, order, [])[: head + 10]  # the program header cut short
    with pytest.raises(EntryError) as info:
        check_binary(program)
    assert str(info.value).startswith("binary: program headers ends at byte")
    with pytest.raises(EntryError) as info:
        check_binary(whole[:20])  # cut inside the ELF header itself
    assert str(info.value).startswith("binary: cut inside a header (")


@pytest.mark.parametrize(("wide", "order"), [(True, "<"), (True, ">"), (False, "<"), (False, ">")])
def test_offsets_past_the_signed_range_are_refused(wide: bool, order: str) -> None:
    # offsets are unsigned: a hostile 2**64 - 64 is far past the end, not 64 bytes before it
    whole = _elf(wide, order, [(1, 0, 16)])
    # in the only section header after its name, type, flags and address
    section_offset = len(whole) - 64 + 24 if wide else len(whole) - 40 + 16
    unit, bits = ("Q", 64) if wide else ("I", 32)
    for at, what in ((32 if wide else 28, "program headers"), (section_offset, "section 0")):
        bad = bytearray(whole)
        struct.pack_into(order + unit, bad, at, 2**bits - 64)
        with pytest.raises(EntryError, match=f"binary: {what} ends at byte "):
            check_binary(bytes(bad))
