"""Tracer, meter and instruments of the cache (names are API: the README's telemetry table)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from netcl.core import telemetry
from netcl.runtime.cache.version import __version__

__all__ = ["LOOKUPS", "RESULTS", "compile_duration", "recoveries", "tracer"]

SCOPE = "netcl.runtime.cache"

tracer = telemetry.tracer(SCOPE, __version__)
_meter = telemetry.meter(SCOPE, __version__)

RESULTS = ("memory", "disk", "compiled", "recovered")
#: Lookups by result, process-wide, cumulative. An in-process hit only bumps an int here; the
#: metric reads it when a reader collects, so a hit pays no metric call.
LOOKUPS: dict[str, int] = dict.fromkeys(RESULTS, 0)


def _observe_lookups(_: CallbackOptions) -> Iterable[Observation]:
    return [Observation(n, {"netcl.cache.result": r}) for r, n in LOOKUPS.items()]


_meter.create_observable_counter(
    "netcl.cache.lookups", [_observe_lookups], unit="{lookup}",
    description="ProgramCache.get_program calls by result (memory, disk, compiled, recovered)",
)
compile_duration = _meter.create_histogram(
    "netcl.cache.compile.duration", unit="s",
    description="Time to build an OpenCL program from source on a cache miss",
    explicit_bucket_boundaries_advisory=telemetry.DURATION_BUCKETS_S,
)
recoveries = _meter.create_counter(
    "netcl.cache.recoveries", unit="{entry}",
    description="Damaged cache entries found, by reason (empty, truncated, checksum, ...)",
)
