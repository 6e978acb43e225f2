"""netcl.runtime.capture: record OpenCL kernel launches once, replay them cheaply.

``capture_step`` turns a step function into one that runs normally, records its launches on
the next call and replays them afterwards (a capture per argument shape, bounded).
``KernelCapture`` records every ``cl.Kernel.__call__`` (and ``cl.enqueue_nd_range_kernel``,
copies and fills) of the thread that called ``begin()``; ``replay()`` enqueues the same sequence
with per-launch host cost close to a bare ``enqueue_nd_range_kernel``.
"""

from netcl.runtime.capture._capture import KernelCapture, get_capture
from netcl.runtime.capture._intercept import capture_disabled

# after KernelCapture: the step module builds on it
from netcl.runtime.capture._step import (
    CapturedStep,
    StepCheckError,
    StepStats,
    capture_step,
)
from netcl.runtime.capture.version import __version__ as __version__

__all__ = [
    "CapturedStep",
    "KernelCapture",
    "StepCheckError",
    "StepStats",
    "capture_disabled",
    "capture_step",
    "get_capture",
]
