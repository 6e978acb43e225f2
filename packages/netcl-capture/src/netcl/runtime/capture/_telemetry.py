"""Spans and metrics of netcl.runtime.capture (names are API). The counters are observable
(``telemetry.Counts``, read at collection): a synchronous ``Counter.add`` would cost ~3 µs per
replay with an SDK installed."""

from __future__ import annotations

from netcl.core import telemetry
from netcl.runtime.capture.version import __version__

TEL = telemetry.Scope("netcl.runtime.capture", __version__)

RECORD_SPAN = "netcl.capture.record"  # begin() .. end()
REPLAY_SPAN = "netcl.capture.replay"  # every replay / replay_with_new_buffers
LAUNCHES = "netcl.capture.launches"
COMMANDS = "netcl.capture.commands"
ARENA_BYTES = "netcl.capture.arena_bytes"  # the capture's own memory (record span, gauge)
REBOUND = "netcl.capture.rebound"  # substituted buffers of a replay
# captured steps (capture_step)
STEP_CAPTURE_SPAN = "netcl.step.capture"  # a call that records
STEP_CHECK_SPAN = "netcl.step.check"  # check mode's normal run beside a first replay
STEP_NAME = "netcl.step.name"
STEP_REASON = "netcl.step.reason"  # why the guard key was new
# saved captures and steps
SAVE_SPAN = "netcl.capture.save"
LOAD_SPAN = "netcl.capture.load"
FILE = "netcl.capture.file"
BYTES = "netcl.capture.bytes"  # the file's size
SECTIONS = "netcl.capture.sections"
REBUILT = "netcl.capture.rebuilt_programs"  # programs built from source for another device

# process totals since import
REPLAYS, REPLAYED_LAUNCHES, RECORDED_LAUNCHES = (telemetry.Counts() for _ in range(3))
for _name, _totals, _unit, _what in (
    ("replays", REPLAYS, "{replay}", "Replays of captured launch sequences"),
    ("replayed_launches", REPLAYED_LAUNCHES, "{launch}", "Kernel launches enqueued by replays"),
    ("recorded_launches", RECORDED_LAUNCHES, "{launch}", "Kernel launches recorded by captures"),
):
    _totals.add(0)  # reported from import on, 0 before the first replay
    TEL.observable_counter(f"netcl.capture.{_name}", _totals.points, _unit, _what)

ARENA = telemetry.Counts()  # the bytes of the arenas of every live capture (a capture's own memory)
ARENA.add(0)
TEL.observable_gauge(
    ARENA_BYTES, ARENA.points, "By", "Device bytes of the private arenas of the live captures"
)
