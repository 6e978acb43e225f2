"""Device time: what the OpenCL device spent on the commands netcl enqueues, as spans and metrics
(handed off with :func:`watch` or :func:`watch_markers`, collected without waiting; the
package's guide says what is recorded and what it costs)."""

from __future__ import annotations

import atexit
import enum
import functools
import random
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, get_args

import pyopencl as cl

from netcl.core import _sdk, settings, telemetry
from netcl.core.log import get_logger, warn_once
from netcl.core.version import __version__

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

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
    "Kind",
    "Mode",
    "Stats",
    "collector",
    "detail",
    "enabled",
    "flush",
    "watch",
    "watch_markers",
]

#: Kinds of watched work (the first argument of :func:`watch`).
Kind = Literal["replay", "graph.node", "scheduler.plan", "commands"]
REPLAY: Kind = "replay"
GRAPH_NODE: Kind = "graph.node"
SCHEDULER_PLAN: Kind = "scheduler.plan"
COMMANDS: Kind = "commands"

#: What a collector records (guide: Modes): ``commands``, every command of every unit (the
#: timeline); ``summary``, one device time per unit and per-command detail for a sample of them
#: (the level to leave on); ``none``, nothing (``enabled()`` is False for every queue).
Mode = Literal["commands", "summary", "none"]

#: Histogram buckets for device durations in seconds, 1 µs to 10 s: 1, 2.5 and 5 of each power
#: of ten (1e-6, 2.5e-6, 5e-6, 1e-5, ... 2.5, 5), then 10 (as written: ``float("2.5e-6")``).
DEVICE_BUCKETS_S: tuple[float, ...] = (
    *(float(f"{m}e{e}") for e in range(-6, 1) for m in (1, 2.5, 5)),
    10.0,
)

TEL = telemetry.Scope("netcl.core.profiling", __version__)
_log = get_logger("netcl.core.profiling")


def _durations(metric: str, units: str) -> telemetry._Safe:
    """A histogram of the device durations (seconds) of ``units``."""
    return TEL.histogram(metric, "s", f"Device time of {units}", DEVICE_BUCKETS_S)


_KERNEL_DURATION = _durations(
    "netcl.kernel.duration",
    "kernel commands, by kernel name; in summary mode sampled: only the units drawn for "
    "per-command detail (about 0.1% of a core), so rates are a fraction of the total while "
    "shares and quantiles hold",
)


_KINDS = {  # kind -> (its device span, the attribute naming a unit, its histogram)
    REPLAY: (
        "netcl.device.replay",
        "netcl.capture.name",
        _durations("netcl.capture.replay.device_duration", "capture replays"),
    ),
    GRAPH_NODE: (
        "netcl.device.node",
        "netcl.node.name",
        _durations("netcl.graph.node.device_duration", "graph nodes"),
    ),
    SCHEDULER_PLAN: (
        "netcl.device.plan",
        "netcl.plan.description",
        _durations("netcl.scheduler.plan.device_duration", "scheduler plans"),
    ),
    COMMANDS: ("netcl.device.commands", "netcl.device.label", None),
}

_Attrs = telemetry._Attrs
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE
_OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
_QUEUED, _START, _END = cl.profiling_info.QUEUED, cl.profiling_info.START, cl.profiling_info.END
_COMPLETE = cl.command_execution_status.COMPLETE
# event info read through get_info: pyopencl's properties add a Python call to each read
_STATUS, _QUEUE = cl.event_info.COMMAND_EXECUTION_STATUS, cl.event_info.COMMAND_QUEUE
_TYPE = cl.event_info.COMMAND_TYPE
_KERNELS = ("ndrange_kernel", "task")
_TRANSFER_WORDS = ("buffer", "image", "map", "svm", "migrate")


def enabled(queue: cl.CommandQueue) -> bool:
    """Whether work on ``queue`` is to be watched (the one check to make before watching): the
    process-wide collector's mode is not ``none`` and ``queue`` was created with profiling, or,
    in summary mode, its work can be bracketed on a side queue (a plain in-order queue: guide,
    Summary on a plain queue)."""
    mode = _collector._mode
    if mode == "none" or queue.properties & _PROFILING:
        return mode != "none"
    return mode == "summary" and _collector._bracket(queue) is not None


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


