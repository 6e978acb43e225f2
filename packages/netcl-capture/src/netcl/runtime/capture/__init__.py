"""netcl.runtime.capture: record OpenCL kernel launches once, replay them cheaply.

``KernelCapture`` records every ``cl.Kernel.__call__`` (and ``cl.enqueue_nd_range_kernel``,
copies and fills) of the thread that called ``begin()``; ``replay()`` enqueues the same sequence
with per-launch host cost close to a bare ``enqueue_nd_range_kernel``.
"""

from netcl.runtime.capture._capture import KernelCapture, get_capture
from netcl.runtime.capture._intercept import capture_disabled
from netcl.runtime.capture.version import __version__ as __version__

__all__ = ["KernelCapture", "capture_disabled", "get_capture"]
