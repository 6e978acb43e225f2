"""Spans and metrics of netcl.runtime.capture: names and instruments (names are API).

The counters are observable (``telemetry.Counts``): a replay adds to two numbers and the SDK
reads them when a metric reader collects; a synchronous ``Counter.add`` would cost ~3 µs per
call with an SDK installed, a few percent of a replay.
"""

from __future__ import annotations

from netcl.core import telemetry
from netcl.runtime.capture.version import __version__

__all__ = ["COMMANDS", "LAUNCHES", "REBOUND", "RECORDED_LAUNCHES", "RECORD_SPAN",
           "REPLAYED_LAUNCHES", "REPLAYS", "REPLAY_SPAN", "STEP_CAPTURE_SPAN", "STEP_CHECK_SPAN",
           "STEP_NAME", "STEP_REASON", "TEL"]  # fmt: skip

TEL = telemetry.Scope("netcl.runtime.capture", __version__)

RECORD_SPAN = "netcl.capture.record"  # begin() .. end()
REPLAY_SPAN = "netcl.capture.replay"  # every replay / replay_with_new_buffers
LAUNCHES = "netcl.capture.launches"
COMMANDS = "netcl.capture.commands"
REBOUND = "netcl.capture.rebound"  # substituted buffers of a replay
# captured steps (capture_step)
STEP_CAPTURE_SPAN = "netcl.step.capture"  # a call that records
STEP_CHECK_SPAN = "netcl.step.check"  # check mode's normal run beside a first replay
STEP_NAME = "netcl.step.name"
STEP_REASON = "netcl.step.reason"  # why the guard key was new

# process totals since import
REPLAYS = telemetry.Counts()
REPLAYED_LAUNCHES = telemetry.Counts()
RECORDED_LAUNCHES = telemetry.Counts()
for _totals in (REPLAYS, REPLAYED_LAUNCHES, RECORDED_LAUNCHES):
    _totals.add(0)  # reported from import on, 0 before the first replay
TEL.observable_counter("netcl.capture.replays", REPLAYS.points, "{replay}",
                       "Replays of captured launch sequences")  # fmt: skip
TEL.observable_counter("netcl.capture.replayed_launches", REPLAYED_LAUNCHES.points, "{launch}",
                       "Kernel launches enqueued by replays")  # fmt: skip
TEL.observable_counter("netcl.capture.recorded_launches", RECORDED_LAUNCHES.points, "{launch}",
                       "Kernel launches recorded by captures")  # fmt: skip
