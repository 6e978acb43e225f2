"""Tracer, meter, instruments and attribute names of the cache (names are API)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from netcl.core import telemetry
from netcl.runtime.cache.version import __version__

__all__ = [
    "ATTR_DEVICE", "ATTR_ERROR_TYPE", "ATTR_KEY", "ATTR_LOG", "ATTR_OPTIONS", "ATTR_REASON",
    "ATTR_REMOTE_OP", "ATTR_RESULT", "LOOKUPS", "RESULTS", "SPAN_COMPILE", "SPAN_GET_PROGRAM",
    "compile_duration", "error_type", "recoveries", "tracer",
    "remote_duration", "remote_errors", "remote_rejected",
]

SCOPE = "netcl.runtime.cache"

SPAN_GET_PROGRAM = "netcl.cache.get_program"
SPAN_COMPILE = "netcl.cache.compile"
ATTR_RESULT = "netcl.cache.result"
ATTR_KEY = "netcl.cache.key"
ATTR_REASON = "netcl.cache.reason"
ATTR_DEVICE = "netcl.device.name"
ATTR_OPTIONS = "netcl.compile.options"
ATTR_LOG = "netcl.compile.log"
ATTR_REMOTE_OP = "netcl.cache.remote.op"
#: OpenTelemetry's semantic convention for failures: on failed spans and on the compile-duration
#: points of failed builds (successful points carry no ``error.type``).
ATTR_ERROR_TYPE = "error.type"

tracer = telemetry.tracer(SCOPE, __version__)
_meter = telemetry.meter(SCOPE, __version__)

RESULTS = ("memory", "disk", "remote", "compiled", "recovered")
#: Lookups by result, process-wide, cumulative. An in-process hit only bumps an int here; the
#: metric reads it when a reader collects, so a hit pays no metric call and no span.
LOOKUPS: dict[str, int] = dict.fromkeys(RESULTS, 0)


def error_type(exc: BaseException) -> str:
    """The ``error.type`` value of an exception: its fully qualified class name."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _observe_lookups(_: CallbackOptions) -> Iterable[Observation]:
    return [Observation(n, {ATTR_RESULT: r}) for r, n in LOOKUPS.items()]


_meter.create_observable_counter(
    "netcl.cache.lookups", [_observe_lookups], unit="{lookup}",
    description="ProgramCache.get_program calls by result "
    "(memory, disk, remote, compiled, recovered)",
)
compile_duration = _meter.create_histogram(
    "netcl.cache.compile.duration", unit="s",
    description="Time to build an OpenCL program from source on a cache miss (failed builds "
    "carry error.type)",
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
