"""netcl.runtime.capture: record OpenCL kernel launches once, replay them cheaply.

``capture_step`` runs a step function, records its launches on the next call and replays them
afterwards; ``KernelCapture`` records the launches, copies and fills of the thread that called
``begin()`` and ``replay()`` enqueues them again at close to the cost of bare enqueues.
"""

from typing import TYPE_CHECKING, Any

from netcl.runtime.capture._capture import KernelCapture, get_capture, load_capture
from netcl.runtime.capture._intercept import capture_disabled
from netcl.runtime.capture._saved import CaptureFileError
from netcl.runtime.capture.version import __version__ as __version__

if TYPE_CHECKING:
    from netcl.runtime.capture._step import (
        CapturedStep,
        LoadedStep,
        StepCheckError,
        StepStats,
        capture_step,
        load_step,
    )

# capture_step and its types load on first use: the step modules (and pyopencl.array, which
# they need) are most of this package's import time, and a KernelCapture user never needs them
_STEP_NAMES = frozenset({"CapturedStep", "LoadedStep", "StepCheckError", "StepStats",
                         "capture_step", "load_step"})


def __getattr__(name: str) -> Any:
    if name in _STEP_NAMES:
        from netcl.runtime.capture import _step

        value = getattr(_step, name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["CaptureFileError", "CapturedStep", "KernelCapture", "LoadedStep", "StepCheckError",
           "StepStats", "capture_disabled", "capture_step", "get_capture", "load_capture",
           "load_step"]  # fmt: skip
