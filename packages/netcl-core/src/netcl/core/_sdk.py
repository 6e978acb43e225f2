"""The OpenTelemetry SDK as netcl sees it: whether one is installed (:func:`tracing`, the hot-path
check), and for applications installing one from the ``OTEL_*`` variables (:func:`configure`),
its bounded export (:func:`flush`, :func:`shutdown`) and what failed (:func:`export_failures`).
Re-exported by :mod:`netcl.core.telemetry`."""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TextIO

from netcl.core.log import _value, get_logger

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.util.types import AttributeValue

__all__ = ["ConfigError", "configure", "export_failures", "flush", "shutdown", "tracing"]

_log = get_logger("netcl.core.telemetry")

# -- is anything recording? -------------------------------------------------------------------
# The public check, ``trace.get_tracer_provider()``, costs ~1 µs while no SDK is installed (an
# environment lookup per call): too much for a hot path. A global provider can be set only once,
# so True is latched for good and False re-checked every _RECHECK calls. netcl never imports the
# OpenTelemetry API to check: a provider can only have been set by code that loaded it (or be
# named by the variable the API reads on its first lookup).
_RECHECK = 1024


# the APIs whose provider a variable names (the API loads it on its first lookup): read once
_NAMED = {
    f"opentelemetry.{api}": f"OTEL_PYTHON_{kind}_PROVIDER" in os.environ
    for api, kind in (("trace", "TRACER"), ("metrics", "METER"))
}


def _loaded(api: str) -> Any:
    """The API module ``api`` (``opentelemetry.trace`` or ``.metrics``) if loaded, else None;
    imported here only when ``OTEL_PYTHON_<TRACER|METER>_PROVIDER`` names a provider to load."""
    if (module := sys.modules.get(api)) is None and _NAMED[api]:
        module = importlib.import_module(api)
    return module


_waiting: list[Callable[[], None]] = []  # what waits for the metrics API (when_metrics_loaded)
_waiting_lock = threading.Lock()


def metrics_loaded() -> bool:
    """Whether the OpenTelemetry metrics API is loaded (before, no meter provider exists and no
    reader can collect); the first time it is, what :func:`when_metrics_loaded` kept runs."""
    if _loaded("opentelemetry.metrics") is None:
        return False
    while _waiting:
        with _waiting_lock:
            todo = _waiting[:]
            del _waiting[:]
        for fn in todo:
            fn()
    return True


def when_metrics_loaded(fn: Callable[[], None]) -> None:
    """Call ``fn`` (e.g. make an observable instrument) now if the metrics API is loaded, else
    once it is: at the next :func:`tracing` re-check, :func:`configure`, or first instrument
    use after the application loaded it."""
    with _waiting_lock:
        _waiting.append(fn)
    metrics_loaded()


class _Switch:
    # Attributes of one object rather than module globals: rebinding a global on every call
    # would also invalidate the interpreter's global-lookup caches of this module.
    __slots__ = ("countdown", "on")

    def __init__(self) -> None:
        self.on = False
        self.countdown = 1


_switch = _Switch()


def _recheck() -> bool:
    trace = _loaded("opentelemetry.trace")
    _switch.on = trace is not None and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    )
    _switch.countdown = _RECHECK
    metrics_loaded()  # an application may have loaded it since: make what waits for it
    return _switch.on


def tracing() -> bool:
    """Whether a real (SDK) tracer provider is installed: the hot-path check before span work
    (a few tens of nanoseconds)."""
    s = _switch
    if s.on:
        return True
    s.countdown -= 1
    if s.countdown > 0:
        return False
    return _recheck()


# -- the variables configure() checks: only what the SDK accepts silently or reports badly -------
class ConfigError(ValueError):
    """An ``OTEL_*`` variable has a value the SDK cannot use: ``variable``, ``value`` and what it
    ``accepts``; the message is one line."""

    def __init__(self, variable: str, value: str, accepts: str) -> None:
        self.variable, self.value, self.accepts = variable, value, accepts
        super().__init__(f"{variable}={value!r} is not valid: expected {accepts}")


