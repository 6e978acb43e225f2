"""The cache's telemetry: its scope, span and attribute names and its instruments (names are
API). Counters are observable, read from :class:`~netcl.core.telemetry.Counts` when a reader
collects; durations are histograms. See :mod:`netcl.core.telemetry` for the failure policy."""

from __future__ import annotations

import itertools
import threading
import weakref

from netcl.core import telemetry
from netcl.runtime.cache.version import __version__

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

# An in-process hit only bumps its cache's own counter: Counts.add (~0.25 µs) would double
# what a hit costs. LOOKUPS reads the counters of the live caches when a reader collects; a
# cache that goes leaves its count behind. A cache's finalizer can run inside any allocation,
# also one made while _lock is held, so it only queues its token (list.append needs no lock);
# the next collection moves the count of the caches gone to _gone_hits.
_live: dict[int, dict[str, int]] = {}  # by token (an id() is reused once its cache is gone)
_tokens = itertools.count()
_ended: list[int] = []
_gone_hits = 0
_lock = threading.Lock()


def _count_memory_hits() -> None:
    global _gone_hits
    with _lock:
        while _ended:
            _gone_hits += _live.pop(_ended.pop(), {}).get("memory_hits", 0)
        LOOKUPS.set(_gone_hits + sum(c["memory_hits"] for c in _live.values()), "memory")


def report_memory_hits(cache: object, counters: dict[str, int]) -> None:
    """Count ``counters["memory_hits"]`` of ``cache`` as ``memory`` lookups."""
    with _lock:  # a reader's collection may be summing _live in another thread
        token = next(_tokens)
        _live[token] = counters
    weakref.finalize(cache, _ended.append, token)


#: Lookups by result, process-wide (in-process hits: read from the caches' counters).
LOOKUPS = telemetry.Counts(ATTR_RESULT, refresh=_count_memory_hits)
RECOVERIES = telemetry.Counts(ATTR_REASON)
REMOTE_ERRORS = telemetry.Counts(ATTR_ERROR_TYPE)
REMOTE_REJECTED = telemetry.Counts(ATTR_REASON)

for _name, _points, _unit, _what in (
    (
        "netcl.cache.lookups",
        LOOKUPS.points,
        "{lookup}",
        "ProgramCache.get_program calls by result (memory, disk, remote, compiled, recovered)",
    ),
    (
        "netcl.cache.recoveries",
        RECOVERIES.points,
        "{entry}",
        "Damaged cache entries found, by reason (empty, truncated, checksum, ...)",
    ),
    (
        "netcl.cache.remote.errors",
        REMOTE_ERRORS.points,
        "{error}",
        "Failed calls to the remote tier, by error.type (redis.exceptions.ConnectionError, "
        "redis.exceptions.TimeoutError, ...)",
    ),
    (
        "netcl.cache.remote.rejected",
        REMOTE_REJECTED.points,
        "{value}",
        "Remote values refused, by netcl.cache.reason (signature, truncated, identity, "
        "oversized, ...)",
    ),
):
    TEL.observable_counter(_name, _points, _unit, _what)
compile_duration = TEL.histogram(
    "netcl.cache.compile.duration",
    "s",
    "Time to build an OpenCL program from source on a cache miss (failed builds carry error.type)",
)
remote_duration = TEL.histogram(
    "netcl.cache.remote.duration",
    "s",
    "Latency of one call to the remote tier, by netcl.cache.remote.op (get, lock, set, "
    "unlock), failed calls included",
)
