"""Building programs: from source (a miss, raising :class:`ProgramBuildError`), or from a cached
binary (a disk or remote hit), which is checked first (:func:`check_binary`)."""

from __future__ import annotations

import struct
import time
from typing import Any

import pyopencl as cl

from netcl.core import contract, telemetry
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._config import log
from netcl.runtime.cache._entry import EntryError
from netcl.runtime.cache.version import __version__

__all__ = ["ProgramBuildError", "check_binary", "compile_program", "entry_meta", "from_binary"]


class ProgramBuildError(RuntimeError):
    """The OpenCL compiler rejected a program (never cached): ``log`` (the driver's build log),
    ``device_name``, ``options``, ``code`` (the OpenCL error code); the ``pyopencl.RuntimeError``
    is the ``__cause__``."""

    def __init__(self, *, device_name: str, options: str, log: str, code: int | None) -> None:
        self.device_name, self.options, self.log, self.code = device_name, options, log, code
        opts = f" with options {options!r}" if options else ""
        super().__init__(
            f"OpenCL build failed on device {device_name!r}{opts} (error {code}); "
            f"build log:\n{log.rstrip() or '(empty)'}"
        )


# importable as netcl.runtime.cache.ProgramBuildError: name it so in tracebacks and error.type
ProgramBuildError.__module__ = "netcl.runtime.cache"


def _build(prg: Any, options: str, dev: cl.Device) -> None:
    # The raw clBuildProgram: pyopencl's `build` wrapper also fetches every device's build log
    # after a success (to warn about compiler output), ~0.1 ms a disk hit does not need.
    contract.build_raw(prg, options.encode("utf-8", "surrogateescape"), [dev])


def from_binary(ctx: cl.Context, dev: cl.Device, opts: str, binary: Any) -> cl.Program:
    """A built program of an authentic binary: :class:`EntryError` ``binary`` when its own
    lengths do not add up (never handed to the driver), ``cl.Error`` when the driver rejects
    it."""
    check_binary(binary)
    prg = cl.Program(ctx, [dev], [binary])  # cl.Program(_Program) would ask the driver for ctx
    _build(contract.raw_program(prg), opts, dev)
    return prg


def entry_meta(dev: cl.Device, ident: str, opts: str, src_len: int) -> dict[str, Any]:
    """The metadata stored beside a binary (disk entry and remote value)."""
    return {
        "device": dev.name,
        "identity": ident,
        "options": opts,
        "source_bytes": src_len,
        "created": time.time(),
        "writer": f"netcl-cache {__version__}",
    }


def compile_program(
    ctx: cl.Context, src_code: str, dev: cl.Device, opts: str, key: str, device_name: str
) -> tuple[cl.Program, bytes]:
    """Build from source for ``dev``: (program, its binary, b'' when the driver has none).
    Raises :class:`ProgramBuildError` with the build log."""
    t0 = time.perf_counter()
    point = {tel.ATTR_DEVICE: device_name}
    try:
        with tel.TEL.span(tel.SPAN_COMPILE, {tel.ATTR_OPTIONS: opts, tel.ATTR_KEY: key}) as span:
            prg = contract.RawProgram(ctx, src_code)
            try:
                _build(prg, opts, dev)
            except cl.Error as exc:
                try:
                    build_log = str(prg.get_build_info(dev, cl.program_build_info.LOG))
                except cl.Error:
                    build_log = ""
                code = getattr(exc, "code", None)
                err = ProgramBuildError(
                    device_name=dev.name, options=opts, log=build_log or str(exc), code=code
                )
                span.set(tel.ATTR_LOG, err.log)
                raise err from exc
    except BaseException as exc:  # an interrupt mid-build is a failed point too
        point[tel.ATTR_ERROR_TYPE] = telemetry.error_type(exc)
        raise
    finally:
        tel.compile_duration.record(time.perf_counter() - t0, point)
    binary = b""
    try:
        devs = prg.get_info(cl.program_info.DEVICES)
        binary = bytes(prg.get_info(cl.program_info.BINARIES)[devs.index(dev)])
    except (cl.Error, ValueError) as exc:  # a driver that gives no binary: not cached
        log.warning("cache_no_binary", device=dev.name, error=str(exc))
    return cl.Program(prg), binary


