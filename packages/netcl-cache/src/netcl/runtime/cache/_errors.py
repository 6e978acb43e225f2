"""Errors raised by the program cache."""

from __future__ import annotations

__all__ = ["ProgramBuildError"]


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
