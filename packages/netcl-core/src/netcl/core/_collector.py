"""The collector behind netcl.core.profiling: pending units of work, collection off the caller's
thread, per-device clocks and busy intervals."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import pyopencl as cl
from opentelemetry.util.types import AttributeValue

from netcl.core import telemetry
from netcl.core._device_clock import DeviceClock, calibrate
from netcl.core._profiling_emit import KINDS, emit
from netcl.core._profiling_io import (
    Command,
    CommandFailedError,
    DeviceInfo,
    read_commands,
    union_ns,
)

_log = logging.getLogger("netcl.core.profiling")


class DeviceTime:
    """The device time of one watched unit of work, filled in when its events complete.

    ``duration`` (seconds), ``start_ns``/``end_ns`` (host clock, ns since the epoch) and
    ``commands`` (one :class:`Command` per event of :func:`watch`) are None/empty until then.
    """

    __slots__ = ("_between", "_events", "_owner", "attributes", "commands", "done", "duration",
                 "end_ns", "kind", "labels", "name", "parent", "start_ns")  # fmt: skip

    def __init__(
        self,
        owner: Collector,
        kind: str,
        events: Sequence[cl.Event],
        labels: Sequence[str],
        name: str | None,
        parent: telemetry.Span,
        attributes: Mapping[str, AttributeValue] | None,
        between: bool,
    ) -> None:
        self._owner = owner
        self.kind, self.name, self.labels, self.parent = kind, name, labels, parent
        self.attributes = attributes
        self._events, self._between = events, between
        self.done = False
        self.duration: float | None = None
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.commands: tuple[Command, ...] = ()

    def ready(self) -> bool:
        """Whether every event has completed (or failed): a status read, no wait."""
        complete = cl.command_execution_status.COMPLETE
        return all(e.command_execution_status <= complete for e in reversed(self._events))

    def poll(self) -> float | None:
        """The device duration in seconds if the events have completed (collecting them now,
        in the caller's thread), else None. Never waits."""
        if not self.done and self.ready():
            self._owner.collect_one(self)
        return self.duration

    def __repr__(self) -> str:
        state = f"{self.duration * 1e3:.3f} ms" if self.duration is not None else "pending"
        return f"DeviceTime({self.kind!r}, {self.name!r}, {state})"


class Stats(NamedTuple):
    """What a collector has seen: units of work watched, collected, dropped (a failed command,
    a queue without profiling, or more than ``max_pending`` waiting), still pending, and
    recorded without per-command spans (over the span budget); device seconds and counts per
    kind and per kernel label."""

    watched: int
    collected: int
    dropped: int
    pending: int
    spans_skipped: int
    by_kind: dict[str, tuple[int, float]]
    by_kernel: dict[str, tuple[int, float]]


@dataclass
class _Totals:
    watched: int = 0
    collected: int = 0
    dropped: int = 0
    spans_skipped: int = 0
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    by_kernel: dict[str, list[float]] = field(default_factory=dict)


class Collector:
    """Collects device time of watched events without waiting for them (see the module doc).

    ``interval`` (s) is how often the daemon thread looks at pending events, ``recalibrate``
    (s) how old a device clock calibration may get, ``busy_window`` (s) the window of
    ``netcl.device.busy``, ``max_pending`` how many units may wait before the oldest is dropped.
    ``span_budget`` is the share of one CPU core that recording spans may take, averaged over a
    second: an SDK span costs 10-30 µs, so a replay of 64 kernels would cost a millisecond of
    the application's interpreter; past the budget a unit gets its envelope span and all its
    metric points but not its per-command spans (the envelope says how many were skipped).
    """

    def __init__(
        self,
        *,
        interval: float = 0.05,
        recalibrate: float = 10.0,
        busy_window: float = 5.0,
        max_pending: int = 100_000,
        span_budget: float = 0.05,
    ) -> None:
        self.interval, self.recalibrate, self.busy_window = interval, recalibrate, busy_window
        self.max_pending, self.span_budget = max_pending, span_budget
        self._credit = span_budget  # seconds of span work allowed now (refills at span_budget/s)
        self._credit_at = time.monotonic()
        self._pending: deque[DeviceTime] = deque()
        self._lock = threading.RLock()  # one collection at a time; guards the fields below
        self._clocks: dict[int, DeviceClock] = {}
        self._devices: dict[int, DeviceInfo] = {}
        self._busy: dict[str, deque[tuple[int, int]]] = {}
        self._totals = _Totals()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._warned: set[type[BaseException]] = set()

    # -- hand-off (the caller's thread: no OpenCL call, no wait) -----------------------------
    def watch(
        self,
        kind: str,
        events: Sequence[cl.Event],
        *,
        labels: Sequence[str] = (),
        name: str | None = None,
        parent: telemetry.Span | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> DeviceTime:
        """Watch the commands behind ``events`` (one unit of work of ``kind``); ``labels[i]``
        names event i (a kernel's function name), ``name`` the unit (node name, plan
        description), ``parent`` the host span (default: the current span)."""
        if len(labels) > len(events):
            raise ValueError(
                f"profiling.watch: {len(labels)} labels for {len(events)} events; expected at "
                "most one label per event"
            )
        return self._add(kind, tuple(events), tuple(labels), name, parent, attributes, False)

    def watch_markers(
        self,
        kind: str,
        before: cl.Event,
        after: cl.Event,
        *,
        name: str | None = None,
        parent: telemetry.Span | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> DeviceTime:
        """Watch the work between two markers enqueued on one in-order queue, ``before`` and
        ``after`` it: its device time is ``after.end - before.end``."""
        return self._add(kind, (before, after), (), name, parent, attributes, True)

    def _add(
        self,
        kind: str,
        events: tuple[cl.Event, ...],
        labels: tuple[str, ...],
        name: str | None,
        parent: telemetry.Span | None,
        attributes: Mapping[str, AttributeValue] | None,
        between: bool,
    ) -> DeviceTime:
        if kind not in KINDS:
            raise ValueError(
                f"profiling.watch: unknown kind {kind!r}; expected one of {sorted(KINDS)}"
            )
        if not events:
            raise ValueError("profiling.watch: no events; expected at least one cl.Event")
        if parent is None:
            parent = telemetry.current_span()
        unit = DeviceTime(self, kind, events, labels, name, parent, attributes, between)
        if self._thread is None:
            self._start()
        pending = self._pending
        pending.append(unit)
        self._totals.watched += 1
        if len(pending) > self.max_pending:
            pending.popleft()
            self._totals.dropped += 1
        return unit

    # -- collection (daemon thread, flush, poll, metric readers) -----------------------------
    def collect(self) -> int:
        """Record every pending unit whose events have completed; returns how many are still
        pending. Never waits for events."""
        with self._lock:
            pending = self._pending
            waiting: list[DeviceTime] = []
            for _ in range(len(pending)):
                unit = pending.popleft()
                if unit.done:
                    continue
                if unit.ready():
                    self._record(unit)
                else:
                    waiting.append(unit)
            pending.extendleft(reversed(waiting))
            return len(waiting)

    def collect_one(self, unit: DeviceTime) -> None:
        """Record ``unit`` now if its events have completed (it leaves the pending list on the
        next :meth:`collect`)."""
        with self._lock:
            if not unit.done and unit.ready():
                self._record(unit)

    def flush(self, timeout: float = 5.0) -> int:
        """Collect, waiting up to ``timeout`` seconds for pending events to complete (an explicit
        host wait, for the end of a run); returns how many are still pending."""
        deadline = time.monotonic() + timeout
        left = self.collect()
        while left and time.monotonic() < deadline:
            time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
            left = self.collect()
        return left

    def clock(self, device: cl.Device) -> DeviceClock | None:
        """The current calibration of ``device``'s clock (None before its first collection)."""
        return self._clocks.get(device.int_ptr)

    def stats(self) -> Stats:
        """A snapshot of what was watched and collected."""
        with self._lock:
            t = self._totals

            def freeze(d: dict[str, list[float]]) -> dict[str, tuple[int, float]]:
                return {k: (int(v[0]), v[1]) for k, v in d.items()}

            return Stats(t.watched, t.collected, t.dropped, len(self._pending), t.spans_skipped,
                         freeze(t.by_kind), freeze(t.by_kernel))  # fmt: skip

    def busy(self, now_ns: int | None = None) -> dict[str, float]:
        """Per device name, the fraction of the last ``busy_window`` seconds in which watched
        commands ran (commands seen so far; a command still running counts from the next
        collection)."""
        self.collect()
        now = now_ns if now_ns is not None else time.time_ns()
        low = now - int(self.busy_window * 1e9)
        out = {}
        with self._lock:
            for dev, intervals in self._busy.items():
                while intervals and intervals[0][1] < low - int(1e9):
                    intervals.popleft()
                clipped = [(max(s, low), min(e, now)) for s, e in intervals if e > low and s < now]
                out[dev] = union_ns(clipped) / (now - low)
        return out

    def _record(self, unit: DeviceTime) -> None:
        try:
            info, commands = read_commands(unit._events, unit.labels, self._device, self._clock)
        except (cl.Error, CommandFailedError) as exc:  # a queue without profiling, a failure
            unit.done = True
            self._totals.dropped += 1
            self._warn_once(exc)
            return
        unit.done = True
        unit.commands = () if unit._between else tuple(commands)
        if unit._between:
            before, after = commands[0], commands[-1]
            unit.start_ns, unit.end_ns = before.end_ns, max(after.end_ns, before.end_ns)
            busy_ns = unit.end_ns - unit.start_ns
        else:
            unit.start_ns = min(c.start_ns for c in commands)
            unit.end_ns = max(c.end_ns for c in commands)
            busy_ns = union_ns([(c.start_ns, c.end_ns) for c in commands])
            self._busy.setdefault(info.name, deque()).extend(
                (c.start_ns, c.end_ns) for c in commands
            )
        unit.duration = busy_ns / 1e9
        self._account(unit, info)
        self._emit(unit, info)

    def _emit(self, unit: DeviceTime, info: DeviceInfo) -> None:
        """Record the unit, its per-command spans only while the span budget has credit."""
        now = time.monotonic()
        budget = self.span_budget
        self._credit = min(budget, self._credit + (now - self._credit_at) * budget)
        self._credit_at = now
        command_spans = self._credit > 0 or not unit.commands
        if not command_spans:
            self._totals.spans_skipped += 1
        emit(unit, info, command_spans)
        if unit.commands and telemetry.tracing():
            self._credit -= time.monotonic() - now

    def _account(self, unit: DeviceTime, info: DeviceInfo) -> None:
        t = self._totals
        t.collected += 1
        _add_to(t.by_kind, unit.kind, unit.duration or 0.0)
        for c in unit.commands:
            if c.kernel:
                _add_to(t.by_kernel, c.name, (c.end_ns - c.start_ns) / 1e9)

    def _device(self, event: cl.Event) -> DeviceInfo:
        queue = event.command_queue
        key = queue.int_ptr
        info = self._devices.get(key)
        if info is None:
            dev = queue.device
            info = DeviceInfo(dev.int_ptr, dev.name.strip(), queue.context, dev)
            self._devices[key] = info
        return info

    def _clock(self, info: DeviceInfo) -> DeviceClock:
        clock = self._clocks.get(info.key)
        if clock is None or time.time_ns() - clock.measured_ns > self.recalibrate * 1e9:
            clock = self._clocks[info.key] = calibrate(info.context, info.device)
        return clock

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name="netcl-profiling", daemon=True
            )
            self._thread.start()
            atexit.register(self.flush, 1.0)  # before the SDK's own exit hooks (LIFO)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.collect()
            except Exception as exc:  # never let the collector thread die
                self._warn_once(exc)

    def _warn_once(self, exc: BaseException) -> None:
        if type(exc) not in self._warned:
            self._warned.add(type(exc))
            _log.warning("device time not collected: %r (later ones of this kind not logged)",
                         exc)  # fmt: skip


def _add_to(d: dict[str, list[float]], key: str, seconds: float) -> None:
    entry = d.setdefault(key, [0, 0.0])
    entry[0] += 1
    entry[1] += seconds