def _calibrate(context: cl.Context, device: cl.Device, rounds: int = 8) -> DeviceClock:
    """Measure ``device``'s clock with markers on a queue of its own (guide: Clock mapping): a
    marker enqueued after host time t0 and waited for until t1 puts ``host - device`` in
    [t0 - queued, t1 - end]."""
    queue = cl.CommandQueue(context, device, properties=_PROFILING)
    bounds: list[tuple[int, int, int]] = []  # (lower via QUEUED, lower via START, upper via END)
    try:
        for _ in range(rounds):
            t0 = time.time_ns()
            marker = cl.enqueue_marker(queue)
            marker.wait()
            t1 = time.time_ns()
            queued, start, end = (marker.get_profiling_info(i) for i in (_QUEUED, _START, _END))
            bounds.append((t0 - queued, t0 - start, t1 - end))
    finally:
        queue.finish()
    now = time.time_ns()
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


class Command(NamedTuple):
    """One profiled command on the host clock: ``name`` (its label, else the command type),
    ``command`` (the OpenCL command type, e.g. ``ndrange_kernel``), ``start_ns``/``end_ns``."""

    name: str
    command: str
    start_ns: int
    end_ns: int

    @property
    def kernel(self) -> bool:
        """A kernel command with a label."""
        return self.command in _KERNELS and self.name != self.command

    @property
    def span_name(self) -> str:
        """``netcl.device.kernel``, ``netcl.device.transfer`` or ``netcl.device.command``."""
        if self.command in _KERNELS:
            return "netcl.device.kernel"
        if any(w in self.command for w in _TRANSFER_WORDS):
            return "netcl.device.transfer"
        return "netcl.device.command"

    @property
    def attributes(self) -> dict[str, AttributeValue]:
        """The command's span attributes."""
        if self.kernel:
            return {"netcl.kernel.name": self.name}
        return {"netcl.device.command": self.command}


class _Measure(enum.Enum):
    """How a unit's duration is read from its events."""

    COMMANDS = "every command's interval, their union"
    ENVELOPE = "the first command's start to the last one's end (a summary)"
    MARKERS = "the end of one marker to the end of the next (graph nodes)"
    BRACKET = "the end of a start stamp to the end of an end stamp (a summary on a plain queue)"


class _Side(NamedTuple):
    """The side queue that stamps a plain queue's units: profiling, same context and device."""

    queue: cl.CommandQueue
    kernel: cl.Kernel  # one work-item, no work: a stamp (NVIDIA's markers there stamp unusably)
    # what begin() gives for a unit not drawn to be stamped: the side's first stamp, long
    # complete, told apart by identity (never read)
    undrawn: cl.Event


_STAMP_SOURCE = "__kernel void netcl_stamp(void) {}"


@dataclass(eq=False, slots=True)
class DeviceTime:
    """The device time of one watched unit of work: ``duration`` (seconds), ``start_ns`` and
    ``end_ns`` (host clock) and ``commands`` (of :func:`watch`), filled in when it completes."""

    _owner: Collector
    kind: Kind
    _events: tuple[cl.Event, ...]
    labels: tuple[str, ...]
    name: str | None
    parent: telemetry.Span
    attributes: _Attrs | None
    _measure: _Measure = _Measure.COMMANDS  # (a unit done at the hand-off has none)
    sampled: bool = False  #: summary mode: drawn for per-command detail
    _queue: cl.CommandQueue | None = None  # the events' queue (asked at the hand-off if not given)
    #: the units it stands for in totals and busy share: 1 / its chance of being stamped (a
    #: summary on a plain queue, guide: Summary on a plain queue), else 1
    weight: float = 1.0
    _failed: bool = False  # ready() saw a failed command
    done: bool = False
    duration: float | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    commands: tuple[Command, ...] = ()

    def ready(self) -> bool:
        """Whether every event has completed (or failed): a status read, no wait."""
        for e in reversed(self._events):  # the last ones first: those complete last
            status = e.get_info(_STATUS)
            if status > _COMPLETE:
                return False
            if status < 0:  # read once: _record trusts it
                self._failed = True
        return True

    def _hold_queue(self) -> None:
        """At the hand-off: the events' queue, asked now and held (OpenCL keeps no queue alive
        for its events, so later it could be a freed one)."""
        if self._queue is None:
            self._queue = self._events[0].get_info(_QUEUE)

    def _take_events(self) -> tuple[cl.Event, ...]:
        """The events, released from the unit (which may be kept) once collected."""
        events, self._events = self._events, ()
        return events

    def poll(self) -> float | None:
        """The device duration in seconds if the events have completed (collecting them now,
        in the caller's thread), else None. Never waits."""
        if not self.done and self.ready():
            with self._owner._lock:  # one collection at a time
                if not self.done:
                    self._owner._record(self)
        return self.duration

    def __repr__(self) -> str:
        state = f"{self.duration * 1e3:.3f} ms" if self.duration is not None else "pending"
        return f"DeviceTime({self.kind!r}, {self.name!r}, {state})"


