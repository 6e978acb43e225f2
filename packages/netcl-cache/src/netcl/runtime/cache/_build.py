"""Building programs: from source (a miss), or from a cached binary (a disk or remote hit), and
the error a build from source raises."""

from __future__ import annotations

import time
from typing import Any

import pyopencl as cl

from netcl.core import telemetry
from netcl.core.log import get_logger
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._binary import check_binary
from netcl.runtime.cache.version import __version__

__all__ = ["ProgramBuildError", "compile_program", "entry_meta", "from_binary"]

log = get_logger("netcl.runtime.cache")


class ProgramBuildError(RuntimeError):
    """The OpenCL compiler rejected a program. Carries the full build log; never cached.

    Attributes: ``log`` (the driver's build log), ``device_name``, ``options``, ``code`` (the
    OpenCL error code). The original ``pyopencl.RuntimeError`` is the ``__cause__``.
    """

    def __init__(self, *, device_name: str, options: str, log: str, code: int | None) -> None:
        self.device_name = device_name
        self.options = options
        self.log = log
        self.code = code
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
    prg._build(options=options.encode("utf-8", "surrogateescape"), devices=[dev])


def from_binary(ctx: cl.Context, dev: cl.Device, opts: str, binary: Any) -> cl.Program:
    """A built program of an authentic binary: :class:`EntryError` ``binary`` when its own
    lengths do not add up (never handed to the driver), ``cl.Error`` when the driver rejects
    it."""
    check_binary(binary)
    prg = cl._cl._Program(ctx, [dev], [binary])
    _build(prg, opts, dev)
    return cl.Program(prg)


def entry_meta(dev: cl.Device, ident: str, opts: str, src_len: int) -> dict[str, Any]:
    """The metadata stored beside a binary (disk entry and remote value)."""
    return {"device": dev.name, "identity": ident, "options": opts, "source_bytes": src_len,
            "created": time.time(), "writer": f"netcl-cache {__version__}"}  # fmt: skip


def _build_error(prg: Any, dev: cl.Device, opts: str, exc: cl.Error) -> ProgramBuildError:
    try:
        build_log = str(prg.get_build_info(dev, cl.program_build_info.LOG))
    except cl.Error:
        build_log = ""
    return ProgramBuildError(
        device_name=dev.name, options=opts, log=build_log or str(exc),
        code=getattr(exc, "code", None),
    )


def compile_program(
    ctx: cl.Context, src_code: str, dev: cl.Device, opts: str, key: str, device_name: str
) -> tuple[cl.Program, bytes]:
    """Build from source for ``dev``: (program, its binary, b'' when the driver has none).
    Raises :class:`ProgramBuildError` with the build log."""
    t0 = time.perf_counter()
    point = {tel.ATTR_DEVICE: device_name}
    try:
        with tel.TEL.span(tel.SPAN_COMPILE, {tel.ATTR_OPTIONS: opts, tel.ATTR_KEY: key}) as span:
            prg = cl._cl._Program(ctx, src_code)
            try:
                _build(prg, opts, dev)
            except cl.Error as exc:
                err = _build_error(prg, dev, opts, exc)
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
