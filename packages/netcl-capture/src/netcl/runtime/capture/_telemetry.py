"""Spans and metrics of netcl.runtime.capture (names per the project's telemetry contract).

The counters are observable: a replay adds to two module-level integers (tens of nanoseconds,
SDK or not) and the SDK reads them when a metric reader collects. A synchronous ``Counter.add``
costs ~3 µs per call with an SDK installed, which alone would be a few percent of a replay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from netcl.core import telemetry
from netcl.runtime.capture.version import __version__

__all__ = ["count_recorded", "count_replay", "tracer"]

SCOPE = "netcl.runtime.capture"

tracer = telemetry.tracer(SCOPE, __version__)
_meter = telemetry.meter(SCOPE, __version__)

_lock = threading.Lock()
# replays, replayed launches, recorded launches: process totals since import
_totals = [0, 0, 0]


def count_replay(launches: int) -> None:
    with _lock:
        _totals[0] += 1
        _totals[1] += launches


def count_recorded(launches: int) -> None:
    with _lock:
        _totals[2] += launches


def _observe(index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(_totals[index])]

    return callback


_meter.create_observable_counter(
    "netcl.capture.replays", [_observe(0)], unit="{replay}",
    description="Replays of captured launch sequences",
)
_meter.create_observable_counter(
    "netcl.capture.replayed_launches", [_observe(1)], unit="{launch}",
    description="Kernel launches enqueued by replays",
)
_meter.create_observable_counter(
    "netcl.capture.recorded_launches", [_observe(2)], unit="{launch}",
    description="Kernel launches recorded by captures",
)

# Set on a capture span when the capture or replay failed: the exception's class name, or
# "discarded" for a recording dropped by reset() (OpenTelemetry's semantic attribute).
ERROR_TYPE = "error.type"
