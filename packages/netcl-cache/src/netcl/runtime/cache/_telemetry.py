"""The cache's telemetry: its scope, span and attribute names and its instruments (names are API).
Spans are opened with ``TEL.span``; see :mod:`netcl.core.telemetry` for the failure policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.util.types import AttributeValue

from netcl.core import telemetry
from netcl.runtime.cache.version import __version__

__all__ = [
    "ATTR_DEVICE", "ATTR_ERROR_TYPE", "ATTR_KEY", "ATTR_LOG", "ATTR_OPTIONS", "ATTR_REASON",
    "ATTR_REMOTE_OP", "ATTR_RESULT", "LOOKUPS", "RESULTS", "SPAN_COMPILE", "SPAN_GET_PROGRAM",
    "TEL", "compile_duration", "recoveries", "remote_duration", "remote_errors",
    "remote_rejected",
]  # fmt: skip

TEL = telemetry.Scope("netcl.runtime.cache", __version__)

SPAN_GET_PROGRAM = "netcl.cache.get_program"
SPAN_COMPILE = "netcl.cache.compile"
ATTR_RESULT = "netcl.cache.result"
ATTR_KEY = "netcl.cache.key"
ATTR_REASON = "netcl.cache.reason"
ATTR_DEVICE = "netcl.device.name"
ATTR_OPTIONS = "netcl.compile.options"
ATTR_LOG = "netcl.compile.log"
ATTR_REMOTE_OP = "netcl.cache.remote.op"
#: On failed spans, on the compile-duration points of failed builds (successful points carry
#: none) and on remote errors: :func:`netcl.core.telemetry.error_type`.
ATTR_ERROR_TYPE = telemetry.ERROR_TYPE

RESULTS = ("memory", "disk", "remote", "compiled", "recovered")
#: Lookups by result, process-wide, cumulative. An in-process hit only bumps an int here; the
#: metric reads it when a reader collects, so a hit pays no metric call and no span.
LOOKUPS: dict[str, int] = dict.fromkeys(RESULTS, 0)


def _observe_lookups() -> Iterable[tuple[float, Mapping[str, AttributeValue]]]:
    return [(n, {ATTR_RESULT: r}) for r, n in LOOKUPS.items()]


TEL.observable_counter(
    "netcl.cache.lookups", _observe_lookups, "{lookup}",
    "ProgramCache.get_program calls by result (memory, disk, remote, compiled, recovered)",
)
compile_duration = TEL.histogram(
    "netcl.cache.compile.duration", "s",
    "Time to build an OpenCL program from source on a cache miss (failed builds carry "
    "error.type)",
)
recoveries = TEL.counter(
    "netcl.cache.recoveries", "{entry}",
    "Damaged cache entries found, by reason (empty, truncated, checksum, ...)",
)

# remote tier (Redis): only touched when a remote is configured
remote_duration = TEL.histogram(
    "netcl.cache.remote.duration", "s",
    "Latency of one call to the remote tier, by netcl.cache.remote.op (get, lock, set, "
    "unlock), failed calls included",
)
remote_errors = TEL.counter(
    "netcl.cache.remote.errors", "{error}",
    "Failed calls to the remote tier, by error.type (redis.exceptions.ConnectionError, "
    "redis.exceptions.TimeoutError, ...)",
)
remote_rejected = TEL.counter(
    "netcl.cache.remote.rejected", "{value}",
    "Remote values refused, by netcl.cache.reason (signature, truncated, identity, "
    "oversized, ...)",
)
