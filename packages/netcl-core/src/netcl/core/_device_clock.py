"""Mapping an OpenCL device's profiling clock onto the host's ``time.time_ns()`` clock.

Profiling timestamps (``CL_PROFILING_COMMAND_*``) count nanoseconds on a device clock whose origin
is unspecified. The offset to the host clock is measured with markers on a queue of our own: the
host reads ``t0``, enqueues a marker, waits for it and reads ``t1``. The marker was queued after
``t0`` and ended before ``t1``, so the offset ``host - device`` lies in ``[t0 - queued, t1 - end]``.
Several rounds are intersected; the estimate is the middle of what is left and its tolerance half
its width (tens of microseconds on a loaded CPU). The wait is on our own queue, never on the
caller's commands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyopencl as cl

_PROFILING = cl.command_queue_properties.PROFILING_ENABLE
_QUEUED = cl.profiling_info.QUEUED
_START = cl.profiling_info.START
_END = cl.profiling_info.END


@dataclass(frozen=True)
class DeviceClock:
    """How a device's profiling timestamps map onto ``time.time_ns()``: ``host = device +
    offset_ns``, right to within ``tolerance_ns``, measured at ``measured_ns`` (host clock)."""

    offset_ns: int
    tolerance_ns: int
    measured_ns: int

    def to_host(self, device_ns: int) -> int:
        """A device timestamp on the host clock (ns since the epoch)."""
        return device_ns + self.offset_ns


def calibrate(context: cl.Context, device: cl.Device, rounds: int = 8) -> DeviceClock:
    """Measure ``device``'s clock against the host's with ``rounds`` markers on a queue of its
    own (created on ``context`` and dropped after)."""
    queue = cl.CommandQueue(context, device, properties=_PROFILING)
    bounds: list[tuple[int, int, int]] = []  # (lower via QUEUED, lower via START, upper via END)
    try:
        for _ in range(rounds):
            t0 = time.time_ns()
            marker = cl.enqueue_marker(queue)
            marker.wait()
            t1 = time.time_ns()
            queued = marker.get_profiling_info(_QUEUED)
            start = marker.get_profiling_info(_START)
            end = marker.get_profiling_info(_END)
            bounds.append((t0 - queued, t0 - start, t1 - end))
    finally:
        queue.finish()
    return _estimate(bounds, time.time_ns())


def _estimate(bounds: list[tuple[int, int, int]], now: int) -> DeviceClock:
    high = min(b[2] for b in bounds)
    # QUEUED gives the tighter lower bound; some drivers stamp it on another clock or late, which
    # shows as an empty intersection: then START (which always follows the enqueue) is used.
    for column in (0, 1):
        low = max(b[column] for b in bounds)
        if low <= high:
            return DeviceClock((low + high) // 2, (high - low + 1) // 2, now)
    # Still inconsistent (a clock that jumps): the narrowest single round, honestly wide.
    _, a, b = min(bounds, key=lambda b: abs(b[2] - b[1]))
    low, high = min(a, b), max(a, b)
    return DeviceClock((low + high) // 2, max(1, (high - low + 1) // 2), now)