_SIGNALS: tuple[Literal["traces", "metrics", "logs"], ...] = ("traces", "metrics", "logs")
_PROTOCOLS = ("grpc", "http/protobuf")
_OTLP_SIGNALS = ("", "_TRACES", "_METRICS", "_LOGS")  # OTEL_EXPORTER_OTLP<signal>_*
# numbers the SDK reads (a bad one is a traceback, or a warning and its default): unit, integer
_NUMBERS = {
    **{f"OTEL_EXPORTER_OTLP{s}_TIMEOUT": ("seconds", False) for s in _OTLP_SIGNALS},
    **dict.fromkeys(("OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_SCHEDULE_DELAY"), ("milliseconds", True)),
    **dict.fromkeys(("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"), ("spans", True)),
    **dict.fromkeys(
        ("OTEL_METRIC_EXPORT_TIMEOUT", "OTEL_METRIC_EXPORT_INTERVAL"), ("milliseconds", False)
    ),
}
# Bounded export where the user set nothing: an OTLP request (with its retries) gives up after
# 2 s, and the export at shutdown after 2 s per signal (traces and metrics side by side). The
# SDK's defaults (10 s per request, 30 s per shutdown) let a dead collector hold an
# application's exit for 20-30 s. The OTLP exporters read seconds, the others milliseconds.
_BOUNDED = {
    "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
    "OTEL_BSP_EXPORT_TIMEOUT": "2000",
    "OTEL_METRIC_EXPORT_TIMEOUT": "2000",
}
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_{}_ENDPOINT")


def _names(group: str) -> list[str]:
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=group)})


def _number(text: str, integer: bool = False) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        return math.nan


def _check(variable: str, accepts: str, ok: Callable[..., bool], *args: object) -> None:
    if (value := os.environ.get(variable)) and not ok(value.strip(), *args):
        raise ConfigError(variable, value, accepts)


def _check_environment() -> None:
    """Raise :class:`ConfigError` for the first ``OTEL_*`` value that the SDK would reject with
    a traceback (or an error that names no variable), or silently replace with its default."""
    _check("OTEL_SDK_DISABLED", "true or false", lambda v: v.lower() in ("true", "false", ""))
    for s in _OTLP_SIGNALS:
        _check(f"OTEL_EXPORTER_OTLP{s}_PROTOCOL", " or ".join(_PROTOCOLS), _PROTOCOLS.__contains__)
    for signal in _SIGNALS:
        known = ["otlp", *_names(f"opentelemetry_{signal}_exporter")]
        hint = "" if "otlp_proto_grpc" in known else "; OTLP needs netcl-core[otel]"
        accepts = f"a comma-separated list of {', '.join([*known, 'none'])}{hint}"
        _check(
            f"OTEL_{signal.upper()}_EXPORTER",
            accepts,
            lambda v, k: v.lower() == "none" or all(n.strip() in k for n in v.split(",")),
            known,
        )
    for variable, (unit, integer) in _NUMBERS.items():
        accepts = f"{'an integer' if integer else 'a number'} > 0 ({unit})"
        _check(variable, accepts, lambda v, i: not v or 0 < _number(v, i) < math.inf, integer)
    samplers = _names("opentelemetry_traces_sampler")
    _check("OTEL_TRACES_SAMPLER", f"one of {', '.join(samplers)}", samplers.__contains__)
    if "traceidratio" in os.environ.get("OTEL_TRACES_SAMPLER", ""):
        _check("OTEL_TRACES_SAMPLER_ARG", "a ratio from 0 to 1", lambda v: 0 <= _number(v) <= 1)


# -- configure --------------------------------------------------------------------------------
_configured: dict[str, Any] = {}
_unfinished: list[str] = []  # flushes and shutdowns that ran past their deadline


