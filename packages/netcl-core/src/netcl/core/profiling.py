"""Device time: what the OpenCL device spent on the commands netcl enqueues, as spans and metrics.

A queue created with ``PROFILING_ENABLE`` stamps every command with device start and end times.
Packages (or an application) hand the events of a unit of work to the process-wide collector
with :func:`watch` (the commands themselves: one device span per command) or
:func:`watch_markers` (two markers around work whose commands are not visible, e.g. a graph node
running user code). The collector reads the timestamps only once the events are complete, on a
daemon thread (every 50 ms), at :func:`flush`, or when :meth:`DeviceTime.poll` is asked: it never
waits for the caller's commands. Device timestamps are mapped onto the host clock
(``time.time_ns()``) by a per-device calibration (see :class:`DeviceClock`), redone every 10 s.

What it records, per watched unit of work:

- a span ``netcl.device.<kind>`` (``netcl.device.replay``, ``netcl.device.node``,
  ``netcl.device.plan``, ``netcl.device.commands``) from the first command's device start to the
  last one's end, as a child of the host span given as ``parent`` (default: the span current
  at the call), recorded when the events complete, which may be after the host span ended;
  attributes ``netcl.device.name``, ``netcl.device.duration`` (busy seconds), and the kind's
  name attribute;
- under it, for :func:`watch`, one span per command: ``netcl.device.kernel`` (attribute
  ``netcl.kernel.name``), ``netcl.device.transfer`` or ``netcl.device.command`` (attribute
  ``netcl.device.command``, e.g. ``read_buffer``, ``marker``);
- the histogram of the kind (seconds): ``netcl.capture.replay.device_duration``,
  ``netcl.graph.node.device_duration`` (``netcl.node.name``),
  ``netcl.scheduler.plan.device_duration`` (``netcl.plan.description``);
- ``netcl.kernel.duration`` (seconds, ``netcl.kernel.name``) for every kernel command with a
  label, and the gauge ``netcl.device.busy`` (``netcl.device.name``): the fraction of the last
  5 seconds in which watched commands ran on the device.

The device duration of a :func:`watch` is the device's busy time: the union of the commands'
``[start, end]`` intervals (their sum on an in-order queue). For :func:`watch_markers` it is
``after.end - before.end``: all the device did between the two markers.

Without profiling nothing changes: check :func:`enabled` once per queue (about 0.1 µs) and don't
call :func:`watch`. Watching a command of a queue without profiling drops it (counted in
:attr:`Stats.dropped`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyopencl as cl
from opentelemetry.util.types import AttributeValue

from netcl.core import telemetry
from netcl.core._collector import Collector, DeviceTime, Stats
from netcl.core._device_clock import DeviceClock
from netcl.core._profiling_emit import (
    COMMANDS,
    DEVICE_BUCKETS_S,
    GRAPH_NODE,
    REPLAY,
    SCHEDULER_PLAN,
    TEL,
)
from netcl.core._profiling_io import Command

__all__ = [
    "COMMANDS",
    "DEVICE_BUCKETS_S",
    "GRAPH_NODE",
    "REPLAY",
    "SCHEDULER_PLAN",
    "Collector",
    "Command",
    "DeviceClock",
    "DeviceTime",
    "Stats",
    "collector",
    "enabled",
    "flush",
    "watch",
    "watch_markers",
]

_PROFILING = cl.command_queue_properties.PROFILING_ENABLE


def enabled(queue: cl.CommandQueue) -> bool:
    """Whether ``queue`` was created with profiling (the one check to make before watching)."""
    return bool(queue.properties & _PROFILING)


_collector = Collector()


def collector() -> Collector:
    """The process-wide collector that :func:`watch` and :func:`watch_markers` hand work to."""
    return _collector


def watch(
    kind: str,
    events: Sequence[cl.Event],
    *,
    labels: Sequence[str] = (),
    name: str | None = None,
    parent: telemetry.Span | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> DeviceTime:
    """:meth:`Collector.watch` on the process-wide collector."""
    return _collector.watch(kind, events, labels=labels, name=name, parent=parent,
                            attributes=attributes)  # fmt: skip


def watch_markers(
    kind: str,
    before: cl.Event,
    after: cl.Event,
    *,
    name: str | None = None,
    parent: telemetry.Span | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> DeviceTime:
    """:meth:`Collector.watch_markers` on the process-wide collector."""
    return _collector.watch_markers(kind, before, after, name=name, parent=parent,
                                    attributes=attributes)  # fmt: skip


def flush(timeout: float = 5.0) -> int:
    """:meth:`Collector.flush` on the process-wide collector."""
    return _collector.flush(timeout)


def _observe_busy() -> Iterable[tuple[float, Mapping[str, AttributeValue]]]:
    return [(v, {"netcl.device.name": d}) for d, v in _collector.busy().items()]


TEL.observable_gauge(
    "netcl.device.busy", _observe_busy, "1",
    "Fraction of the last 5 s in which watched commands ran on the device",
)  # fmt: skip
