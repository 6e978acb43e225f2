"""ProgramCache: the in-process tier (built programs keyed on the caller's own objects, bounded,
holding contexts weakly, one builder per key) in front of the lookup below it: disk, then remote,
then compile. The lookup owns the order, the locks that make one process (and one machine of a
fleet) compile a missing program while the others wait for it, the write-back to the faster tiers
and the counters; tiers get, lock, put."""

from __future__ import annotations

import atexit
import functools
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyopencl as cl

from netcl.core import device as core_device
from netcl.core import paths
from netcl.core.log import LazyLogger, warn_once
from netcl.runtime.cache import _remote
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._build import ProgramBuildError, compile_program, entry_meta, from_binary
from netcl.runtime.cache._config import DEFAULT_MAX_BYTES, DISABLE, MAX_BYTES, log, read
from netcl.runtime.cache._entry import EntryError, compute_key, decode, encode
from netcl.runtime.cache._remote import Lease, RemoteError, RemoteTier
from netcl.runtime.cache._store import CacheStats, DiskStore, EntryFile, refusal

__all__ = ["DEFAULT_LOCK_TIMEOUT_S", "REGISTRY", "MemoryEntry", "MemoryTier", "ProgramCache"]

_ref = weakref.ref
#: Seconds to wait for another process (or machine) compiling the same program.
DEFAULT_LOCK_TIMEOUT_S = 60.0


@dataclass(slots=True)
class MemoryEntry:
    """One built program, its cache key, and ``used``: hit since the clock hand last passed."""

    program: cl.Program
    key: str
    used: bool = False


def _purge_dead(tier_ref: weakref.ref[MemoryTier], _ctx: object = None) -> None:
    # a context the tier keyed on was collected: its entries go (keys of dead weakrefs never
    # match a lookup again; this frees the programs)
    if (tier := tier_ref()) is not None:
        tier.drop_dead_contexts()


class MemoryTier:
    """``entries`` maps (weakref to ctx, device, source, options) to a :class:`MemoryEntry`; a
    weakref without callback is shared (~0.1 µs per lookup). The bound evicts by CLOCK (guide:
    "Tiers and key")."""

    __slots__ = (
        "__weakref__",
        "_dead_pending",
        "_lock",
        "_watched",
        "entries",
        "key_locks",
        "max_programs",
    )

    def __init__(self, max_programs: int) -> None:
        self.entries: OrderedDict[tuple[Any, ...], MemoryEntry] = OrderedDict()
        self.max_programs = max_programs
        self.key_locks: dict[tuple[Any, ...], threading.Lock] = {}
        # per context a weakref whose callback purges (weakref.finalize: ~2 µs more a new tier)
        self._watched: dict[weakref.ref[cl.Context], weakref.ref[cl.Context]] = {}
        self._dead_pending = False
        self._lock = threading.Lock()

    def key_lock(self, mkey: tuple[Any, ...]) -> threading.Lock:
        """The lock held while building ``mkey`` (threads wanting it wait, then find it in
        ``entries``); :meth:`unlock` after, also a failed build (a generator: ~2 µs more)."""
        with self._lock:
            return self.key_locks.setdefault(mkey, threading.Lock())

    def unlock(self, mkey: tuple[Any, ...], key_lock: threading.Lock) -> None:
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
            if mkey[0] not in self._watched:
                self._watched[mkey[0]] = _ref(ctx, functools.partial(_purge_dead, _ref(self)))

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
        self._watched = {k: v for k, v in self._watched.items() if k() is not None}


class _Registry:
    """What caches of one process share: folders found trusted, the devices of each context,
    device identities and names (slow driver queries); guide: ``ProgramCache(registry=...)``."""

    def __init__(self) -> None:
        self.stores: dict[Path, DiskStore] = {}
        self.devices: dict[tuple[cl.Device, Callable[[cl.Device], str]], tuple[str, str]] = {}
        self.contexts: weakref.WeakKeyDictionary[cl.Context, list[cl.Device]]
        self.contexts = weakref.WeakKeyDictionary()

    def devices_of(self, ctx: cl.Context) -> list[cl.Device]:
        """``ctx.devices``, asked of the driver once per context (~0.5-2 µs a query on NVIDIA)."""
        if (found := self.contexts.get(ctx)) is None:
            found = self.contexts[ctx] = ctx.devices
        return found

    def device(self, dev: cl.Device, identity: Callable[[cl.Device], str]) -> tuple[str, str]:
        """(identity, name) of ``dev``."""
        if (found := self.devices.get((dev, identity))) is None:
            found = self.devices[(dev, identity)] = (identity(dev), dev.name)
        return found


