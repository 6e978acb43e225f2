"""The ``OTEL_*`` variables netcl's :func:`configure` checks before the SDK reads them, the bounded
timeouts it defaults to, and the record of export failures (for netcl.core._otel_setup)."""

from __future__ import annotations

import logging
import math
import os
import threading
from importlib.metadata import entry_points

__all__ = ["ConfigError", "ExportFailures", "check_environment", "netcl_defaults", "sdk_disabled"]

_SIGNALS = ("traces", "metrics", "logs")
_PROTOCOLS = ("grpc", "http/protobuf")
_TRUE, _FALSE = ("true",), ("false", "")

# Bounded export, where the user set nothing: an OTLP request (with its retries) gives up after
# 2 s, and the export at shutdown after 2 s per signal (traces and metrics shut down together).
# The SDK's defaults (10 s per request, 30 s per shutdown) let a dead collector hold an
# application's exit for 20-30 s. The OTLP exporters of the Python SDK read their timeout in
# seconds, the batch processor and the metric reader in milliseconds.
OTLP_TIMEOUT_S = "2"
EXPORT_TIMEOUT_MS = "2000"
_TIMEOUT_DEFAULTS = {
    "OTEL_EXPORTER_OTLP_TIMEOUT": OTLP_TIMEOUT_S,
    "OTEL_BSP_EXPORT_TIMEOUT": EXPORT_TIMEOUT_MS,
    "OTEL_METRIC_EXPORT_TIMEOUT": EXPORT_TIMEOUT_MS,
}
# numbers the SDK reads: (variable, unit, integer only)
_NUMBERS = [
    *((f"OTEL_EXPORTER_OTLP{s}_TIMEOUT", "seconds", False)
      for s in ("", "_TRACES", "_METRICS", "_LOGS")),
    ("OTEL_BSP_EXPORT_TIMEOUT", "milliseconds", True),
    ("OTEL_BSP_SCHEDULE_DELAY", "milliseconds", True),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "spans", True),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "spans", True),
    ("OTEL_METRIC_EXPORT_TIMEOUT", "milliseconds", False),
    ("OTEL_METRIC_EXPORT_INTERVAL", "milliseconds", False),
]  # fmt: skip


class ConfigError(ValueError):
    """An ``OTEL_*`` variable has a value the SDK cannot use: ``variable``, ``value`` and what it
    ``accepts``; the message is one line."""

    def __init__(self, variable: str, value: str, accepts: str) -> None:
        self.variable, self.value, self.accepts = variable, value, accepts
        super().__init__(f"{variable}={value!r} is not valid: expected {accepts}")


