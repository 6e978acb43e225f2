"""Shared fixtures: the real default OpenCL device (PoCL unless PYOPENCL_CTX says otherwise) and
the OpenTelemetry SDK with in-memory exporters.

The SDK is installed once for the whole session (a global provider can be set only once per
process). A test that asks for ``otel_mode`` runs twice: with the SDK, and with the provider slot
emptied as in a process without one (see the fixture).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

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

from netcl.core import device, telemetry


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


_SPANS = InMemorySpanExporter()
_METRICS = InMemoryMetricReader()
_kinds = (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableGauge,
          ObservableUpDownCounter)  # fmt: skip
_HOSTILE_READER = _ExplodingReader(preferred_aggregation=dict.fromkeys(_kinds,
                                                                       _ExplodingAggregation()))
_tp = TracerProvider()
_tp.add_span_processor(_ExplodingProcessor())
_tp.add_span_processor(SimpleSpanProcessor(_SPANS))
trace.set_tracer_provider(_tp)
metrics.set_meter_provider(MeterProvider(metric_readers=[_METRICS, _HOSTILE_READER]))


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
