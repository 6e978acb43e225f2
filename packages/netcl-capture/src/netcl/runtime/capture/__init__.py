"""netcl.runtime.capture: record OpenCL kernel launches once, replay them cheaply.

``capture_step`` runs a step function, records its launches on the next call and replays them
afterwards; ``KernelCapture`` records the launches, copies and fills of the thread that called
``begin()`` and ``replay()`` enqueues them again at close to the cost of bare enqueues.
"""

import importlib
from typing import TYPE_CHECKING, Any

from netcl.runtime.capture._capture import KernelCapture, get_capture, load_capture
from netcl.runtime.capture._intercept import capture_disabled
from netcl.runtime.capture.version import __version__ as __version__

if TYPE_CHECKING:
    from netcl.runtime.capture._saved import CaptureFileError
    from netcl.runtime.capture._step import (
        CapturedStep,
        LoadedStep,
        StepCheckError,
        StepStats,
        capture_step,
        load_step,
    )

# capture_step, saved files and their types load on first use: the step modules (and
# pyopencl.array, which they need) are most of this package's import time, and a KernelCapture
# user never needs them
_LAZY = {
    "CapturedStep": "_step",
    "LoadedStep": "_step",
    "StepCheckError": "_step",
    "StepStats": "_step",
    "capture_step": "_step",
    "load_step": "_step",
    "CaptureFileError": "_saved",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CaptureFileError",
    "CapturedStep",
    "KernelCapture",
    "LoadedStep",
    "StepCheckError",
    "StepStats",
    "capture_disabled",
    "capture_step",
    "get_capture",
    "load_capture",
    "load_step",
]
