"""ProgramCache: the in-process tier (built programs keyed on the caller's own objects, bounded,
holding contexts weakly, one builder per key) in front of the lookup across disk, remote and
compile."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyopencl as cl

from netcl.core import device as core_device
from netcl.core.log import get_logger
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._build import ProgramBuildError
from netcl.runtime.cache._config import DEFAULT_LOCK_TIMEOUT_S, Settings
from netcl.runtime.cache._key import normalize_options
from netcl.runtime.cache._lookup import REGISTRY, Lookup, _Registry
from netcl.runtime.cache._store import CacheStats, EntryFile, new_counters

__all__ = ["MemoryEntry", "MemoryTier", "ProgramCache"]

log = get_logger("netcl.runtime.cache")
_ref = weakref.ref


class MemoryEntry:
    """One built program, its cache key, and ``used``: hit since the clock hand last passed."""

    __slots__ = ("key", "program", "used")

    def __init__(self, program: cl.Program, key: str) -> None:
        self.program = program
        self.key = key
        self.used = False


def _purge_dead(tier_ref: weakref.ref[MemoryTier]) -> None:
    # a context the tier keyed on was collected: its entries go (keys of dead weakrefs never
    # match a lookup again; this frees the programs)
    tier = tier_ref()
    if tier is not None:
        tier.drop_dead_contexts()


class MemoryTier:
    """``entries`` maps (weakref to ctx, device, source, options) to a :class:`MemoryEntry`; a
    weakref without callback is shared (~0.1 µs per lookup). The bound evicts by CLOCK (README:
    "Tiers and key")."""

    __slots__ = ("__weakref__", "_dead_pending", "_lock", "_watched", "entries", "key_locks",
                 "max_programs")  # fmt: skip

    def __init__(self, max_programs: int) -> None:
        self.entries: OrderedDict[tuple[Any, ...], MemoryEntry] = OrderedDict()
        self.max_programs = max_programs
        self.key_locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._watched: weakref.WeakSet[cl.Context] = weakref.WeakSet()
        self._dead_pending = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def builder(self, mkey: tuple[Any, ...]) -> Iterator[None]:
        """Held while this thread builds ``mkey``: threads wanting the same program wait, then
        find it in ``entries``; the lock goes after the build, also after a failed one."""
        with self._lock:
            key_lock = self.key_locks.setdefault(mkey, threading.Lock())
        try:
            with key_lock:
                yield
        finally:
            with self._lock:
                if self.key_locks.get(mkey) is key_lock:  # not a newer one of a later caller
                    del self.key_locks[mkey]

    def remember(self, mkey: tuple[Any, ...], ctx: cl.Context, entry: MemoryEntry) -> None:
        with self._lock:
            if self._dead_pending:
                self._purge_locked()
            entries = self.entries
            entries[mkey] = entry
            while len(entries) > self.max_programs:
                k, old = entries.popitem(last=False)
                if old.used and k != mkey:  # a second chance
                    old.used = False
                    entries[k] = old
            if ctx not in self._watched:
                self._watched.add(ctx)
                weakref.finalize(ctx, _purge_dead, weakref.ref(self))

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()

    def drop_dead_contexts(self) -> None:
        # runs from the garbage collector, possibly in this very thread while it holds the lock
        # (inside remember): never block, leave the purge to the next insertion then
        if not self._lock.acquire(blocking=False):
            self._dead_pending = True
            return
        try:
            self._purge_locked()
        finally:
            self._lock.release()

    def _purge_locked(self) -> None:
        self._dead_pending = False
        for k in [k for k in self.entries if k[0]() is None]:
            del self.entries[k]


class ProgramCache:
    """Compiled OpenCL programs, cached in this process, on disk and optionally in a shared
    Redis. Arguments left out come from the environment (``NETCL_CACHE_*``) when first needed;
    nothing touches the disk before the first lookup. The README's API section describes each.
    """

    #: The error :meth:`get_program` raises when the compiler rejects a program.
    BuildError = ProgramBuildError

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int | None = None,
        lock_timeout: float | None = None,
        max_programs: int = 1024,
        device_identity: Callable[[cl.Device], str] | None = None,
        registry: _Registry | None = None,
        remote: str | None = None,
        remote_key: str | bytes | None = None,
    ) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"ProgramCache: max_bytes must be an int >= 0, got {max_bytes!r}")
        if not isinstance(max_programs, int) or max_programs < 1:
            raise ValueError(f"ProgramCache: max_programs must be an int >= 1, got "
                             f"{max_programs!r}")  # fmt: skip
        if lock_timeout is not None and not lock_timeout >= 0:
            raise ValueError(f"ProgramCache: lock_timeout must be a number of seconds >= 0, got "
                             f"{lock_timeout!r}")  # fmt: skip
        if remote is not None and not isinstance(remote, str):
            raise TypeError(f"ProgramCache: remote must be a redis:// or rediss:// URL string or "
                            f"None, got {remote!r}")  # fmt: skip
        if remote_key is not None and not isinstance(remote_key, (str, bytes)):
            raise TypeError(f"ProgramCache: remote_key must be a str or bytes secret or None, "
                            f"got {type(remote_key).__name__}")  # fmt: skip
        settings = Settings(
            None if cache_dir is None else Path(cache_dir).expanduser(), max_bytes,
            DEFAULT_LOCK_TIMEOUT_S if lock_timeout is None else lock_timeout,
        )  # fmt: skip
        self._lookup = Lookup(
            settings,
            device_identity if device_identity is not None else core_device.device_identity,
            registry if registry is not None else REGISTRY,
            (remote, remote_key),
        )
        self._tier = MemoryTier(max_programs)
        # the hit path reads these two directly: one attribute lookup each
        self._memory = self._tier.entries
        self._c = self._lookup.c
        self._flushed = new_counters()
        _LIVE.add(self)
        tel.report_memory_hits(self, self._c)

    # configuration ------------------------------------------------------------------------------

    @property
    def cache_dir(self) -> Path:
        """The folder of the disk tier (resolved now when it was left to the default)."""
        return self._lookup.settings.cache_dir

    @property
    def max_bytes(self) -> int:
        """The size cap of the disk tier in bytes."""
        return self._lookup.settings.max_bytes

    @property
    def enabled(self) -> bool:
        """Whether the disk tier is on (``NETCL_CACHE_DISABLE``)."""
        return self._lookup.settings.enabled

    @property
    def stats(self) -> CacheStats:
        """Counters of this instance in this process."""
        return CacheStats(**self._c)

    # lookup -------------------------------------------------------------------------------------

    def get_program(
        self,
        ctx: cl.Context,
        src_code: str,
        device: cl.Device | None = None,
        options: str | Sequence[str] | None = None,
    ) -> cl.Program:
        """A built ``cl.Program`` of ``src_code`` for ``device`` (may be left out when ``ctx``
        has one), with build ``options`` (a string or a list of strings), from the first tier
        that has it, else compiled; :class:`~netcl.runtime.cache.ProgramBuildError` when the
        compiler rejects the source."""
        try:
            mkey = (_ref(ctx), device, src_code, options)
            hit = self._memory.get(mkey)
        except TypeError:  # unhashable: options given as a list (key on a tuple of it), or a
            if not isinstance(options, list):  # bad argument: raise the error that names it
                _check_args(ctx, src_code, device)
                normalize_options(options)
                raise
            return self.get_program(ctx, src_code, device, tuple(options))
        if hit is not None:
            # no span, no metric call: the lookups counter reads memory_hits (see README)
            self._c["memory_hits"] += 1
            hit.used = True
            return hit.program
        return self._get_slow(mkey, ctx)

    def _get_slow(self, mkey: tuple[Any, ...], ctx: cl.Context) -> cl.Program:
        _, device, src_code, options = mkey
        dev = _check_args(ctx, src_code, device)
        opts = normalize_options(options)
        # threads wanting the same program: one builds, the others take it
        with self._tier.builder(mkey):
            hit = self._memory.get(mkey)
            if hit is not None:  # built by the thread this one waited for
                self._c["memory_hits"] += 1
                return hit.program
            prg, key = self._lookup.run(ctx, src_code, dev, opts)
            self._tier.remember(mkey, ctx, MemoryEntry(prg, key))
        return prg

    # maintenance --------------------------------------------------------------------------------

    def entries(self) -> list[EntryFile]:
        """The entry files on disk, least recently used first (empty when the tier is off)."""
        store = self._lookup.open_store()
        return store.entries() if store is not None else []

    def clear(self, *, memory: bool = True, disk: bool = True) -> int:
        """Forget the in-process programs and/or delete the disk entries and the temporary files
        of writers that are gone; the number of files removed."""
        if memory:
            self._tier.clear()
        if disk:
            store = self._lookup.open_store()
            if store is not None:
                return store.clear()
        return 0

    def prune(self, max_bytes: int | None = None) -> dict[str, int]:
        """Delete what is not a valid entry and the temporary files of writers that are gone,
        then evict down to ``max_bytes`` (default: the cap); counts by kind."""
        store = self._lookup.open_store()
        if store is None:
            return {"damaged": 0, "temp": 0, "evicted": 0}
        return store.prune(self.max_bytes if max_bytes is None else max_bytes)

    def flush_stats(self) -> None:
        """Add this instance's counters since the last flush to the folder's ``stats.json``
        (done at exit; ``netcl cache stats`` shows the totals)."""
        store, flushed = self._lookup.store, self._flushed
        delta = {k: v - flushed[k] for k, v in self._c.items() if v != flushed[k]}
        if not delta or store is None:
            return
        try:
            store.add_totals(delta)
        except Exception as exc:  # never fail an exit over statistics
            log.info("cache_stats_not_saved", path=str(store.root), error=str(exc))
            return
        for k, n in delta.items():  # not the counters now: they may have moved meanwhile
            flushed[k] += n

    def __repr__(self) -> str:
        where = self._lookup.settings.dir_arg or "default"
        return f"ProgramCache(cache_dir={where!s}, in_memory={len(self._memory)})"


_LIVE: weakref.WeakSet[ProgramCache] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    for cache in list(_LIVE):
        cache.flush_stats()


def _check_args(ctx: Any, src_code: Any, device: Any) -> cl.Device:
    if not isinstance(ctx, cl.Context):
        raise TypeError(f"get_program: ctx must be a pyopencl.Context, got {ctx!r}")
    if not isinstance(src_code, str):
        raise TypeError(f"get_program: src_code must be a str of OpenCL C, got "
                        f"{type(src_code).__name__}")  # fmt: skip
    if not src_code.strip():
        raise ValueError("get_program: src_code is empty")
    devices = ctx.devices
    if device is None:
        if len(devices) != 1:
            raise ValueError(f"get_program: ctx has {len(devices)} devices "
                             f"({', '.join(d.name for d in devices)}); pass device=")  # fmt: skip
        return devices[0]
    if not isinstance(device, cl.Device):
        raise TypeError(f"get_program: device must be a pyopencl.Device, got {device!r}")
    if device not in devices:
        raise ValueError(f"get_program: device {device.name!r} is not in ctx, whose devices are "
                         f"{[d.name for d in devices]}")  # fmt: skip
    return device