class Stats(NamedTuple):
    """What a collector has seen: units watched, collected, dropped (a failed command, a queue
    without profiling, past ``max_pending``), pending, recorded without per-command spans; and
    (count, device seconds) per kind and per kernel label; units drawn for per-command detail
    in summary mode. Where a plain queue's units are stamped one in N, only the stamped ones
    are watched, and ``collected`` and the kinds' counts and seconds are estimates: each stamped
    unit counts for its ``DeviceTime.weight`` (guide: Summary on a plain queue)."""

    watched: int
    collected: int
    dropped: int
    pending: int
    spans_skipped: int
    by_kind: dict[str, tuple[int, float]]
    by_kernel: dict[str, tuple[int, float]]
    sampled: int = 0


def _add(to: dict[str, list[float]], key: str, seconds: float, weight: float = 1.0) -> None:
    entry = to.get(key) or to.setdefault(key, [0, 0.0])  # count, seconds (estimates by weight)
    entry[0] += weight
    entry[1] += seconds * weight


class _CommandFailedError(Exception):
    """A watched command ended in an error status: it has no device time."""


@functools.cache
def _type_name(code: int) -> str:
    try:
        return str(cl.command_type.to_string(code)).lower()
    except ValueError:
        return f"command_{code:#x}"


def _failure(unit: DeviceTime, events: tuple[cl.Event, ...]) -> str:
    """Which command of a failed unit failed (a summary keeps only the first and last)."""
    if unit._measure is not _Measure.COMMANDS:
        return "the first or last command failed"
    i, status = next((i, s) for i, e in enumerate(events) if (s := e.get_info(_STATUS)) < 0)
    return f"command {i} failed: status {status}"


