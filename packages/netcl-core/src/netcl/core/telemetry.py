"""OpenTelemetry helpers: tracers and meters per scope, a cheap 'is anything recording' check,
and an opt-in :func:`configure` for applications.

Libraries depend on ``opentelemetry-api`` only. With no SDK configured the API's no-op spans still
cost microseconds, so hot paths ask :func:`tracing` first (tens of nanoseconds) and skip span work
when it is False.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = [
    "DURATION_BUCKETS_S",
    "ERROR_TYPE",
    "configure",
    "meter",
    "shutdown",
    "span",
    "tracer",
    "tracing",
]

#: The semantic-conventions attribute every netcl failure (span or metric point) carries: the
#: exception's class name, or a short reason such as ``build_error``.
ERROR_TYPE = "error.type"


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


# tracing() state. The public way to ask whether an SDK is installed,
# ``trace.get_tracer_provider()``, costs ~1 µs while none is (it looks up an environment variable
# each call), too much for a hot path. A global provider can be set only once, so a True answer
# is latched for good; a False answer is re-checked every _RECHECK calls. A provider installed
# before netcl's first call (configure(), opentelemetry-instrument, a test's conftest) is seen at
# once; one installed by hand after netcl already ran is seen within _RECHECK calls.
_RECHECK = 1024
_on = False


def _recheck() -> bool:
    global _on
    _on = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return _on


def _make_tracing() -> Callable[[], bool]:
    # The countdown lives in a closure cell: decrementing a module global on every call would
    # also invalidate the interpreter's global-lookup caches of this module, at twice the cost.
    countdown = 1

    def tracing() -> bool:
        """Whether a real (SDK) tracer provider is installed: the hot-path check before span
        work (a few tens of nanoseconds)."""
        nonlocal countdown
        if _on:
            return True
        countdown -= 1
        if countdown:  # counts down to 0, then is reset: never negative
            return False
        countdown = _RECHECK
        return _recheck()

    return tracing


tracing = _make_tracing()


@contextlib.contextmanager
def span(
    t: trace.Tracer, name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> Iterator[trace.Span | None]:
    """A current span when tracing is on, else nothing (yields None). For non-hot paths."""
    if not tracing():
        yield None
        return
    with t.start_as_current_span(name, attributes=attributes) as s:
        yield s


_configured: dict[str, Any] = {}
_log = logging.getLogger(__name__)

_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_{}_ENDPOINT")


def configure(
    *,
    service_name: str = "netcl",
    console: bool = False,
    console_out: TextIO | None = None,
    prometheus_port: int | None = None,
) -> dict[str, Any]:
    """Install the OpenTelemetry SDK for an application (idempotent; needs ``netcl-core[otel]``).

    This is the SDK's own environment-driven configuration (the one ``opentelemetry-instrument``
    runs), so every standard ``OTEL_*`` variable applies: ``OTEL_TRACES_EXPORTER`` /
    ``OTEL_METRICS_EXPORTER`` / ``OTEL_LOGS_EXPORTER`` (``otlp``, ``console``, ``prometheus``,
    ``none``, comma-separated lists), ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc``, the SDK's default,
    or ``http/protobuf``), endpoints, headers, ``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_SERVICE_NAME``, samplers, export intervals. netcl adds three defaults: with no
    ``OTEL_{SIGNAL}_EXPORTER`` but an OTLP endpoint set, that signal goes over OTLP (with neither,
    nothing is exported); ``service.name`` is ``service_name`` unless the environment names one;
    console lines are one line per span or metric point. ``console=True`` also prints spans and
    metrics to ``console_out`` (stderr); ``prometheus_port`` serves metrics for Prometheus on that
    port (host ``OTEL_EXPORTER_PROMETHEUS_HOST``, default 127.0.0.1).

    When an SDK is already installed (by ``opentelemetry-instrument`` or the application), it is
    left alone. Returns the providers (``tracer_provider``, ``meter_provider``) and ``exporters``,
    the exporter names per signal as the SDK resolved them (``{"traces": ["otlp_proto_grpc"],
    ...}``; empty when the SDK was already installed); call :func:`shutdown` before exiting.
    """
    if _configured:
        return _configured
    exporters: dict[str, list[str]] = {}
    if _recheck():
        if prometheus_port is not None:
            _log.warning(
                "an OpenTelemetry SDK is already installed; prometheus_port=%d is ignored "
                "(set OTEL_METRICS_EXPORTER=prometheus and OTEL_EXPORTER_PROMETHEUS_PORT instead)",
                prometheus_port,
            )
    else:
        exporters = _install(service_name, console, console_out or sys.stderr, prometheus_port)
    _configured.update(
        tracer_provider=trace.get_tracer_provider(),
        meter_provider=metrics.get_meter_provider(),
        exporters=exporters,
    )
    return _configured


def _install(
    service_name: str, console: bool, out: TextIO, prometheus_port: int | None
) -> dict[str, list[str]]:
    # The SDK's configurator, as opentelemetry-distro subclasses it for opentelemetry-instrument.
    # Private API: tests/core/test_telemetry.py pins the names and parameters used here.
    from opentelemetry.sdk._configuration import _get_exporter_names, _OTelSDKConfigurator
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    resource: dict[str, AttributeValue] = {}
    if SERVICE_NAME not in OTELResourceDetector().detect().attributes:
        resource[SERVICE_NAME] = service_name
    # Like opentelemetry-distro, netcl's defaults are environment defaults, set only for the
    # duration of the configuration so that the SDK resolves them as it resolves the user's.
    env: dict[str, str] = {}
    for signal in ("TRACES", "METRICS"):
        endpoint = any(os.environ.get(v.format(signal)) for v in _OTLP_ENDPOINTS)
        if f"OTEL_{signal}_EXPORTER" not in os.environ and endpoint:
            env[f"OTEL_{signal}_EXPORTER"] = "otlp"
    extra = ["console"] if console else []
    metric_names = list(extra)
    if prometheus_port is not None:
        metric_names.append("prometheus")  # the SDK's reader serves on these variables
        env["OTEL_EXPORTER_PROMETHEUS_PORT"] = str(prometheus_port)
        env["OTEL_EXPORTER_PROMETHEUS_HOST"] = os.environ.get(
            "OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1"
        )
    saved = {v: os.environ.get(v) for v in env}
    os.environ.update(env)
    try:
        exporters = {
            "traces": _get_exporter_names("traces") + extra,
            "metrics": _get_exporter_names("metrics") + metric_names,
            "logs": _get_exporter_names("logs"),
        }
        try:
            _OTelSDKConfigurator().configure(  # type: ignore[no-untyped-call]
                trace_exporter_names=extra,
                metric_exporter_names=metric_names,
                resource_attributes=resource,
                exporter_args_map={
                    ConsoleSpanExporter: {"out": out, "formatter": _span_line},
                    ConsoleMetricExporter: {"out": out, "formatter": _metric_lines},
                },
            )
        except RuntimeError as exc:  # raised before any provider is installed
            raise RuntimeError(
                f"telemetry.configure(): exporters {exporters} as resolved from the OTEL_* "
                f"variables: {exc}. OTLP needs netcl-core[otel] (gRPC and HTTP exporters); "
                "known names: otlp, console, prometheus, none"
            ) from exc
    finally:
        for v, value in saved.items():
            if value is None:
                del os.environ[v]
            else:
                os.environ[v] = value
    _recheck()
    return {signal: list(dict.fromkeys(names)) for signal, names in exporters.items()}


def shutdown() -> None:
    """Flush and stop what :func:`configure` installed (no-op when it did nothing)."""
    for provider in (_configured.get("tracer_provider"), _configured.get("meter_provider")):
        stop = getattr(provider, "shutdown", None)
        if stop is not None:
            stop()


def _value(v: object) -> str:
    """One token of a key=value line: quoted (JSON, newlines escaped) when it has to be."""
    s = v if isinstance(v, str) else str(v)
    if not s or any(c.isspace() or c in '"=' for c in s):
        return json.dumps(s)
    return s


def _span_line(span: ReadableSpan) -> str:
    ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    ctx = span.context
    parent = format(span.parent.span_id, "016x") if span.parent else "-"
    head = (
        f"span {span.name} {ms:.3f} ms trace_id={ctx.trace_id:032x} span_id={ctx.span_id:016x} "
        f"parent_id={parent} status={span.status.status_code.name}"
    )
    fields = [head]
    if span.status.description:
        fields.append(f"status.description={_value(span.status.description)}")
    fields += [f"{k}={_value(v)}" for k, v in (span.attributes or {}).items()]
    return " ".join(fields) + "\n"


def _metric_lines(data: MetricsData) -> str:
    lines = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    attrs = ",".join(f"{k}={_value(v)}" for k, v in (p.attributes or {}).items())
                    value = getattr(p, "value", None)
                    if value is None:  # histogram point
                        value = f"count={p.count} sum={p.sum:.6g}"  # type: ignore[union-attr]
                    lines.append(f"metric {m.name}{{{attrs}}} {value}\n")
    return "".join(lines)
