"""Counters of a ProgramCache, and their totals in the folder's ``stats.json``, added at exit
under a lock, atomic rewrite (what ``netcl cache stats`` shows, like ``ccache -s``)."""

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

__all__ = ["COUNTERS", "CacheStats", "Counters", "add_totals", "flush", "flush_at_exit",
           "load_totals", "new_counters", "reset_totals"]  # fmt: skip

_MAX_STATS_BYTES = 1 << 20
_NOFOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

log = get_logger("netcl.runtime.cache")


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a cache's counters (this process, this instance); the README's API
    section says what each counts."""

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


def load_totals(store: DiskStore) -> Counters:
    """The folder's totals (``{}`` when there are none or they are unreadable). The file is
    opened without blocking or following links, and read only when small and regular."""
    try:
        fd = os.open(store.root / "stats.json", _NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_STATS_BYTES:
                raise OSError(errno.EINVAL, "not a small regular file")
            data = json.loads(os.read(fd, _MAX_STATS_BYTES))
        finally:
            os.close(fd)
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