def _union_ns(intervals: Sequence[tuple[int, int] | tuple[int, int, float]]) -> int:
    """Total length of the union of ``[start, end]`` intervals (anything after ``end``: left
    out)."""
    total, reach = 0, min((i[0] for i in intervals), default=0)
    for start, end, *_ in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class Collector:
    """Collects device time of watched events without waiting for them. ``interval`` (s): how
    often the daemon thread looks at pending events; ``recalibrate`` (s): how old a clock
    calibration may get; ``busy_window`` (s): the window of ``netcl.device.busy``;
    ``max_pending``: how many units may wait before the oldest is dropped; ``span_budget``: the
    share of a CPU core that per-command spans may take (guide: Cost); ``mode`` (default: from
    ``NETCL_PROFILE``, guide: Modes): what is recorded, see :data:`Mode`; ``sample_budget``:
    the share of a core that summary mode's sampled per-command detail may take;
    ``stamp_budget``: the share of the callers' time that stamping plain queues' units may take
    (guide: Summary on a plain queue)."""

    _process_wide = False  # True for the one collector() returns, once made

    def __init__(
        self,
        *,
        interval: float = 0.05,
        recalibrate: float = 10.0,
        busy_window: float = 5.0,
        max_pending: int = 100_000,
        span_budget: float = 0.05,
        mode: Mode | None = None,
        sample_budget: float = 0.001,
        stamp_budget: float = 0.02,
    ) -> None:
        self.interval, self.recalibrate, self.busy_window = interval, recalibrate, busy_window
        self.max_pending, self.span_budget = max_pending, span_budget
        self.mode = mode if mode is not None else _mode_from_setting()
        self.sample_budget, self.stamp_budget = sample_budget, stamp_budget
        self._credit = span_budget  # seconds of span work allowed now (refills at span_budget/s)
        self._credit_at = time.monotonic()
        # summary mode's draws (see detail): the measured cost per command of collecting a drawn
        # unit (a first guess until measured); commands offered since _offered_at and the
        # collection a second that drawing all of them would take; the credit against bursts
        self._command_cost, self._offered, self._demand = 5e-6, 0, 0.0
        self._sample_credit = 2 * sample_budget
        self._offered_at = self._sample_at = time.monotonic()
        # plain queues' stamps (see begin): the mean host time of one (two a unit), how long a
        # start stamp holds its unit back (its enqueue to its end, on the device), the mean
        # time between two units of a queue; by queue pointer, when its last begin() came
        # (perf_counter) and 1 / that unit's chance of a stamp (its weight)
        self._stamp_cost = self._stamp_hold = self._gap = 0.0
        self._begun: dict[int, tuple[float, float]] = {}
        self._pending: deque[DeviceTime] = deque()
        self._lock = threading.RLock()  # one collection at a time; guards the fields below
        self._clocks: dict[int, DeviceClock] = {}  # by device
        self._devices: dict[int, tuple[str, int, int]] = {}  # see _device
        # by device: (start, end, weight) of what ran (weight: see DeviceTime.weight)
        self._busy: defaultdict[str, deque[tuple[int, int, float]]] = defaultdict(deque)
        self._counts = dict.fromkeys(("watched", "dropped", "spans_skipped", "sampled"), 0)
        self._by_kind: dict[str, list[float]] = {}
        self._by_kernel: dict[str, list[float]] = {}
        self._thread: threading.Thread | None = None
        # plain queues' side queues by queue pointer: (its context's pointer, side or None)
        self._sides: dict[int, tuple[tuple[int, int, int], _Side | None]] = {}
        self._stamp_kernels: dict[int, cl.Kernel] = {}  # by context pointer

    @property
    def mode(self) -> Mode:
        """What is recorded from now on (:data:`Mode`); units already watched keep theirs."""
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        if mode not in _MODES:
            raise ValueError(f"profiling: mode {mode!r}; expected one of {', '.join(_MODES)}")
        self._mode = mode
        if self._process_wide:  # device.watcher reads it for plain queues; another's is its own
            settings.profile_in_code = mode

    # -- hand-off (the caller's thread: no OpenCL call, no wait) -----------------------------
    def watch(
        self,
        kind: Kind,
        events: Sequence[cl.Event],
        *,
        labels: Sequence[str] = (),
        name: str | None = None,
        parent: telemetry.Span | None = None,
        attributes: _Attrs | None = None,
        queue: cl.CommandQueue | None = None,
        detail: bool | None = None,
        begin: cl.Event | None = None,
    ) -> DeviceTime:
        """Watch the commands behind ``events`` (a unit of work of ``kind``), ``labels[i]`` naming
        event i, ``name`` the unit; ``parent``: its host span (default: the current one);
        ``queue``: the events' queue where the caller knows it (spares an OpenCL query). In
        summary mode only the first and last events are kept, unless the unit is drawn for
        per-command detail; in mode ``none`` nothing is kept (the unit is done, no duration).
        ``detail``: what :meth:`detail` answered before the work was enqueued (then, if False,
        ``events`` need only be the first and the last); None: decided here. ``begin``: what
        :meth:`begin` gave before the work (a plain queue's start stamp): then the unit is a
        summary bracketed on the side queue, its end stamped once ``events`` complete; a unit
        that begin() did not draw to be stamped is done at once, without a duration."""
        if len(labels) > len(events):
            raise ValueError(
                f"profiling.watch: {len(labels)} labels for {len(events)} events; "
                "expected at most one label per event"
            )
        parent = parent if parent is not None else telemetry.current_span()
        mode, weight = self._mode, 1.0
        if begin is not None and events:  # a plain queue's
            if queue is None:
                raise ValueError("profiling.watch: begin= needs the events' queue (queue=)")
            side = self._sides.get(queue.int_ptr, (0, None))[1]
            weight = self._begun.get(queue.int_ptr, (0.0, 1.0))[1]  # 1 / begin's chance
            if side is not None and begin is side.undrawn:  # not stamped: nothing to keep
                mode = "none"
        if mode == "none" and events:
            return DeviceTime(self, kind, (), (), name, parent, attributes, done=True)
        measure, sampled = _Measure.ENVELOPE, False
        if begin is not None and events:  # its end stamped after the events
            events, labels, measure = (begin, self.stamp(queue, events)), (), _Measure.BRACKET
        elif not events or (self.detail(len(events)) if detail is None else detail):
            measure, sampled = _Measure.COMMANDS, mode == "summary"
        else:
            events, labels = (events[0], events[-1]), ()
        return self._add(
            DeviceTime(
                self,
                kind,
                tuple(events),
                tuple(labels),
                name,
                parent,
                attributes,
                measure,
                sampled,
                queue,
                weight=weight,
            )
        )

    def detail(self, commands: int) -> bool:
        """Whether a unit of ``commands`` commands about to be enqueued gets per-command detail
        (pass the answer to :meth:`watch`, which then needs only the first and last events):
        always in mode ``commands``, never in ``none``; in ``summary`` every unit with the same
        chance, whatever its size (so the per-kernel figures stand for the whole workload), set
        four times a second from the units offered so that collecting the drawn ones takes about
        ``sample_budget`` of a core: at a low rate every unit is drawn. Against bursts, a drawn
        unit is charged its expected cost to a credit that refills at twice ``sample_budget``
        per second, up to one second's worth; while it is spent nothing is drawn."""
        if self._mode != "summary":
            return self._mode == "commands"
        self._offered += commands  # a lost update between threads only blurs the estimate
        budget = self.sample_budget
        if random.random() * self._demand >= budget:
            return False
        now, refill = time.monotonic(), 2 * budget  # the credit: a second's worth at most
        credit = min(refill, self._sample_credit + (now - self._sample_at) * refill)
        self._sample_at, self._sample_credit = now, credit
        if credit <= 0:
            return False
        self._sample_credit -= commands * self._command_cost
        return True

    def watch_markers(
        self,
        kind: Kind,
        before: cl.Event,
        after: cl.Event,
        *,
        name: str | None = None,
        parent: telemetry.Span | None = None,
        attributes: _Attrs | None = None,
        queue: cl.CommandQueue | None = None,
    ) -> DeviceTime:
        """Watch the work between two markers enqueued on one in-order queue (``queue``, where
        the caller knows it), ``before`` and ``after`` it: its device time is ``after.end -
        before.end``."""
        parent = parent if parent is not None else telemetry.current_span()
        if self._mode == "none":
            return DeviceTime(self, kind, (), (), name, parent, attributes, done=True)
        markers = (before, after)
        unit = DeviceTime(
            self, kind, markers, (), name, parent, attributes, _Measure.MARKERS, False, queue
        )
        return self._add(unit)

    # -- plain queues: units stamped on a side queue (guide: Summary on a plain queue) -------
    def begin(self, queue: cl.CommandQueue | None) -> cl.Event | None:
        """Before a unit's work on ``queue``: on a plain queue watched in summary mode, the stamp
        its device time starts from (pass it to :meth:`watch`, which stamps the end); None on a
        profiling queue, whose commands carry their own timestamps (or for None). A plain
        queue's unit is stamped with a chance set from the measured cost of stamps and the time
        between units, so that stamping takes about ``stamp_budget`` of that time (at a low rate
        every unit is); one not drawn gets an event that :meth:`watch` knows (no stamp: its
        unit is done without a duration), and the units drawn stand for it in the totals and
        the busy share (guide: Summary on a plain queue)."""
        if queue is None or (side := self._sides.get(queue.int_ptr, (0, None))[1]) is None:
            return None
        # The chance: 1 for a queue's first unit and after an idle while (10 ms without a unit
        # on the queue), else ``stamp_budget`` over the share of the time between units that
        # stamping every unit would take: the host time of two stamps and the start stamp's
        # hold (an upper bound: the hold overlaps the unit's enqueue where the device is idle)
        # over the mean time between two units of a queue (a gap of more than 10 ms counted as
        # 10 ms). A lost update between threads only blurs these figures.
        now = time.perf_counter()
        gap = min(now - self._begun.get(queue.int_ptr, (0.0, 1.0))[0], 0.01)  # 0.01: idle
        self._gap += (gap - self._gap) / 16
        share = (2 * self._stamp_cost + self._stamp_hold) / max(self._gap, 1e-9)
        chance = 1.0 if gap == 0.01 else min(1.0, self.stamp_budget / max(share, 1e-9))
        self._begun[queue.int_ptr] = (now, 1 / max(chance, 1e-9))  # the weight, for watch()
        if random.random() >= chance:
            return side.undrawn
        return self.stamp(queue)

    def stamp(self, queue: cl.CommandQueue, after: Sequence[cl.Event] = ()) -> cl.Event:
        """A point in ``queue``'s order with a device timestamp, the end of the event returned
        (what :meth:`watch_markers` takes): a marker on a profiling queue. On a plain queue, a
        one-item kernel on its side queue that runs once ``after`` has completed; with no
        ``after``, once everything enqueued on ``queue`` so far has, and ``queue``'s later
        commands wait for it (on a busy device a stamp could otherwise run after them)."""
        side = self._sides.get(queue.int_ptr, (0, None))[1]
        if side is None:
            return cl.enqueue_marker(queue)
        t0, held = time.perf_counter(), not after
        if held:
            after = (cl.enqueue_marker(queue),)
        queue.flush()  # OpenCL: another queue waits on a queue's events once they are flushed
        event = cl.enqueue_nd_range_kernel(side.queue, side.kernel, (1,), None, wait_for=after)
        side.queue.flush()  # submitted now: stamped when `after` completes, not at a later flush
        if held:
            cl.enqueue_barrier(queue, wait_for=(event,))
        self._stamp_cost += (time.perf_counter() - t0 - self._stamp_cost) / 16  # for begin()
        return event

    def _bracket(self, queue: cl.CommandQueue) -> _Side | None:
        """The side queue stamping units of the plain queue ``queue`` (made on first use, or
        when the pointer names a freed queue of another context, device or properties); None
        where it cannot be made (an out-of-order queue, a driver that refuses), said once in
        the log."""
        context = queue.context.int_ptr
        who = (context, queue.device.int_ptr, int(queue.properties))
        if (found := self._sides.get(queue.int_ptr)) is not None and found[0] == who:
            return found[1]
        with self._lock:
            side, reason = None, None
            if queue.properties & _OUT_OF_ORDER:
                reason = "an out-of-order queue: its work has no last command to stamp after"
            else:
                try:
                    kernel = self._stamp_kernels.get(context)
                    if kernel is None:  # the kernel holds its context: the key stays its own
                        program = cl.Program(queue.context, _STAMP_SOURCE).build()
                        kernel = self._stamp_kernels[context] = cl.Kernel(program, "netcl_stamp")
                    q = cl.CommandQueue(queue.context, queue.device, _PROFILING)
                    side = _Side(q, kernel, cl.enqueue_nd_range_kernel(q, kernel, (1,), None))
                    side.undrawn.wait()  # refused?
                except cl.Error as exc:
                    side, reason = None, f"the driver refused a side queue's stamp: {exc}"
            if reason is not None:
                warn_once(
                    _log,
                    ("device_time_not_bracketed", reason),
                    "device_time_not_bracketed",
                    reason=reason,
                    fallback="device time needs a profiling queue here",
                )
            self._sides[queue.int_ptr] = (who, side)
            return side

    def _add(self, unit: DeviceTime) -> DeviceTime:
        if unit.kind not in _KINDS:
            raise ValueError(
                f"profiling.watch: unknown kind {unit.kind!r}; expected one of {sorted(_KINDS)}"
            )
        if not unit._events:
            raise ValueError("profiling.watch: no events; expected at least one cl.Event")
        unit._hold_queue()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    # the thread and the exit hook hold the collector weakly: both end with it
                    me, gone = weakref.ref(self), threading.Event()
                    weakref.finalize(self, gone.set)
                    self._thread = threading.Thread(
                        target=_collecting, args=(me, gone), name="netcl-profiling", daemon=True
                    )
                    self._thread.start()
                    atexit.register(_flush_at_exit, me)  # before the SDK's exit hooks (LIFO)
        pending = self._pending
        pending.append(unit)
        self._counts["watched"] += 1
        if len(pending) > self.max_pending:
            pending.popleft()
            self._counts["dropped"] += 1
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
            if (now := time.monotonic()) - self._offered_at >= 0.25:  # detail's chance, anew
                offered, self._offered = self._offered, 0
                self._demand = offered * self._command_cost / (now - self._offered_at)
                self._offered_at = now
            # intervals the busy window no longer sees (dropped here, once a collection: without
            # a metric reader the gauge is never read, and they would pile up)
            old = time.time_ns() - (self.busy_window + 1) * 1e9
            for intervals in self._busy.values():
                while intervals and intervals[0][1] < old:
                    intervals.popleft()
            return len(waiting)

    def flush(self, timeout: float = 5.0) -> int:
        """Collect, waiting up to ``timeout`` seconds for pending events (the end of a run's host
        wait); returns how many are still pending."""
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
            kind, kernel = (
                {k: (round(n), t) for k, (n, t) in d.items()}
                for d in (self._by_kind, self._by_kernel)
            )
            return Stats(
                **self._counts,
                collected=sum(n for n, _ in kind.values()),
                pending=len(self._pending),
                by_kind=kind,
                by_kernel=kernel,
            )

    def busy(self, now_ns: int | None = None) -> dict[str, float]:
        """Per device name, the share of the last ``busy_window`` seconds in which watched
        commands ran (those collected so far)."""
        self.collect()
        now = now_ns if now_ns is not None else time.time_ns()
        low = now - int(self.busy_window * 1e9)
        out = {}
        with self._lock:
            for dev, ran in self._busy.items():
                clipped = [(max(s, low), min(e, now), w) for s, e, w in ran if e > low and s < now]
                # and a stamped unit of weight w's w - 1 as long: the units it stands for
                more = sum((e - s) * (w - 1) for s, e, w in clipped)
                out[dev] = min(1.0, (_union_ns(clipped) + more) / (now - low))
        return out

    def _record(self, unit: DeviceTime) -> None:
        unit.done = True
        events = unit._take_events()
        measure = unit._measure
        try:
            if unit._failed:  # first: after a failed command the driver may have given up the
                raise _CommandFailedError(_failure(unit, events))  # context (no clock, no stamp)
            device, offset = self._device(unit._queue)
            # CPU time of a drawn unit (a wait for the GIL or a blocking SDK once stopped the
            # draws) from here: _device is every unit's cost, a draw's own is what follows
            t0 = time.thread_time() if unit.sampled else 0.0
            if measure is not _Measure.COMMANDS:  # a summary, two markers or a bracket
                info = _START if measure is _Measure.ENVELOPE else _END
                start = events[0].get_profiling_info(info) + offset
                intervals = [(start, max(events[-1].get_profiling_info(_END) + offset, start))]
                if measure is _Measure.BRACKET:  # how long the start stamp held the unit back
                    held = start - offset - events[0].get_profiling_info(_QUEUED)
                    self._stamp_hold += (max(held, 0) / 1e9 - self._stamp_hold) / 16
            else:
                unit.commands = self._commands(unit, events, offset)
                intervals = [(c.start_ns, c.end_ns) for c in unit.commands]
            count, events = len(events), ()  # released in what is timed
        except (cl.Error, _CommandFailedError) as exc:  # a queue without profiling, a failure
            self._counts["dropped"] += 1
            _not_collected(exc)
            return
        unit.start_ns = min(intervals)[0]
        unit.end_ns = max(end for _, end in intervals)
        unit.duration = _union_ns(intervals) / 1e9
        busy = self._busy[device]  # the device is listed (0 busy) for markers too
        if measure is not _Measure.MARKERS:
            busy.extend((start, end, unit.weight) for start, end in intervals)
        self._emit(unit, device)
        if unit.sampled:  # what the next draws are charged per command
            self._counts["sampled"] += 1
            cost = (time.thread_time() - t0) / count
            self._command_cost += (cost - self._command_cost) / 4

    def _device(self, queue: cl.CommandQueue) -> tuple[str, int]:
        """The device name of ``queue`` (a unit's) and its clock's offset (ns)."""
        # by queue: (device name, clock offset, when it was calibrated); its age is judged by the
        # current `recalibrate` (a full suite lowered it after a queue's entry was made)
        age = int(self.recalibrate * 1e9)  # how old a calibration may get
        if (found := self._devices.get(queue.int_ptr)) is None or time.time_ns() > found[2] + age:
            device = queue.device  # OpenCL info calls: once per queue and calibration
            clock = self._clocks.get(device.int_ptr)  # another queue's may still be good
            if clock is None or time.time_ns() > clock.measured_ns + age:
                clock = self._clocks[device.int_ptr] = _calibrate(queue.context, device)
            found = (device.name.strip(), clock.offset_ns, clock.measured_ns)
            self._devices[queue.int_ptr] = found
        return found[0], found[1]

    def _commands(
        self, unit: DeviceTime, events: tuple[cl.Event, ...], offset: int
    ) -> tuple[Command, ...]:
        """The commands of ``unit`` (``events``) on the host clock; ``cl.Error`` for an event
        of a queue without profiling."""
        commands, labels = [], unit.labels
        for i, event in enumerate(events):
            start = event.get_profiling_info(_START)
            end = max(event.get_profiling_info(_END), start)
            kind = _type_name(event.get_info(_TYPE))
            label = labels[i] if i < len(labels) else kind
            commands.append(Command(label, kind, start + offset, end + offset))
        return tuple(commands)

    def _emit(self, unit: DeviceTime, device: str) -> None:
        """The unit's totals, histogram points and (when tracing) its spans: the envelope, and
        one span per command while the span budget has credit."""
        duration = unit.duration or 0.0
        _add(self._by_kind, unit.kind, duration, unit.weight)
        command_spans = True
        if unit.commands:
            now, budget = time.monotonic(), self.span_budget
            self._credit = min(budget, self._credit + (now - self._credit_at) * budget)
            self._credit_at = now
            command_spans = self._credit > 0
            if not command_spans:
                self._counts["spans_skipped"] += 1
        span_name, name_attribute, histogram = _KINDS[unit.kind]
        named = {"netcl.device.name": device}
        if unit.name is not None:
            named[name_attribute] = unit.name
        if histogram is not None:
            histogram.record(duration, named)
        for c in unit.commands:
            if c.kernel:
                seconds = (c.end_ns - c.start_ns) / 1e9
                _add(self._by_kernel, c.name, seconds)
                _KERNEL_DURATION.record(
                    seconds, {"netcl.kernel.name": c.name, "netcl.device.name": device}
                )
        if not telemetry.tracing():
            return
        attrs: dict[str, AttributeValue] = {**named, "netcl.device.duration": duration}
        if unit.sampled:
            attrs["netcl.device.sampled"] = True
        if not command_spans:
            attrs["netcl.device.commands_skipped"] = len(unit.commands)
        attrs.update(unit.attributes or {})
        envelope = TEL.span(
            span_name, attrs, start_time=unit.start_ns, current=False, parent=unit.parent
        )
        for c in unit.commands if command_spans else ():
            attributes = {**c.attributes, "netcl.device.name": device}
            TEL.record_span(c.span_name, c.start_ns, c.end_ns, attributes, parent=envelope)
        envelope.end(end_time=unit.end_ns)
        if unit.commands:
            self._credit -= time.monotonic() - now