def configure(
    *,
    service_name: str = "netcl",
    console: bool = False,
    console_out: TextIO | None = None,
    prometheus_port: int | None = None,
) -> dict[str, Any]:
    """Install the OpenTelemetry SDK for an application from the ``OTEL_*`` variables
    (idempotent; needs ``netcl-core[otel]``; the package's guide has netcl's defaults, the checks
    that raise :class:`ConfigError` first, and ``OTEL_SDK_DISABLED``). ``console=True`` also
    prints spans and metrics to ``console_out`` (stderr), one line each; ``prometheus_port``
    serves metrics on that port (host ``OTEL_EXPORTER_PROMETHEUS_HOST``, default 127.0.0.1). An
    SDK already installed is left alone. Returns ``tracer_provider``, ``meter_provider``,
    ``exporters`` (names per signal as resolved; empty for an SDK already there), ``disabled``.
    """
    if _configured:
        return _configured
    from opentelemetry import metrics, trace

    _check_environment()
    exporters: dict[str, list[str]] = {}
    disabled = False
    if _recheck():
        if prometheus_port is not None:
            _log.warning(
                "telemetry_prometheus_port_ignored",
                prometheus_port=prometheus_port,
                reason="an OpenTelemetry SDK is already installed: set "
                "OTEL_METRICS_EXPORTER=prometheus and OTEL_EXPORTER_PROMETHEUS_PORT instead",
            )
    elif os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        disabled = True
        exporters = {signal: [] for signal in _SIGNALS}
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
    env = {variable: value for variable, value in _BOUNDED.items() if variable not in os.environ}
    if any(f"OTEL_EXPORTER_OTLP_{s.upper()}_TIMEOUT" in os.environ for s in _SIGNALS):
        env.pop("OTEL_EXPORTER_OTLP_TIMEOUT", None)  # a per-signal timeout counts as set
    for signal in ("TRACES", "METRICS"):
        endpoint = any(os.environ.get(v.format(signal)) for v in _OTLP_ENDPOINTS)
        if f"OTEL_{signal}_EXPORTER" not in os.environ and endpoint:
            env[f"OTEL_{signal}_EXPORTER"] = "otlp"
    # the exporters netcl adds to those the variables name (console: spans and metrics)
    added = {s: ["console"] if console and s != "logs" else [] for s in _SIGNALS}
    if prometheus_port is not None:
        added["metrics"].append("prometheus")  # the SDK's reader serves on these variables
        env["OTEL_EXPORTER_PROMETHEUS_PORT"] = str(prometheus_port)
        if "OTEL_EXPORTER_PROMETHEUS_HOST" not in os.environ:
            env["OTEL_EXPORTER_PROMETHEUS_HOST"] = "127.0.0.1"
    saved = {v: os.environ[v] for v in env if v in os.environ}  # only the port can be set
    os.environ.update(env)
    try:
        exporters: dict[str, list[str]] = {
            s: list(dict.fromkeys(_get_exporter_names(s) + added[s])) for s in _SIGNALS
        }
        try:
            _OTelSDKConfigurator().configure(  # type: ignore[no-untyped-call]
                trace_exporter_names=added["traces"],
                metric_exporter_names=added["metrics"],
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
        for v in env:
            del os.environ[v]
        os.environ.update(saved)
    for name in _EXPORT_LOGGERS:
        logging.getLogger(name).addHandler(_failures)
    _recheck()
    return exporters


# -- bounded flush and shutdown ---------------------------------------------------------------
def flush(timeout: float | None = None) -> bool:
    """Export what the providers :func:`configure` installed hold now, waiting at most
    ``timeout`` seconds (default as :func:`shutdown`); False when it ran past that (the rest
    goes on in the background)."""
    return _bounded("force_flush", timeout)


def shutdown(timeout: float | None = None) -> bool:
    """Flush and stop what :func:`configure` installed, traces and metrics side by side, in at
    most ``timeout`` seconds (default: the larger of ``OTEL_BSP_EXPORT_TIMEOUT`` and
    ``OTEL_METRIC_EXPORT_TIMEOUT``), after collecting pending device time (up to 1 s). False
    when an exporter was still busy at the deadline (left on its daemon thread)."""
    if _configured:
        for hook in _before_shutdown:
            hook(1.0)
    return _bounded("shutdown", timeout)


# what runs before shutdown: device time's flush, registered when device time loads (a process
# without it never imports it)
_before_shutdown: list[Callable[[float], object]] = []


def export_failures() -> list[str]:
    """One line per exporter that failed to export since :func:`configure` (its error count and
    first message), and per flush or shutdown that ran past its deadline; empty when all went
    well."""
    seen = dict(_failures.seen)  # a copy (atomic under the GIL): emit() may add to it meanwhile
    return [f"{n} export error(s), first: {first}" for n, first in seen.values()] + _unfinished


def _bounded(method: str, timeout: float | None) -> bool:
    if timeout is None:  # the values were checked by configure()
        variables = ("OTEL_BSP_EXPORT_TIMEOUT", "OTEL_METRIC_EXPORT_TIMEOUT")
        timeout = max(_number(os.environ.get(v) or _BOUNDED[v]) for v in variables) / 1e3
    deadline = time.monotonic() + timeout
    threads = []
    for signal, provider in (("traces", "tracer_provider"), ("metrics", "meter_provider")):
        if (call := getattr(_configured.get(provider), method, None)) is not None:
            name = f"netcl-otel-{method}-{signal}"
            thread = threading.Thread(target=_quietly, args=(call,), name=name, daemon=True)
            thread.start()
            threads.append((signal, thread))
    done = True
    for signal, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            done = False
            _unfinished.append(f"{signal}: {method} still exporting after {timeout:g} s, abandoned")
    return done


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as exc:  # an SDK that raises never reaches the application
        _log.warning("telemetry_call_failed", call=call.__name__, error=repr(exc))


# The exporters report a failed export only by logging it (the batch processor and the metric
# reader drop the result). These are the loggers they use.
_EXPORT_LOGGERS = (
    "opentelemetry.exporter",  # OTLP gRPC and HTTP: "Failed to export ...", transient errors
    "opentelemetry.sdk._shared_internal",  # batch processor: "Exception while exporting ..."
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",  # "Exception while exporting metrics"
)


class _ExportFailures(logging.Handler):
    """Keeps the count and first error logged by each exporter. Attached to the SDK's export
    loggers, it also keeps Python's last-resort handler from printing every retry."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)  # a warning is a transient error being retried
        self.seen: dict[str, tuple[int, str]] = {}  # logger name -> (errors, first one)

    def emit(self, record: logging.LogRecord) -> None:  # called with the handler's lock held
        message = record.getMessage()
        n, first = self.seen.get(record.name, (0, message.splitlines()[0] if message else ""))
        self.seen[record.name] = (n + 1, first or record.name)


_failures = _ExportFailures()


# -- one line per span and metric point (the console exporters' formatters) ------------------
def _span_line(span: ReadableSpan) -> str:
    ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    ctx = span.context
    parent = format(span.parent.span_id, "016x") if span.parent else "-"
    fields = [
        f"span {span.name} {ms:.3f} ms trace_id={ctx.trace_id:032x} span_id={ctx.span_id:016x} "
        f"parent_id={parent} status={span.status.status_code.name}"
    ]
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
                    if (value := getattr(p, "value", None)) is None:  # histogram point
                        value = f"count={p.count} sum={p.sum:.6g}"  # type: ignore[union-attr]
                    lines.append(f"metric {m.name}{{{attrs}}} {value}\n")
    return "".join(lines)
