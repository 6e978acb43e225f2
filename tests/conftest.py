"""Shared fixtures: the real default OpenCL device (PoCL unless PYOPENCL_CTX says otherwise) and
the OpenTelemetry SDK with in-memory exporters.

The SDK is installed once for the whole session (a global provider can be set only once per
process). A test that asks for ``otel_mode`` runs twice: with the SDK, and with the provider slot
emptied as in a process without one (see the fixture).

Telemetry is API: every span and log event any test causes is held to the tables of
docs/observability.md (names, attributes, fields, levels; see ``_Contract``); a test fails if it
caused one that breaks them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import DefaultAggregation
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from netcl.core import device, telemetry

# mutmut's instrumented pass (MUTANT_UNDER_TEST=stats) sets a ContextVar on every call of package
# code. Before Python 3.12 the garbage collector runs inside allocations: a finalizer calling
# package code (a weakref.finalize callback) then sets that ContextVar while CPython is building
# the context's next map, and the interpreter crashes on the map it freed (hamt.c). In that pass
# the collector runs between tests only (threshold 0, which the tests' gc.enable() keeps; 3.12
# runs it between bytecodes).
if os.environ.get("MUTANT_UNDER_TEST") == "stats" and sys.version_info < (3, 12):
    gc.set_threshold(0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown() -> Iterator[None]:
        yield
        gc.collect()


# In that pass mutmut links a function to the tests during which it ran. What runs on import, at
# collection (the capture hooks made once, the instruments of each package), then goes to the
# first test alone, and a mutant of it is run against that test only: link it to every test of
# its package's folder (tests/<package>/; the whole suite would cost minutes a mutant).
if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    from mutmut.state import state as _mutmut_state  # the pinned mutmut of hatch's mutation env

    _AT_IMPORT: dict[str, set[str]] = {}  # by package: netcl.core.x, netcl.runtime.capture.x

    def pytest_collection_finish() -> None:
        for name in _mutmut_state()._stats:
            package = name.split(".")[2 if name.startswith("netcl.runtime.") else 1]
            _AT_IMPORT.setdefault(package, set()).add(name)

    def pytest_runtest_setup(item: pytest.Item) -> None:
        _mutmut_state()._stats.update(_AT_IMPORT.get(item.nodeid.split("/")[1], ()))


class _Hostility:
    """While ``armed``, the session's SDK fails the way a broken plug-in would: a span processor
    raising in ``on_start`` and ``on_end``, and a metric reader whose aggregation raises when a
    value is recorded and which raises when collected. ``slow_s``: each span's end blocks."""

    armed = False
    slow_s = 0.0


class _ExplodingProcessor(SpanProcessor):
    def on_start(self, span: Span, parent_context: Any = None) -> None:
        if _Hostility.armed:
            raise RuntimeError("processor on_start exploded")

    def on_end(self, span: ReadableSpan) -> None:
        if _Hostility.armed:
            raise RuntimeError("processor on_end exploded")
        if _Hostility.slow_s:  # an exporter that blocks: wall time, no CPU
            time.sleep(_Hostility.slow_s)


class _ExplodingAggregation(DefaultAggregation):
    def _create_aggregation(self, *args: Any, **kwargs: Any) -> Any:
        inner = super()._create_aggregation(*args, **kwargs)
        aggregate = inner.aggregate

        def exploding(*a: Any, **k: Any) -> Any:
            if _Hostility.armed:
                raise RuntimeError("metric reader exploded")
            return aggregate(*a, **k)

        inner.aggregate = exploding
        return inner


class _ExplodingReader(InMemoryMetricReader):
    def _receive_metrics(self, *args: Any, **kwargs: Any) -> None:
        if _Hostility.armed:
            raise RuntimeError("metric reader exploded on collect")
        super()._receive_metrics(*args, **kwargs)