def _collecting(me: weakref.ref[Collector], gone: threading.Event) -> None:
    """A collector's thread: collects every ``interval`` seconds, holding the collector only
    while it does, and ends once the collector is gone (its finalizer sets ``gone``, which also
    cuts a long interval's wait short)."""
    while (collector := me()) is not None:
        interval = collector.interval
        del collector  # not held while waiting
        if gone.wait(interval) or (collector := me()) is None:
            return
        try:
            collector.collect()
        except Exception as exc:  # never let the collector thread die
            _not_collected(exc)


def _not_collected(exc: Exception) -> None:
    """Say once per type of error that device time could not be collected."""
    once = ("device_time_not_collected", type(exc))
    warn_once(_log, once, "device_time_not_collected", error=repr(exc))


def _flush_at_exit(me: weakref.ref[Collector]) -> None:
    if (collector := me()) is not None:
        collector.flush(1.0)


_MODES: tuple[Mode, ...] = get_args(Mode)


def _mode_from_setting() -> Mode:
    """``summary`` where ``NETCL_PROFILE`` says so, else ``commands`` (what a queue made with
    profiling has always recorded); a bad value is reported where the default queue is made
    and by ``netcl config``, and changes nothing here."""
    try:
        return "summary" if settings.PROFILE.value("off") == "summary" else "commands"
    except ValueError:
        return "commands"


class _ProcessWide(Collector):
    """The one collector() returns: its mode is device.watcher's (see Collector.mode)."""

    _process_wide = True


_collector = _ProcessWide()  # its mode from NETCL_PROFILE: device.watcher's until set in code


def collector() -> Collector:
    """The process-wide collector that :func:`watch` and :func:`watch_markers` hand work to."""
    return _collector


# the process-wide collector's hand-off, draw and flush (see the Collector's methods)
watch = _collector.watch
detail = _collector.detail
watch_markers = _collector.watch_markers
flush = _collector.flush
_sdk._before_shutdown.append(flush)  # telemetry.shutdown() collects pending device time first


TEL.observable_gauge(
    "netcl.device.busy",  # a share of a sliding window, read when a metric reader collects
    lambda: [(v, {"netcl.device.name": d}) for d, v in _collector.busy().items()],
    "1",
    "Fraction of the last 5 s in which watched commands ran on the device",
)