REGISTRY = _Registry()


@dataclass(slots=True)
class _Request:
    """One program wanted: the caller's objects and what the tiers key on."""

    ctx: cl.Context
    src: str
    dev: cl.Device
    opts: str
    key: str
    ident: str
    src_len: int
    name: str

    def load(
        self, opened: Callable[[], memoryview]
    ) -> tuple[cl.Program | None, memoryview | bytes, str]:
        """(program, binary, "") from the binary ``opened()`` checks, else (None, b"", why not):
        the disk and the remote tier refuse alike."""
        try:
            binary = opened()
            return from_binary(self.ctx, self.dev, self.opts, binary), binary, ""
        except EntryError as exc:
            return None, b"", str(exc)
        except cl.Error as exc:
            return None, b"", f"rejected: by the driver: {exc}"


class _Session:
    """One lookup's use of the remote tier: no call after a failed one (a lookup pays at most
    one deadline), except releasing a lock it holds while the server still answers."""

    def __init__(self, tier: RemoteTier, counters: dict[str, int]) -> None:
        self.tier, self.c = tier, counters
        self.ok = self.reachable = True
        self.reported = False  # a bad value seen again after a wait is reported once

    def call(self, fn: Callable[..., Any], *args: Any, release: bool = False) -> Any:
        """``fn(*args)``, or None when it failed or an earlier call did (with ``release``: one
        that found the server down)."""
        if not (self.reachable if release else self.ok):
            return None
        try:
            return fn(*args)
        except RemoteError as exc:
            self.ok, self.reachable = False, not exc.down
            if exc.failed:
                self.c["remote_errors"] += 1
            return None


