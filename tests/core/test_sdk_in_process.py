"""The SDK helpers an application meets, in this process (the configure tests run in
subprocesses, which the mutation run cannot see): each invalid ``OTEL_*`` value refused with
its message, a flush that runs past its deadline reported, export errors counted per exporter,
and the console exporter's line for a span."""

from __future__ import annotations

import logging
import re
import threading

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import _sdk, telemetry


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("OTEL_SDK_DISABLED", "maybe", "true or false"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "udp", "grpc or http/protobuf"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "1.5", "an integer > 0 (spans)"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "a number > 0 (seconds)"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "soon", "a number > 0 (milliseconds)"),
    ],
)
def test_configure_refuses_an_invalid_value_naming_it(
    variable: str, value: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sdk, "_configured", {})  # as in a process that never configured
    monkeypatch.setenv(variable, value)
    with pytest.raises(_sdk.ConfigError) as info:
        _sdk.configure()
    assert str(info.value) == f"{variable}={value!r} is not valid: expected {expected}"
    assert (info.value.variable, info.value.value) == (variable, value)


def test_configure_refuses_unknown_exporters_and_a_ratio_out_of_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_sdk, "_configured", {})
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,zipkin9")
    listed = r"a comma-separated list of otlp, .*console.*, none"
    with pytest.raises(_sdk.ConfigError, match=rf"^OTEL_TRACES_EXPORTER='console,zipkin9' is not "
                       rf"valid: expected {listed}"):  # fmt: skip
        _sdk.configure()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "2")
    with pytest.raises(_sdk.ConfigError, match=r"^OTEL_TRACES_SAMPLER_ARG='2' is not valid: "
                       r"expected a ratio from 0 to 1$"):  # fmt: skip
        _sdk.configure()


class _SlowProcessor(SpanProcessor):
    """A span processor whose flush waits (an exporter stuck on a slow collector)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.release.wait(5.0)


def test_a_flush_past_its_deadline_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    stuck = _SlowProcessor()
    slow, quick = TracerProvider(), MeterProvider()
    slow.add_span_processor(stuck)
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": slow, "meter_provider": quick})
    monkeypatch.setattr(_sdk, "_unfinished", [])
    monkeypatch.setattr(_sdk, "_failures", _sdk._ExportFailures())
    try:
        assert _sdk.flush(0.2) is False
        assert _sdk.export_failures() == [
            "traces: force_flush still exporting after 0.2 s, abandoned"
        ]
    finally:
        stuck.release.set()  # its thread ends
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": TracerProvider(),
                                              "meter_provider": quick})  # fmt: skip
    assert _sdk.flush(1.0) is True


def test_export_errors_are_counted_per_exporter_with_the_first_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures = _sdk._ExportFailures()
    monkeypatch.setattr(_sdk, "_failures", failures)
    monkeypatch.setattr(_sdk, "_unfinished", [])
    logger = logging.getLogger("opentelemetry.exporter.netcl-test")
    logger.addHandler(failures)
    monkeypatch.setattr(logger, "propagate", False)
    try:
        logger.error("Failed to export spans: UNAVAILABLE\ndetails")
        logger.error("Failed to export spans: again")
        logger.warning("Transient error, retrying")  # a retry: not an error
    finally:
        logger.removeHandler(failures)
    assert _sdk.export_failures() == [
        "2 export error(s), first: Failed to export spans: UNAVAILABLE"
    ]


def test_the_console_line_of_a_span(spans: InMemorySpanExporter) -> None:
    scope = telemetry.Scope("netcl.test", "0")
    with scope.span("netcl.test.outer"), scope.span("netcl.test.inner", {"netcl.test.n": 3}):
        pass
    inner, outer = spans.get_finished_spans()
    line = _sdk._span_line(inner)
    assert re.fullmatch(
        rf"span netcl\.test\.inner \d+\.\d{{3}} ms trace_id={inner.context.trace_id:032x} "
        rf"span_id={inner.context.span_id:016x} parent_id={outer.context.span_id:016x} "
        r"status=UNSET netcl\.test\.n=3\n",
        line,
    ), line
    assert " parent_id=- " in _sdk._span_line(outer)
    timed = TracerProvider().get_tracer("netcl.test").start_span("netcl.test.timed", start_time=0)
    timed.end(end_time=2_000_000_000)  # 2 s: the duration in ms, to the microsecond
    assert _sdk._span_line(timed).startswith("span netcl.test.timed 2000.000 ms trace_id=")


def test_a_flush_without_a_timeout_waits_as_long_as_the_export_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck = _SlowProcessor()
    slow = TracerProvider()
    slow.add_span_processor(stuck)
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": slow})
    monkeypatch.setattr(_sdk, "_unfinished", [])
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "300")  # ms: the larger of the two
    monkeypatch.setenv("OTEL_METRIC_EXPORT_TIMEOUT", "100")
    try:
        assert _sdk.flush() is False
        assert _sdk._unfinished == ["traces: force_flush still exporting after 0.3 s, abandoned"]
    finally:
        stuck.release.set()
