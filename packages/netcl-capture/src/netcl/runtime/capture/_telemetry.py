"""Spans and metrics of netcl.runtime.capture: names and instruments (names are API).

The counters are observable: a replay adds to two integers (tens of nanoseconds, SDK or not)
and the SDK reads them when a metric reader collects. A synchronous ``Counter.add`` costs ~3 µs
per call with an SDK installed, which alone would be a few percent of a replay.
"""

from __future__ import annotations

import threading

from opentelemetry.util.types import AttributeValue

from netcl.core import telemetry
from netcl.runtime.capture.version import __version__

__all__ = ["COMMANDS", "LAUNCHES", "REBOUND", "RECORD_SPAN", "REPLAY_SPAN", "TEL", "TOTALS"]

TEL = telemetry.Scope("netcl.runtime.capture", __version__)

RECORD_SPAN = "netcl.capture.record"  # begin() .. end()
REPLAY_SPAN = "netcl.capture.replay"  # every replay / replay_with_new_buffers
LAUNCHES = "netcl.capture.launches"
COMMANDS = "netcl.capture.commands"
REBOUND = "netcl.capture.rebound"  # substituted buffers of a replay


class _Totals:
    """Process totals since import, read by the observable counters."""

    __slots__ = ("recorded_launches", "replayed_launches", "replays")

    def __init__(self) -> None:
        self.replays = 0
        self.replayed_launches = 0
        self.recorded_launches = 0

    def replay(self, launches: int) -> None:
        with _lock:
            self.replays += 1
            self.replayed_launches += launches

    def recorded(self, launches: int) -> None:
        with _lock:
            self.recorded_launches += launches


_lock = threading.Lock()
TOTALS = _Totals()
_NONE: dict[str, AttributeValue] = {}

TEL.observable_counter(
    "netcl.capture.replays", lambda: [(TOTALS.replays, _NONE)], "{replay}",
    "Replays of captured launch sequences",
)  # fmt: skip
TEL.observable_counter(
    "netcl.capture.replayed_launches", lambda: [(TOTALS.replayed_launches, _NONE)], "{launch}",
    "Kernel launches enqueued by replays",
)  # fmt: skip
TEL.observable_counter(
    "netcl.capture.recorded_launches", lambda: [(TOTALS.recorded_launches, _NONE)], "{launch}",
    "Kernel launches recorded by captures",
)  # fmt: skip