# binary checks ----------------------------------------------------------------------------------
# Authentic and intact, a binary may still have been cut before it was stored or signed, and PoCL
# reads the lengths inside its own binary without bounds (a cut one crashes the process). So
# every length a known format declares must land inside the binary, the last record ending at its
# end: PoCL binaries (``poclbin``) and ELF files (Intel, AMD); other formats (NVIDIA's PTX text)
# have no lengths and pass.

_POCL = b"poclbin\0"
# magic, device id, format version, kernel count, flags, then the build hash (40 hex + NUL)
_POCL_HEAD = struct.Struct("<8sQIIQ41s")
# from format 9 (PoCL 3.1): the number of root entries before the hash, and each root entry
# (program.bc, ...) its size first; from format 10 a u64 after the hash when flag bit 1 is set
_POCL_HEAD_9 = struct.Struct("<8sQIIQI41s")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_POCL_KERNEL = struct.Struct("<QQI")  # record size, size of its files, size of its arg info
_ELF = b"\x7fELF"


def check_binary(binary: bytes | memoryview) -> None:
    """Raise :class:`EntryError` ``binary`` when ``binary`` is a PoCL or ELF binary whose
    declared lengths do not match its length (truncated, extended, or garbled)."""
    head = bytes(binary[:8])
    try:
        if head == _POCL:
            _check_pocl(binary)
        elif head[:4] == _ELF:
            _check_elf(binary)
    except struct.error as exc:  # a length field itself lies past the end
        raise EntryError("binary", f"cut inside a header ({exc})") from exc


def _bad(what: str, at: int, n: int) -> EntryError:
    return EntryError("binary", f"{what} ends at byte {at}, the binary has {n}")


def _file(b: bytes | memoryview, at: int, end: int) -> int:
    """The offset after one serialized file (u32 name length, name, u32 size, content)."""
    for _ in range(2):
        (size,) = _U32.unpack_from(b, at)
        at += _U32.size + size
        if at > end:
            raise _bad("a file record", at, end)
    return at


def _check_pocl(b: bytes | memoryview) -> None:
    n = len(b)
    _, _, version, num_kernels, flags = _POCL_HEAD.unpack_from(b)[:5]
    if version < 9:
        at = _file(b, _POCL_HEAD.size, n)  # the program's bitcode
    else:
        at = _POCL_HEAD_9.size + (_U64.size if version >= 10 and flags & 2 else 0)
        for _ in range(_POCL_HEAD_9.unpack_from(b)[5]):  # the root entries, each sized
            (size,) = _U64.unpack_from(b, at)
            if (end := at + _U64.size + size) > n:
                raise _bad("a root entry", end, n)
            f = at + _U64.size
            while f < end:
                f = _file(b, f, end)
            at = end
    for _ in range(num_kernels):
        size, files, _ = _POCL_KERNEL.unpack_from(b, at)
        if (end := at + size) > n or files > size:
            raise _bad("a kernel record", end, n)
        f = end - files
        while f < end:  # the kernel's compiled files
            f = _file(b, f, end)
        at = end
    if at != n:
        raise EntryError("binary", f"{n} bytes, its records end at byte {at}")


def _check_elf(b: bytes | memoryview) -> None:
    n = len(b)
    order = "<" if b[5] == 1 else ">"
    if b[4] == 2:  # ELFCLASS64
        phoff, shoff = struct.unpack_from(order + "QQ", b, 32)
        phsize, phnum, shsize, shnum = struct.unpack_from(order + "HHHH", b, 54)
        section = struct.Struct(order + "IIQQQQ")  # name, type, flags, addr, offset, size
    else:
        phoff, shoff = struct.unpack_from(order + "II", b, 28)
        phsize, phnum, shsize, shnum = struct.unpack_from(order + "HHHH", b, 42)
        section = struct.Struct(order + "IIIIII")
    for what, off, size, count in (
        ("program headers", phoff, phsize, phnum),
        ("section headers", shoff, shsize, shnum),
    ):
        if count and off + size * count > n:
            raise _bad(what, off + size * count, n)
    for i in range(shnum if shsize >= section.size else 0):
        _, kind, _, _, off, size = section.unpack_from(b, shoff + i * shsize)
        if kind != 8 and off + size > n:  # SHT_NOBITS (.bss) takes no bytes in the file
            raise _bad(f"section {i}", off + size, n)
