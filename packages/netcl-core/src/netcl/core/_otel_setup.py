"""How netcl configures the OpenTelemetry SDK for an application (:func:`configure`,
:func:`shutdown`) and prints spans and metric points as one line each. Re-exported by
:mod:`netcl.core.telemetry`; libraries never call it."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.trace import ReadableSpan

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
    from netcl.core.telemetry import _recheck  # the module that re-exports this one

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
    from netcl.core.telemetry import _recheck

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
