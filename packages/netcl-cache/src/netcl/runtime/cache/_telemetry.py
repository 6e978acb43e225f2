"""Tracer, meter and instruments of the cache (names per DESIGN.md: they are API)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from netcl.core import telemetry

__all__ = [
    "LOOKUPS", "RESULTS", "compile_duration", "recoveries", "remote_duration", "remote_errors",
    "remote_rejected", "tracer",
]

SCOPE = "netcl.runtime.cache"
DIST = "netcl-cache"

tracer = telemetry.tracer(SCOPE, DIST)
_meter = telemetry.meter(SCOPE, DIST)

RESULTS = ("memory", "disk", "remote", "compiled", "recovered")
#: Lookups by result, process-wide, cumulative. An in-process hit only bumps an int here; the
#: metric reads it when a reader collects, so a hit pays no metric call.
LOOKUPS: dict[str, int] = dict.fromkeys(RESULTS, 0)


def _observe_lookups(_: CallbackOptions) -> Iterable[Observation]:
    return [Observation(n, {"netcl.cache.result": r}) for r, n in LOOKUPS.items()]


_meter.create_observable_counter(
    "netcl.cache.lookups", [_observe_lookups], unit="{lookup}",
    description="ProgramCache.get_program calls by result "
    "(memory, disk, remote, compiled, recovered)",
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

# remote tier (Redis): only touched when a remote is configured
remote_duration = _meter.create_histogram(
    "netcl.cache.remote.duration", unit="s",
    description="Latency of one call to the remote tier, by netcl.cache.remote.op "
    "(get, lock, set, unlock), failed calls included",
    explicit_bucket_boundaries_advisory=telemetry.DURATION_BUCKETS_S,
)
remote_errors = _meter.create_counter(
    "netcl.cache.remote.errors", unit="{error}",
    description="Failed calls to the remote tier, by error.type (ConnectionError, TimeoutError, "
    "AuthenticationError, OutOfMemoryError, ...)",
)
remote_rejected = _meter.create_counter(
    "netcl.cache.remote.rejected", unit="{value}",
    description="Remote values refused, by netcl.cache.reason (signature, truncated, identity, "
    "oversized, ...)",
)