class _Contract(SpanProcessor, logging.Handler):
    """The spans and log events of docs/observability.md, and what broke them (``broken``).

    A span named ``netcl.*`` (not ``netcl.test.*``) must be in the spans table; ended without
    error it carries every attribute of its row's *attributes* column, it carries no attribute
    outside its row (``error.type`` aside), and a listed value set (``(a / b)``) holds. An event
    of a netcl package's logger must be in the events table with its level and logger, and carry
    exactly its fields, none None unless marked *or null*."""

    _DOC = Path(__file__).resolve().parents[1] / "docs" / "observability.md"
    _TICK = re.compile(r"`([\w.]+)`( \*or null\*)?(?: \(([\w ]+(?: / [\w ]+)+)\))?")
    # what a log record holds besides the event's fields (the trace and span ids are added to
    # every event while a span is current)
    _RECORD = set(logging.makeLogRecord({}).__dict__) | {
        "message",
        "asctime",
        "taskName",
        "event",
        "trace_id",
        "span_id",
    }

    def __init__(self) -> None:
        logging.Handler.__init__(self, logging.INFO)
        self.broken: list[str] = []
        self.spans: dict[str, tuple[dict[str, str], set[str]]] = {}
        doc = self._DOC.read_text()
        for names, _, always, also in self._rows(doc, "## Spans"):
            listed = {m[1]: m[3] for m in self._TICK.finditer(always) if "." in m[1]}
            optional = {m[1] for m in self._TICK.finditer(also) if m[1].startswith("netcl.")}
            for name in self._TICK.finditer(names):
                self.spans[name[1]] = (listed, optional | {"error.type"})
        self.events = {
            event.strip("`"): (
                level.upper(),
                logger.strip("`"),
                {m[1]: bool(m[2]) for m in self._TICK.finditer(fields)},
            )
            for event, level, logger, fields in self._rows(doc, "## Logs")
        }

    @staticmethod
    def _rows(doc: str, heading: str) -> list[list[str]]:
        """The body rows of the first table under ``heading``, each a list of its cells."""
        rows: list[list[str]] = []
        for line in doc.split(heading, 1)[1].splitlines():
            if line.startswith("|"):
                rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            elif rows:
                break
        return rows[2:]

    def on_end(self, span: ReadableSpan) -> None:
        if not span.name.startswith("netcl.") or span.name.startswith("netcl.test."):
            return
        if span.name not in self.spans:
            self.broken.append(f"span {span.name!r} is not in docs/observability.md")
            return
        listed, optional = self.spans[span.name]
        attrs = dict(span.attributes or {})
        failed = span.status.status_code is StatusCode.ERROR
        for problem, names in (
            ("lacks", set() if failed else set(listed) - set(attrs)),
            ("has undocumented", set(attrs) - set(listed) - optional),
        ):
            if names:
                self.broken.append(f"span {span.name!r} {problem} {sorted(names)}: {attrs}")
        for name, values in listed.items():
            if values and name in attrs and attrs[name] not in values.split(" / "):
                self.broken.append(f"span {span.name!r}: {name}={attrs[name]!r}, not {values}")

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith(("netcl.core", "netcl.runtime")):
            return  # the tests' own loggers
        event = getattr(record, "event", None)
        if event not in self.events:
            self.broken.append(f"event {event!r} of {record.name} is not in docs/observability.md")
            return
        level, logger, fields = self.events[event]
        found = {k: v for k, v in record.__dict__.items() if k not in self._RECORD}
        if (record.levelname, record.name) != (level, logger) or set(found) != set(fields):
            self.broken.append(
                f"event {event!r} at {record.levelname} from {record.name} with "
                f"{sorted(found)}; documented: {level}, {logger}, {sorted(fields)}"
            )
        if nulls := [k for k, v in found.items() if v is None and not fields.get(k)]:
            self.broken.append(f"event {event!r}: {nulls} None")


