"""Counters of a ProgramCache, and their totals written to the folder's ``stats.json`` at exit
(what ``netcl cache stats`` shows, like ``ccache -s``: under a lock, atomic rewrite)."""

from __future__ import annotations

import atexit
import errno
import json
import os
import stat
import weakref
from dataclasses import asdict, dataclass, fields
from typing import Any

import filelock

from netcl.core.log import get_logger
from netcl.runtime.cache._store import DiskStore, write_atomic

__all__ = [
    "COUNTERS", "CacheStats", "Counters", "add_totals", "flush", "flush_at_exit", "load_totals",
    "reset_totals",
]

_MAX_STATS_BYTES = 1 << 20
_NOFOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

log = get_logger("netcl.runtime.cache")


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a cache's counters (this process, this instance).

    ``misses`` counts lookups that found the program in no tier and compiled it (with or
    without a disk tier); ``compiles`` counts every build from source, failed builds too;
    ``recoveries`` counts damaged entries that were compiled again and overwritten;
    ``corrupt`` counts damaged entries seen (a recovery done by another process meanwhile is a
    ``disk_hit``). ``remote_*`` count the remote tier: hits, values published, failed Redis
    calls, values refused (bad signature, truncated, other device), lookups that waited for
    another machine's compile and waits that timed out.
    """

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compiles: int = 0
    recoveries: int = 0
    corrupt: int = 0
    write_errors: int = 0
    lock_timeouts: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    remote_hits: int = 0
    remote_writes: int = 0
    remote_errors: int = 0
    remote_rejected: int = 0
    remote_waits: int = 0
    remote_lock_timeouts: int = 0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits + self.remote_hits

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


COUNTERS = tuple(f.name for f in fields(CacheStats))
#: The live counters of one cache, by CacheStats field name: a plain dict, so that a hit
#: costs one item increment.
Counters = dict[str, int]


def new_counters() -> Counters:
    return dict.fromkeys(COUNTERS, 0)


def flush(store: DiskStore | None, counters: Counters, flushed: Counters) -> None:
    """Add ``counters`` since the last flush (``flushed``, updated) to ``store``'s totals."""
    delta = {k: v - flushed[k] for k, v in counters.items() if v != flushed[k]}
    if not delta or store is None:
        return
    try:
        add_totals(store, delta)
    except Exception as exc:  # never fail an exit over statistics
        log.info("cache_stats_not_saved", path=str(store.root), error=str(exc))
        return
    flushed.update({k: counters[k] for k in delta})


_INSTANCES: weakref.WeakSet[Any] = weakref.WeakSet()


def flush_at_exit(cache: Any) -> None:
    """Have ``cache.flush_stats()`` called at interpreter exit (while it is alive)."""
    _INSTANCES.add(cache)


@atexit.register
def _flush_all() -> None:
    for cache in list(_INSTANCES):
        cache.flush_stats()


def _safe_read(path: str, max_bytes: int) -> bytes:
    """A small regular file's bytes, opened without blocking or following links; raises
    ``OSError`` for anything else (or a file over ``max_bytes``)."""
    fd = os.open(path, _NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            raise OSError(errno.EINVAL, f"not a regular file of at most {max_bytes} bytes", path)
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def load_totals(store: DiskStore) -> Counters:
    """The folder's totals (``{}`` when there are none or they are unreadable)."""
    try:
        data = json.loads(_safe_read(str(store.root / "stats.json"), _MAX_STATS_BYTES))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)}


def add_totals(store: DiskStore, delta: Counters, timeout: float = 5.0) -> None:
    """Add ``delta`` to the folder's totals (under a lock, atomic rewrite); raises ``OSError``."""
    lock = filelock.FileLock(str(store.locks / "stats.lock"), timeout=timeout, mode=0o600)
    store.check_locks()
    with lock:
        total = load_totals(store)
        for k, v in delta.items():
            total[k] = total.get(k, 0) + v
        data = json.dumps(total, sort_keys=True).encode()
        write_atomic(store.root / "stats.json", data, ".stats.")


def reset_totals(store: DiskStore) -> bool:
    """Forget the folder's totals; False when there were none."""
    return store.remove(store.root / "stats.json")
