"""Spans and metrics of netcl.runtime.capture (names per the project's telemetry contract)."""

from __future__ import annotations

from opentelemetry.metrics import _internal as _metrics_internal

from netcl.core import telemetry

__all__ = ["metering", "replayed_launches", "replays", "tracer"]

SCOPE = "netcl.runtime.capture"
DIST = "netcl-capture"

tracer = telemetry.tracer(SCOPE, DIST)
_meter = telemetry.meter(SCOPE, DIST)

replays = _meter.create_counter(
    "netcl.capture.replays", unit="{replay}", description="Replays of captured launch sequences"
)
replayed_launches = _meter.create_counter(
    "netcl.capture.replayed_launches",
    unit="{launch}",
    description="Kernel launches enqueued by replays",
)
recorded_launches = _meter.create_counter(
    "netcl.capture.recorded_launches",
    unit="{launch}",
    description="Kernel launches recorded by captures",
)


def metering() -> bool:
    """Whether an SDK meter provider is installed (the metrics twin of ``telemetry.tracing``).

    Reads the API's global slot like ``telemetry.tracing`` does, so a replay without any SDK
    skips the metric calls (~0.2 µs each) as well as the span.
    """
    return getattr(_metrics_internal, "_METER_PROVIDER", True) is not None