_CONTRACT = _Contract()
_SPANS = InMemorySpanExporter()
_METRICS = InMemoryMetricReader()
_kinds = (
    Counter,
    UpDownCounter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
)
_HOSTILE_READER = _ExplodingReader(
    preferred_aggregation=dict.fromkeys(_kinds, _ExplodingAggregation())
)
_tp = TracerProvider()
_tp.add_span_processor(_CONTRACT)
_tp.add_span_processor(_ExplodingProcessor())
_tp.add_span_processor(SimpleSpanProcessor(_SPANS))
trace.set_tracer_provider(_tp)
metrics.set_meter_provider(MeterProvider(metric_readers=[_METRICS, _HOSTILE_READER]))


@pytest.fixture(autouse=True)
def telemetry_contract() -> Iterator[list[str]]:
    """Fails the test if it caused a span or log event that breaks docs/observability.md. Yields
    the list of what broke (a test that breaks it on purpose reads and clears it). netcl's
    loggers pass INFO (a test that configured logging may have changed that)."""
    netcl = logging.getLogger("netcl")
    netcl.setLevel(logging.INFO)
    if _CONTRACT not in netcl.handlers:
        netcl.addHandler(_CONTRACT)
    _CONTRACT.broken.clear()
    yield _CONTRACT.broken
    broken, _CONTRACT.broken[:] = list(_CONTRACT.broken), []
    assert not broken, "telemetry unlike docs/observability.md:\n" + "\n".join(broken)


@pytest.fixture
def hostile_sdk() -> Iterator[Callable[[], None]]:
    """Arm the failing span processor and metric reader for the test (disarmed after). Yields a
    function that makes the reader collect now (which raises inside the SDK, never in netcl)."""
    _Hostility.armed = True

    def collect() -> None:
        with contextlib.suppress(RuntimeError):
            _HOSTILE_READER.collect()

    try:
        yield collect
    finally:
        _Hostility.armed = False


@pytest.fixture
def slow_sdk() -> Iterator[None]:
    """Every span's end blocks 20 ms in the session's SDK (as a synchronous exporter over a slow
    network would), for the test."""
    _Hostility.slow_s = 0.02
    try:
        yield
    finally:
        _Hostility.slow_s = 0.0


@pytest.fixture(scope="session")
def ctx() -> cl.Context:
    return device.default_context()


@pytest.fixture(scope="session")
def queue(ctx: cl.Context) -> cl.CommandQueue:
    return device.default_queue(ctx)


_BUSY_SOURCE = """
__kernel void netcl_test_busy(__global float *a, const int n) {
    const int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < n; ++k) x = x * 0.999f + 0.001f;
    a[i] = x;
}
"""


class Busy:
    """A kernel that keeps the device busy for about a given time, whatever the device: its loop
    count is calibrated on this device (a CPU runs it thousands of times slower than a GPU), so
    that a test asking for "a kernel of 2 ms" checks the same property on PoCL and on a GPU."""

    ITEMS = 4096  # work-items of each launch

    def __init__(self, ctx: cl.Context) -> None:
        self.kernel = cl.Kernel(cl.Program(ctx, _BUSY_SOURCE).build(), "netcl_test_busy")
        self.buffer = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * self.ITEMS)  # the kernel's arg
        self.queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.per_loop_s = self._calibrate()

    def _time(self, loops: int) -> float:
        """The fastest of three launches of ``loops`` loops, in device seconds."""
        events = [self.launch(self.queue, loops) for _ in range(3)]
        self.queue.finish()
        return min(e.profile.end - e.profile.start for e in events) / 1e9

    def _calibrate(self) -> float:
        """Device seconds per loop, from launches long enough (>= 5 ms) that a launch's fixed
        cost does not count."""
        loops = 1000
        while (took := self._time(loops)) < 5e-3 and loops < 2**30:
            loops = min(2**30, loops * max(2, int(10e-3 / max(took, 1e-7))))
        return took / loops

    def loops(self, seconds: float) -> int:
        """The loop count that keeps the device busy at least ``seconds`` (twice the calibrated
        estimate: a device that sped up since, a CPU that was loaded while calibrating)."""
        loops = int(2 * seconds / self.per_loop_s) + 1
        assert loops < 2**31, f"a busy kernel of {seconds} s needs {loops} loops: too many"
        return loops

    def launch(
        self, queue: cl.CommandQueue, loops: int, wait_for: list[cl.Event] | None = None
    ) -> cl.Event:
        """``loops`` loops on ``queue`` (see :meth:`loops`)."""
        self.kernel.set_args(self.buffer, np.int32(loops))
        return cl.enqueue_nd_range_kernel(
            queue, self.kernel, (self.ITEMS,), None, wait_for=wait_for
        )

    def enqueue(
        self, queue: cl.CommandQueue, seconds: float, wait_for: list[cl.Event] | None = None
    ) -> cl.Event:
        """A kernel that keeps the device busy at least ``seconds`` on ``queue``."""
        return self.launch(queue, self.loops(seconds), wait_for)


