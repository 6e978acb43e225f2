"""How netcl configures the OpenTelemetry SDK for an application (:func:`configure`,
:func:`flush`, :func:`shutdown`, :func:`export_failures`) and prints spans and metric points as one
line each. Re-exported by :mod:`netcl.core.telemetry`; libraries never call it."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

from netcl.core._otel_env import (
    ConfigError,
    ExportFailures,
    check_environment,
    netcl_defaults,
    sdk_disabled,
    shutdown_budget_s,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["ConfigError", "configure", "export_failures", "flush", "shutdown"]

_configured: dict[str, Any] = {}
_log = logging.getLogger(__name__)
_failures = ExportFailures()
_unfinished: list[str] = []  # flushes and shutdowns that ran past their deadline

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
    ``chrome_trace``, ``none``, comma-separated lists), ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc``,
    the SDK's default, or ``http/protobuf``), endpoints, headers, ``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_SERVICE_NAME``, samplers, export intervals and timeouts, ``OTEL_SDK_DISABLED``.

    netcl adds defaults where a variable is unset: with no ``OTEL_{SIGNAL}_EXPORTER`` but an OTLP
    endpoint set, that signal goes over OTLP (with neither, nothing is exported); an OTLP request
    gives up after 2 s (``OTEL_EXPORTER_OTLP_TIMEOUT``, seconds in this SDK) and each signal's
    export at :func:`shutdown` after 2 s (``OTEL_BSP_EXPORT_TIMEOUT``,
    ``OTEL_METRIC_EXPORT_TIMEOUT``, milliseconds), so a dead collector costs an application
    seconds, not half a minute; ``service.name`` is ``service_name`` unless the environment names
    one; console lines are one line per span or metric point. ``console=True`` also prints spans
    and metrics to ``console_out`` (stderr); ``prometheus_port`` serves metrics for Prometheus on
    that port (host ``OTEL_EXPORTER_PROMETHEUS_HOST``, default 127.0.0.1).

    A value the SDK would reject or silently replace raises :class:`ConfigError` (one line
    naming the variable and what it accepts) before anything is installed. With
    ``OTEL_SDK_DISABLED=true`` nothing is installed. When an SDK is already installed (by
    ``opentelemetry-instrument`` or the application), it is left alone.

    Returns the providers (``tracer_provider``, ``meter_provider``), ``exporters``, the exporter
    names per signal as the SDK resolved them (``{"traces": ["otlp_proto_grpc"], ...}``; empty
    when the SDK was already installed, empty lists when disabled), and ``disabled``. Export
    errors are kept (:func:`export_failures`) instead of printed by Python's last-resort log
    handler; call :func:`shutdown` before exiting.
    """
    if _configured:
        return _configured
    check_environment()
    exporters: dict[str, list[str]] = {}
    disabled = False
    from netcl.core.telemetry import _recheck  # the module that re-exports this one

    if _recheck():
        if prometheus_port is not None:
            _log.warning(
                "an OpenTelemetry SDK is already installed; prometheus_port=%d is ignored "
                "(set OTEL_METRICS_EXPORTER=prometheus and OTEL_EXPORTER_PROMETHEUS_PORT instead)",
                prometheus_port,
            )
    elif sdk_disabled():
        disabled = True
        exporters = {"traces": [], "metrics": [], "logs": []}
    else:
        exporters = _install(service_name, console, console_out or sys.stderr, prometheus_port)
    _configured.update(
        tracer_provider=trace.get_tracer_provider(),
        meter_provider=metrics.get_meter_provider(),
        exporters=exporters,
        disabled=disabled,
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
    env = netcl_defaults()
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
                f"telemetry.configure(): {exc} (exporters {exporters} as resolved from the "
                "OTEL_* variables; OTLP needs netcl-core[otel])"
            ) from exc
    finally:
        for v, value in saved.items():
            if value is None:
                del os.environ[v]
            else:
                os.environ[v] = value
    _failures.attach()
    from netcl.core.telemetry import _recheck

    _recheck()
    return {signal: list(dict.fromkeys(names)) for signal, names in exporters.items()}


def flush(timeout: float | None = None) -> bool:
    """Export what the providers :func:`configure` installed hold now, waiting at most
    ``timeout`` seconds (default as :func:`shutdown`); False when it ran past that (the rest
    goes on in the background)."""
    return _bounded("force_flush", timeout)


def shutdown(timeout: float | None = None) -> bool:
    """Flush and stop what :func:`configure` installed (no-op when it did nothing), in at most
    ``timeout`` seconds: by default the larger of ``OTEL_BSP_EXPORT_TIMEOUT`` and
    ``OTEL_METRIC_EXPORT_TIMEOUT`` (2 s each unless set), traces and metrics side by side. Device
    time still pending in :mod:`netcl.core.profiling` is collected first (up to 1 s). Returns
    False when an exporter was still busy at the deadline: it is left behind on a daemon thread
    (recorded in :func:`export_failures`), so the application exits on time."""
    profiling = sys.modules.get("netcl.core.profiling")
    if profiling is not None and _configured:
        profiling.flush(1.0)
    return _bounded("shutdown", timeout)


def export_failures() -> list[str]:
    """One line per exporter that failed to export since :func:`configure` (its error count and
    first message), and per flush or shutdown that ran past its deadline; empty when all went
    well."""
    return _failures.lines() + list(_unfinished)


def _bounded(method: str, timeout: float | None) -> bool:
    budget = shutdown_budget_s() if timeout is None else timeout
    calls: list[tuple[str, Callable[[], object]]] = []
    for signal, provider in (("traces", "tracer_provider"), ("metrics", "meter_provider")):
        call = getattr(_configured.get(provider), method, None)
        if call is not None:
            calls.append((signal, call))
    deadline = time.monotonic() + budget
    threads = []
    for what, call in calls:
        thread = threading.Thread(target=_quietly, args=(call,), daemon=True,
                                  name=f"netcl-otel-{method}-{what}")  # fmt: skip
        thread.start()
        threads.append((what, thread))
    done = True
    for what, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            done = False
            _unfinished.append(f"{what}: {method} still exporting after {budget:g} s, abandoned")
    return done


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as exc:  # an SDK that raises never reaches the application
        _log.warning("telemetry %s failed: %r", getattr(call, "__name__", call), exc)


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