def sdk_disabled() -> bool:
    """Whether ``OTEL_SDK_DISABLED`` turns the SDK off (checked by :func:`check_environment`)."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE


def check_environment() -> None:
    """Raise :class:`ConfigError` for the first ``OTEL_*`` value the SDK would reject, or
    silently replace with a default, that netcl knows how to check."""
    disabled = os.environ.get("OTEL_SDK_DISABLED")
    if disabled is not None and disabled.strip().lower() not in _TRUE + _FALSE:
        raise ConfigError("OTEL_SDK_DISABLED", disabled, "true or false")
    for variable in ["OTEL_EXPORTER_OTLP_PROTOCOL"] + [
        f"OTEL_EXPORTER_OTLP_{s.upper()}_PROTOCOL" for s in _SIGNALS
    ]:
        value = os.environ.get(variable)
        if value and value.strip() not in _PROTOCOLS:
            raise ConfigError(variable, value, " or ".join(_PROTOCOLS))
    for signal in _SIGNALS:
        _check_exporters(signal)
    for variable, unit, integer in _NUMBERS:
        _check_number(variable, unit, integer)
    _check_sampler()


def _names(group: str) -> list[str]:
    return sorted({ep.name for ep in entry_points(group=group)})


def _check_exporters(signal: str) -> None:
    variable = f"OTEL_{signal.upper()}_EXPORTER"
    value = os.environ.get(variable)
    if not value or value.strip().lower() == "none":
        return
    known = _names(f"opentelemetry_{signal}_exporter")
    for name in (n.strip() for n in value.split(",")):
        if name != "otlp" and name not in known:
            accepts = ", ".join(["otlp", *known, "none"])
            hint = "" if "otlp_proto_grpc" in known else "; OTLP needs netcl-core[otel]"
            raise ConfigError(variable, value, f"a comma-separated list of {accepts}{hint}")


def _check_number(variable: str, unit: str, integer: bool) -> None:
    value = os.environ.get(variable)
    if value is None or not value.strip():
        return
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        number = math.nan
    if not (number > 0 and math.isfinite(number)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(variable, value, f"{kind} > 0 ({unit})")


def _check_sampler() -> None:
    value = os.environ.get("OTEL_TRACES_SAMPLER")
    if value and value.strip() not in _names("opentelemetry_traces_sampler"):
        known = ", ".join(_names("opentelemetry_traces_sampler"))
        raise ConfigError("OTEL_TRACES_SAMPLER", value, f"one of {known}")
    arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG")
    if arg and value and "traceidratio" in value:
        try:
            ratio = float(arg)
        except ValueError:
            ratio = math.nan
        if not 0 <= ratio <= 1:
            raise ConfigError("OTEL_TRACES_SAMPLER_ARG", arg, "a ratio from 0 to 1")


def netcl_defaults() -> dict[str, str]:
    """The bounded timeouts for the variables the user left unset (per-signal OTLP timeouts
    count as set)."""
    env = {}
    for variable, value in _TIMEOUT_DEFAULTS.items():
        if variable in os.environ:
            continue
        if variable == "OTEL_EXPORTER_OTLP_TIMEOUT" and any(
            f"OTEL_EXPORTER_OTLP_{s.upper()}_TIMEOUT" in os.environ for s in _SIGNALS
        ):
            continue
        env[variable] = value
    return env


def shutdown_budget_s() -> float:
    """Seconds :func:`shutdown` gives the SDK: the larger of the batch processor's and the metric
    reader's export timeouts (they shut down side by side)."""
    budgets = []
    for variable in ("OTEL_BSP_EXPORT_TIMEOUT", "OTEL_METRIC_EXPORT_TIMEOUT"):
        try:
            budgets.append(float(os.environ.get(variable) or EXPORT_TIMEOUT_MS) / 1e3)
        except ValueError:
            budgets.append(float(EXPORT_TIMEOUT_MS) / 1e3)
    return max(budgets)


# The exporters report a failed export only by logging it (the batch processor and the metric
# reader drop the result). These are the loggers they use.
_EXPORT_LOGGERS = (
    "opentelemetry.exporter",  # OTLP gRPC and HTTP: "Failed to export ...", transient errors
    "opentelemetry.sdk._shared_internal",  # batch processor: "Exception while exporting ..."
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",  # "Exception while exporting metrics"
)


class ExportFailures(logging.Handler):
    """Keeps the first error logged by each exporter and counts them. Attached to the SDK's
    export loggers, it also keeps Python's last-resort handler from printing every retry."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.first: dict[str, str] = {}
        self.count: dict[str, int] = {}
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR:  # a transient error being retried: not a failure yet
            return
        message = record.getMessage()
        line = message.splitlines()[0] if message else record.name
        with self._guard:
            self.first.setdefault(record.name, line)
            self.count[record.name] = self.count.get(record.name, 0) + 1

    def attach(self) -> None:
        for name in _EXPORT_LOGGERS:
            logging.getLogger(name).addHandler(self)

    def lines(self) -> list[str]:
        """One line per failing exporter: how many errors and the first one."""
        with self._guard:
            return [f"{self.count[n]} export error(s), first: {line}"
                    for n, line in self.first.items()]  # fmt: skip
