"""OpenTelemetry helpers: tracers and meters per scope, a cheap 'is anything recording' check,
and an opt-in :func:`configure` for applications.

Libraries depend on ``opentelemetry-api`` only. With no SDK configured the API's no-op spans still
cost microseconds, so hot paths ask :func:`tracing` first (tens of nanoseconds) and skip span work
when it is False.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["DURATION_BUCKETS_S", "configure", "meter", "shutdown", "span", "tracer", "tracing"]


#: Histogram buckets for durations in seconds, 10 µs to 30 s: the SDK's defaults (0 to 10000)
#: suit milliseconds and would put every host-side duration in the first bucket.
DURATION_BUCKETS_S: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


def tracer(scope: str, version: str) -> trace.Tracer:
    """The tracer of instrumentation scope ``scope`` (a module name) at ``version`` (the
    package's ``__version__``)."""
    return trace.get_tracer(scope, version)


def meter(scope: str, version: str) -> metrics.Meter:
    """The meter of instrumentation scope ``scope`` at ``version``; instruments follow a
    provider set later."""
    return metrics.get_meter(scope, version)


def tracing() -> bool:
    """Whether a real (SDK) tracer provider is installed: the hot-path check before span work.

    Reads the API's global provider slot directly. ``trace.get_tracer_provider()`` is the public
    way but costs ~0.7 µs (it consults the environment each call); this is ~30 ns. The test suite
    pins the behaviour, so an API change that breaks it fails loudly.
    """
    return trace._TRACER_PROVIDER is not None


@contextlib.contextmanager
def span(
    t: trace.Tracer, name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> Iterator[trace.Span | None]:
    """A current span when tracing is on, else nothing (yields None). For non-hot paths."""
    if trace._TRACER_PROVIDER is None:
        yield None
        return
    with t.start_as_current_span(name, attributes=attributes) as s:
        yield s


_configured: dict[str, Any] = {}


def configure(
    *,
    service_name: str = "netcl",
    console: bool | None = None,
    console_out: TextIO | None = None,
    prometheus_port: int | None = None,
) -> dict[str, Any]:
    """Install the OpenTelemetry SDK for an application (idempotent; needs ``netcl-core[otel]``).

    Exporters follow the standard variables: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces /
    metrics specific ones) sends spans and metrics over OTLP/HTTP; otherwise, or when ``console``
    is True, they are printed one line each to ``console_out`` (stderr). ``prometheus_port``
    also serves metrics for Prometheus on 127.0.0.1 at that port. Returns the installed providers
    (``tracer_provider``, ``meter_provider``); call :func:`shutdown` before exiting to flush.
    """
    if _configured:
        return _configured
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    otlp = any(
        os.environ.get(v)
        for v in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    )
    if console is None:
        console = not otlp
    out = console_out or sys.stderr
    tp = TracerProvider(resource=resource)
    readers: list[MetricReader] = []
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if console:
        tp.add_span_processor(
            BatchSpanProcessor(ConsoleSpanExporter(out=out, formatter=_span_line))
        )
        readers.append(
            PeriodicExportingMetricReader(
                ConsoleMetricExporter(out=out, formatter=_metric_lines),
                export_interval_millis=3_600_000,  # once, at shutdown: a summary, not a stream
            )
        )
    if prometheus_port is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        start_http_server(prometheus_port, addr="127.0.0.1")
        readers.append(PrometheusMetricReader())
    mp = MeterProvider(resource=resource, metric_readers=readers)
    trace.set_tracer_provider(tp)
    metrics.set_meter_provider(mp)
    _configured.update(tracer_provider=tp, meter_provider=mp)
    return _configured


def shutdown() -> None:
    """Flush and stop what :func:`configure` installed (no-op when it did nothing)."""
    if _configured:
        _configured["tracer_provider"].shutdown()
        _configured["meter_provider"].shutdown()


def _span_line(span: ReadableSpan) -> str:
    ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    attrs = " ".join(f"{k}={v!s}" for k, v in (span.attributes or {}).items())
    return f"span {span.name} {ms:.3f} ms {attrs}\n"


def _metric_lines(data: MetricsData) -> str:
    lines = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    attrs = ",".join(f"{k}={v!s}" for k, v in (p.attributes or {}).items())
                    value = getattr(p, "value", None)
                    if value is None:  # histogram point
                        value = f"count={p.count} sum={p.sum:.6g}"  # type: ignore[union-attr]
                    lines.append(f"metric {m.name}{{{attrs}}} {value}\n")
    return "".join(lines)