class ProgramCache:
    """Compiled OpenCL programs, cached in this process, on disk and optionally in a shared
    Redis. Arguments left out come from the environment (``NETCL_CACHE_*``) when first needed;
    nothing touches the disk before the first lookup. The guide's API section describes each.
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
            raise ValueError(
                f"ProgramCache: max_programs must be an int >= 1, got {max_programs!r}"
            )
        if lock_timeout is not None and not lock_timeout >= 0:
            raise ValueError(
                f"ProgramCache: lock_timeout must be a number of seconds >= 0, got {lock_timeout!r}"
            )
        if remote is not None and not isinstance(remote, str):
            raise TypeError(
                f"ProgramCache: remote must be a redis:// or rediss:// URL string or "
                f"None, got {remote!r}"
            )
        if remote_key is not None and not isinstance(remote_key, (str, bytes)):
            raise TypeError(
                f"ProgramCache: remote_key must be a str or bytes secret or None, "
                f"got {type(remote_key).__name__}"
            )
        self._dir_arg = None if cache_dir is None else Path(cache_dir).expanduser()
        self._max_bytes_arg = max_bytes
        self._lock_timeout = DEFAULT_LOCK_TIMEOUT_S if lock_timeout is None else lock_timeout
        self._device_identity = device_identity or core_device.device_identity
        self._registry = registry if registry is not None else REGISTRY
        self._remote_args = (remote, remote_key)
        self._store: DiskStore | None = None  # when opened and found usable
        self._store_opened = False
        self._tier = MemoryTier(max_programs)
        # the hit path reads these two directly: one attribute lookup each; the counters are a
        # plain dict by CacheStats field name, so that a hit costs one item increment
        self._memory = self._tier.entries
        self._c = CacheStats().as_dict()
        self._flushed = CacheStats().as_dict()
        _LIVE.add(self)
        tel.report_memory_hits(self, self._c)

    # configuration: the arguments given, the environment for the rest (read when asked, so a
    # change of the environment is seen by the next lookup) --------------------------------------
    @property
    def cache_dir(self) -> Path:
        """The folder of the disk tier (resolved now when it was left to the default)."""
        return self._dir_arg if self._dir_arg is not None else paths.default_cache_dir()

    @property
    def max_bytes(self) -> int:
        """The size cap of the disk tier in bytes."""
        if self._max_bytes_arg is not None:
            return self._max_bytes_arg
        return read(MAX_BYTES, DEFAULT_MAX_BYTES)

    @property
    def enabled(self) -> bool:
        """Whether the disk tier is on (``NETCL_CACHE_DISABLE``)."""
        return not read(DISABLE, False)

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
                _check_args(ctx, src_code, device, self._registry)
                normalize_options(options)
                raise
            return self.get_program(ctx, src_code, device, tuple(options))
        if hit is not None:
            # no span, no metric call: the lookups counter reads memory_hits (see the guide)
            self._c["memory_hits"] += 1
            hit.used = True
            return hit.program
        return self._get_slow(mkey, ctx)

    def _get_slow(self, mkey: tuple[Any, ...], ctx: cl.Context) -> cl.Program:
        _, device, src_code, options = mkey
        dev = _check_args(ctx, src_code, device, self._registry)
        opts = normalize_options(options)
        # threads wanting the same program: one builds, the others take it
        key_lock = self._tier.key_lock(mkey)
        try:
            with key_lock:
                if (hit := self._memory.get(mkey)) is not None:
                    self._c["memory_hits"] += 1  # built by the thread this one waited for
                    return hit.program
                ident, name = self._registry.device(dev, self._device_identity)
                # a failure leaving the block marks the span (status ERROR, error.type)
                with tel.TEL.span(tel.SPAN_GET_PROGRAM, {tel.ATTR_DEVICE: name}) as span:
                    raw = src_code.encode()  # a lone surrogate: refused, pyopencl could not pass it
                    key = compute_key(raw, opts, ident)
                    span.set(tel.ATTR_KEY, key)
                    req = _Request(ctx, src_code, dev, opts, key, ident, len(raw), name)
                    prg, result = self._resolve(req)
                    span.set(tel.ATTR_RESULT, result)
                tel.LOOKUPS.add(1, result)
                self._tier.remember(mkey, ctx, MemoryEntry(prg, req.key))
        finally:
            self._tier.unlock(mkey, key_lock)
        return prg

    # the order ----------------------------------------------------------------------------------
    def _resolve(self, req: _Request) -> tuple[cl.Program, str]:
        """(program, result) through the disk, remote and compile tiers."""
        store = self.open_store() if self.enabled else None
        if store is None:
            prg, _, result = self._beyond_disk(req)
            return prg, result
        prg, damaged = self._load(store, req)
        if prg is not None:
            return prg, "disk"
        with store.lock(req.key, self._lock_timeout) as locked:
            if locked == "timeout":
                self._c["lock_timeouts"] += 1
            if locked == "held":
                # whoever held the lock may have just written this entry (or repaired it)
                prg, again = self._load(store, req, report=not damaged)
                if prg is not None:
                    return prg, "disk"
                damaged = damaged or again
            prg, binary, result = self._beyond_disk(req)
            if binary:  # compiled, or a remote hit: written to the local tier either way
                self._save(store, req, binary)
        if damaged:
            self._c["recoveries"] += 1
            return prg, "recovered" if result == "compiled" else result
        return prg, result

    def _beyond_disk(self, req: _Request) -> tuple[cl.Program, bytes, str]:
        """(program, binary, "remote") from the remote tier, else (.., "compiled")."""
        if (tier := self.remote) is None:
            return (*self._compile(req), "compiled")
        s = _Session(tier, self._c)
        prg, binary = self._fetch(s, req)
        if prg is not None:
            return prg, binary, "remote"
        lease: Lease | None = s.call(tier.lock, req.key, self._lock_timeout)
        try:
            if lease is not None and lease.waited:
                self._c["remote_waits"] += 1
                if lease.token is None:
                    self._c["remote_lock_timeouts"] += 1
                    log.warning(
                        "cache_remote_lock_timeout",
                        url=tier.url,
                        key=req.key,
                        timeout_s=self._lock_timeout,
                    )
                else:  # the holder is done: its value may be there now
                    prg, binary = self._fetch(s, req)
                    if prg is not None:
                        return prg, binary, "remote"
            prg, binary = self._compile(req)
            meta = entry_meta(req.dev, req.ident, req.opts, req.src_len)
            if binary and s.call(tier.put, req.key, binary, meta):
                self._c["remote_writes"] += 1
        finally:  # also after a build error: a waiter then takes the lock and sees it itself
            if lease is not None and lease.token is not None:
                s.call(tier.unlock, lease, release=True)
        return prg, binary, "compiled"

    def _compile(self, req: _Request) -> tuple[cl.Program, bytes]:
        self._c["compiles"] += 1
        out = compile_program(req.ctx, req.src, req.dev, req.opts, req.key, req.name)
        self._c["misses"] += 1  # found in no tier: a build that failed is no miss
        return out

    # remote tier --------------------------------------------------------------------------------
    @functools.cached_property
    def remote(self) -> RemoteTier | None:
        """The remote tier, set up on the first miss (redis is imported only then, if at all)."""
        tier = _remote.tier_for(*self._remote_args)
        return tier if isinstance(tier, RemoteTier) else None

    def _fetch(self, s: _Session, req: _Request) -> tuple[cl.Program | None, bytes]:
        if (data := s.call(s.tier.get, req.key)) is None:
            return None, b""
        prg, binary, why = req.load(lambda: s.tier.decode(req.key, req.ident, data))
        if prg is not None:
            self._c["remote_hits"] += 1
            return prg, bytes(binary)
        if not s.reported:
            s.reported = True
            self._c["remote_rejected"] += 1
            tel.REMOTE_REJECTED.add(1, why.split(":", 1)[0])
            log.warning("cache_remote_rejected", url=s.tier.url, key=req.key, reason=why)
        return None, b""

    # disk tier ----------------------------------------------------------------------------------
    def open_store(self) -> DiskStore | None:
        """The disk tier, opened on first use; None when its folder cannot be used."""
        if self._store_opened:
            return self._store
        root = self.cache_dir
        # A folder found trusted stays trusted for this process (only this user or root could
        # change that): a fresh instance then skips the three stat calls.
        if (store := self._registry.stores.get(root)) is None:
            try:
                why = refusal(root, create=True)  # its folders made (0700) when missing
            except OSError as exc:
                _folder_warning(
                    root, "cache_dir_unusable", f"cannot be used ({exc})", error=str(exc)
                )
            else:
                if why is None:
                    store = self._registry.stores[root] = DiskStore(root)
                else:
                    _folder_warning(root, "cache_dir_untrusted", f"is not used ({why})", reason=why)
        self._store, self._store_opened = store, True
        return store

    def _load(
        self, store: DiskStore, req: _Request, report: bool = True
    ) -> tuple[cl.Program | None, str]:
        """(program, "") on a hit, (None, "") when absent, (None, why) when damaged."""
        try:
            found = store.read(req.key)  # a FIFO, link, folder or huge file: EntryError, no wait
        except EntryError as exc:
            why = str(exc)
        except OSError as exc:
            why = f"unreadable: {exc}"
        else:
            if found is None:
                return None, ""
            data, mtime = found
            prg, _, why = req.load(lambda: decode(data, req.key, ident=req.ident)[1])
            if prg is not None:
                store.touch(req.key, mtime)
                self._c["disk_hits"] += 1
                self._c["bytes_read"] += len(data)
                return prg, ""
        if report:
            self._c["corrupt"] += 1
            log.warning(
                "cache_entry_corrupt", path=str(store.path(req.key)), key=req.key, reason=why
            )
            tel.RECOVERIES.add(1, why.split(":", 1)[0])
        return None, why

    def _save(self, store: DiskStore, req: _Request, binary: bytes) -> None:
        data = encode(req.key, binary, entry_meta(req.dev, req.ident, req.opts, req.src_len))
        try:
            store.write(req.key, data)
        except OSError as exc:
            self._c["write_errors"] += 1
            logger = log.bind(key=req.key)
            fields = {"path": str(store.path(req.key)), "errno": exc.errno, "error": str(exc)}
            if isinstance(exc, FileNotFoundError):  # folder removed meanwhile: check it again
                logger.warning("cache_write_failed", **fields)
                self._registry.stores.pop(store.root, None)
                self._store, self._store_opened = None, False
            else:  # read-only, full, not allowed
                why = f"cannot be written ({exc.strerror or exc})"
                _folder_warning(store.root, "cache_write_failed", why, logger, **fields)
            return
        self._c["bytes_written"] += len(data)
        max_bytes = self.max_bytes
        try:
            removed = store.evict(max_bytes, keep=req.key)
        except OSError as exc:
            log.warning("cache_evict_failed", path=str(store.programs), error=str(exc))
            return
        if removed:
            self._c["evictions"] += len(removed)
            log.info(
                "cache_evicted",
                entries=len(removed),
                bytes=sum(f.size for f in removed),
                max_bytes=max_bytes,
            )

    # maintenance --------------------------------------------------------------------------------
    def entries(self) -> list[EntryFile]:
        """The entry files on disk, least recently used first (empty when the tier is off)."""
        store = self.open_store()
        return store.entries() if store is not None else []

    def clear(self, *, memory: bool = True, disk: bool = True) -> int:
        """Forget the in-process programs and/or delete the disk entries and the temporary files
        of writers that are gone; the number of files removed."""
        if memory:
            self._tier.clear()
        store = self.open_store() if disk else None
        return store.clear() if store is not None else 0

    def prune(self, max_bytes: int | None = None) -> dict[str, int]:
        """Delete what is not a valid entry and the temporary files of writers that are gone,
        then evict down to ``max_bytes`` (default: the cap); counts by kind."""
        if (store := self.open_store()) is None:
            return {"damaged": 0, "temp": 0, "evicted": 0}
        return store.prune(self.max_bytes if max_bytes is None else max_bytes)

    def flush_stats(self) -> None:
        """Add this instance's counters since the last flush to the folder's ``stats.json``
        (done at exit; ``netcl cache stats`` shows the totals)."""
        store, flushed = self._store, self._flushed
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
        where = self._dir_arg or "default"
        return f"ProgramCache(cache_dir={where!s}, in_memory={len(self._memory)})"


_LIVE: weakref.WeakSet[ProgramCache] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    for cache in list(_LIVE):
        cache.flush_stats()


def _check_args(ctx: Any, src_code: Any, device: Any, registry: _Registry) -> cl.Device:
    if not isinstance(ctx, cl.Context):
        raise TypeError(f"get_program: ctx must be a pyopencl.Context, got {ctx!r}")
    if not isinstance(src_code, str):
        raise TypeError(
            f"get_program: src_code must be a str of OpenCL C, got {type(src_code).__name__}"
        )
    if not src_code or src_code.isspace():  # not strip(): a copy of the source
        raise ValueError("get_program: src_code is empty")
    devices = registry.devices_of(ctx)
    if device is None:
        if len(devices) != 1:
            raise ValueError(
                f"get_program: ctx has {len(devices)} devices "
                f"({', '.join(d.name for d in devices)}); pass device="
            )
        return devices[0]
    if not isinstance(device, cl.Device):
        raise TypeError(f"get_program: device must be a pyopencl.Device, got {device!r}")
    if device not in devices:
        raise ValueError(
            f"get_program: device {device.name!r} is not in ctx, whose devices are "
            f"{[d.name for d in devices]}"
        )
    return device


def _folder_warning(
    root: Path, event: str, what: str, logger: LazyLogger = log, **fields: Any
) -> None:
    """Log ``event`` and, seen without any logging set up, a Python warning: once per folder,
    event and process."""
    if warn_once(logger, (event, str(root)), event, **{"path": str(root), **fields}):
        warnings.warn(
            f"netcl cache: the cache folder {root} {what}; programs compiled now are not kept "
            "on disk. Set NETCL_CACHE_DIR to a folder of your own that you can write (it is "
            "created, private to you, when missing).",
            RuntimeWarning,
            stacklevel=4,
        )


def normalize_options(options: str | Sequence[str] | None) -> str:
    """Build options as the one string handed to the driver (a sequence is joined by spaces)."""
    if options is None:
        return ""
    if isinstance(options, str):
        return options
    if isinstance(options, (bytes, bytearray)) or not all(isinstance(o, str) for o in options):
        raise TypeError(f"get_program: options must be a str or a sequence of str, got {options!r}")
    return " ".join(options)