@pytest.fixture(scope="session")
def busy(ctx: cl.Context) -> Busy:
    """A busy kernel calibrated to the session's device (:class:`Busy`)."""
    return Busy(ctx)


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """The session's in-memory span exporter, emptied before the test."""
    _SPANS.clear()
    return _SPANS


@pytest.fixture
def metric_reader() -> InMemoryMetricReader:
    """The session's in-memory metric reader (values are cumulative over the session)."""
    return _METRICS


@pytest.fixture
def metric_points(metric_reader: InMemoryMetricReader) -> Callable[[str], list[Any]]:
    """``metric_points(name)``: all data points of metric ``name`` collected now."""

    def collect(name: str) -> list[Any]:
        data = metric_reader.get_metrics_data()
        points: list[Any] = []
        if data is None:
            return points
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        points.extend(m.data.data_points)
        return points

    return collect


def _service_binary(name: str, install: str) -> str:
    path = shutil.which(name)
    if path is not None:
        return path
    reason = f"{name!r} is not installed; install it with: {install}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true requires the service binary: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def service_binary() -> Callable[[str, str], str]:
    """``service_binary(name, install)``: the path of a system service's binary (Prometheus,
    redis-server, chromium). When it is absent the test is skipped with the install command,
    except under ``CI=true``, where a missing service fails the test."""
    return _service_binary


_SPAN_FIXTURES = {"spans", "metric_reader", "metric_points"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # a test that uses otel_mode runs twice, unless it reads spans or metrics (SDK only)
    if "otel_mode" in metafunc.fixturenames:
        modes = ["sdk"] if _SPAN_FIXTURES & set(metafunc.fixturenames) else ["sdk", "no_sdk"]
        metafunc.parametrize("otel_mode", modes, indirect=True)


@pytest.fixture
def otel_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test twice: with the session's SDK recording, and as in a process with no SDK
    (the API's provider slot emptied, so ``telemetry.tracing()`` is False). In the no-SDK run
    the test also fails if any span was recorded: span work must sit behind ``tracing()``.
    Tests that read spans or metrics run with the SDK only."""
    if request.param == "sdk":
        yield "sdk"
        return
    saved = trace._TRACER_PROVIDER
    recorded = len(_SPANS.get_finished_spans())
    # tracing() keeps a True answer (a provider can be set only once per process): clear it too,
    # so its next re-check sees the empty slot as a process without an SDK would
    trace._TRACER_PROVIDER = None
    telemetry._switch.on = False
    try:
        yield "no_sdk"
    finally:
        trace._TRACER_PROVIDER = saved
        telemetry._switch.on = True
    spans = _SPANS.get_finished_spans()[recorded:]
    assert not spans, f"spans recorded with no SDK: {[s.name for s in spans]}"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port on loopback that accepts connections and never answers (a hung collector)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
