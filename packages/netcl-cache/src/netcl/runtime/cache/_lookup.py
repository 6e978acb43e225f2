"""The lookup below the in-process tier: disk, then remote, then compile. It owns the order, the
locks that make one process (and one machine of a fleet) compile a missing program while the
others wait for it, the write-back to the faster tiers and the counters; tiers get, lock, put."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyopencl as cl

from netcl.core.log import LazyLogger, get_logger, warn_once
from netcl.runtime.cache import _remote
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._build import compile_program, entry_meta, from_binary
from netcl.runtime.cache._config import Settings
from netcl.runtime.cache._entry import EntryError, decode, encode
from netcl.runtime.cache._key import compute_key
from netcl.runtime.cache._remote import Lease, RemoteError, RemoteTier
from netcl.runtime.cache._store import Counters, DiskStore, UntrustedFolderError, new_counters

__all__ = ["REGISTRY", "Lookup"]

log = get_logger("netcl.runtime.cache")


class _Registry:
    """What caches of one process share: folders found trusted and device identities and names
    (slow driver queries); README: ``ProgramCache(registry=...)``."""

    def __init__(self) -> None:
        self.stores: dict[Path, DiskStore] = {}
        self.devices: dict[tuple[cl.Device, Callable[[cl.Device], str]], tuple[str, str]] = {}

    def device(self, dev: cl.Device, identity: Callable[[cl.Device], str]) -> tuple[str, str]:
        """(identity, name) of ``dev``."""
        found = self.devices.get((dev, identity))
        if found is None:
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

    __slots__ = ("c", "ok", "reachable", "reported", "tier")

    def __init__(self, tier: RemoteTier, counters: Counters) -> None:
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


class Lookup:
    """Finds or builds the program of one ``get_program`` that missed in memory."""

    def __init__(
        self,
        settings: Settings,
        device_identity: Callable[[cl.Device], str],
        registry: _Registry,
        remote_args: tuple[str | None, str | bytes | None],
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.c: Counters = new_counters()
        self._device_identity = device_identity
        self._store: DiskStore | None = None
        self._store_state = "unopened"  # unopened | open | unusable
        self._remote_args = remote_args

    def run(self, ctx: cl.Context, src: str, dev: cl.Device, opts: str) -> tuple[cl.Program, str]:
        """(program, key) of a program not in memory; the ``get_program`` span."""
        ident, name = self.registry.device(dev, self._device_identity)
        # a failure leaving the block marks the span (status ERROR, error.type)
        with tel.TEL.span(tel.SPAN_GET_PROGRAM, {tel.ATTR_DEVICE: name}) as span:
            raw = src.encode("utf-8", "surrogateescape")
            req = _Request(ctx, src, dev, opts, compute_key(raw, opts, ident), ident, len(raw),
                           name)  # fmt: skip
            span.set(tel.ATTR_KEY, req.key)
            prg, result = self._resolve(req)
            span.set(tel.ATTR_RESULT, result)
        tel.LOOKUPS.add(1, result)
        return prg, req.key

    # the order ----------------------------------------------------------------------------------

    def _resolve(self, req: _Request) -> tuple[cl.Program, str]:
        """(program, result) through the disk, remote and compile tiers."""
        store = self.open_store() if self.settings.enabled else None
        if store is None:
            prg, _, result = self._beyond_disk(req)
            return prg, result
        prg, damaged = self._load(store, req)
        if prg is not None:
            return prg, "disk"
        with store.lock(req.key, self.settings.lock_timeout) as locked:
            if locked == "timeout":
                self.c["lock_timeouts"] += 1
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
            self.c["recoveries"] += 1
            return prg, "recovered" if result == "compiled" else result
        return prg, result

    def _beyond_disk(self, req: _Request) -> tuple[cl.Program, bytes, str]:
        """(program, binary, "remote") from the remote tier, else (.., "compiled")."""
        tier = self.remote
        if tier is None:
            return (*self._compile(req), "compiled")
        s = _Session(tier, self.c)
        prg, binary = self._fetch(s, req)
        if prg is not None:
            return prg, binary, "remote"
        lease: Lease | None = s.call(tier.lock, req.key, self.settings.lock_timeout)
        try:
            if lease is not None and lease.waited:
                self.c["remote_waits"] += 1
                if lease.token is None:
                    self.c["remote_lock_timeouts"] += 1
                    log.warning("cache_remote_lock_timeout", url=tier.url, key=req.key,
                                timeout_s=self.settings.lock_timeout)  # fmt: skip
                else:  # the holder is done: its value may be there now
                    prg, binary = self._fetch(s, req)
                    if prg is not None:
                        return prg, binary, "remote"
            prg, binary = self._compile(req)
            meta = entry_meta(req.dev, req.ident, req.opts, req.src_len)
            if binary and s.call(tier.put, req.key, binary, meta):
                self.c["remote_writes"] += 1
        finally:  # also after a build error: a waiter then takes the lock and sees it itself
            if lease is not None and lease.token is not None:
                s.call(tier.unlock, lease, release=True)
        return prg, binary, "compiled"

    def _compile(self, req: _Request) -> tuple[cl.Program, bytes]:
        self.c["compiles"] += 1
        out = compile_program(req.ctx, req.src, req.dev, req.opts, req.key, req.name)
        self.c["misses"] += 1  # found in no tier: a build that failed is no miss
        return out

    # remote tier --------------------------------------------------------------------------------

    @functools.cached_property
    def remote(self) -> RemoteTier | None:
        """The remote tier, set up on the first miss (redis is imported only then, if at all)."""
        return _remote.tier_for(*self._remote_args)

    def _fetch(self, s: _Session, req: _Request) -> tuple[cl.Program | None, bytes]:
        data = s.call(s.tier.get, req.key)
        if data is None:
            return None, b""
        prg, binary, why = req.load(lambda: s.tier.decode(req.key, req.ident, data))
        if prg is not None:
            self.c["remote_hits"] += 1
            return prg, bytes(binary)
        if not s.reported:
            s.reported = True
            self.c["remote_rejected"] += 1
            tel.REMOTE_REJECTED.add(1, why.split(":", 1)[0])
            log.warning("cache_remote_rejected", url=s.tier.url, key=req.key, reason=why)
        return None, b""

    # disk tier ----------------------------------------------------------------------------------

    @property
    def store(self) -> DiskStore | None:
        """The disk tier when it was opened and found usable, without opening it."""
        return self._store if self._store_state == "open" else None

    def open_store(self) -> DiskStore | None:
        if self._store_state != "unopened":
            return self._store
        root = self.settings.cache_dir
        try:
            # A folder found trusted stays trusted for this process (only this user or root
            # could change that): a fresh instance then skips the three stat calls.
            store = self.registry.stores.get(root)
            if store is None:
                store = self.registry.stores[root] = DiskStore.open(root)
        except UntrustedFolderError as exc:
            _folder_warning(root, "cache_dir_untrusted", f"is not used ({exc})", reason=str(exc))
        except OSError as exc:
            _folder_warning(root, "cache_dir_unusable", f"cannot be used ({exc})", error=str(exc))
        else:
            self._store, self._store_state = store, "open"
            return store
        # not the store of an earlier open, which _save gave up on when its folder vanished
        self._store, self._store_state = None, "unusable"
        return None

    def _load(
        self, store: DiskStore, req: _Request, report: bool = True
    ) -> tuple[cl.Program | None, str]:
        """(program, "") on a hit, (None, "") when absent, (None, why) when damaged."""
        try:
            data = store.read(req.key)  # a FIFO, link, folder or huge file: EntryError, no wait
        except EntryError as exc:
            why = str(exc)
        except OSError as exc:
            why = f"unreadable: {exc}"
        else:
            if data is None:
                return None, ""
            prg, _, why = req.load(lambda: decode(data, req.key, ident=req.ident)[1])
            if prg is not None:
                store.touch(req.key)
                self.c["disk_hits"] += 1
                self.c["bytes_read"] += len(data)
                return prg, ""
        if report:
            self.c["corrupt"] += 1
            log.warning("cache_entry_corrupt", path=str(store.path(req.key)), key=req.key,
                        reason=why)  # fmt: skip
            tel.RECOVERIES.add(1, why.split(":", 1)[0])
        return None, why

    def _save(self, store: DiskStore, req: _Request, binary: bytes) -> None:
        data = encode(req.key, binary, entry_meta(req.dev, req.ident, req.opts, req.src_len))
        try:
            store.write(req.key, data)
        except OSError as exc:
            self.c["write_errors"] += 1
            logger = log.bind(key=req.key)
            if isinstance(exc, FileNotFoundError):  # folder removed meanwhile: check it again
                logger.warning("cache_write_failed", path=str(store.path(req.key)),
                               errno=exc.errno, error=str(exc))  # fmt: skip
                self.registry.stores.pop(store.root, None)
                self._store_state = "unopened"
            else:  # read-only, full, not allowed
                _folder_warning(store.root, "cache_write_failed",
                                f"cannot be written ({exc.strerror or exc})", logger,
                                path=str(store.path(req.key)), errno=exc.errno, error=str(exc))
            return
        self.c["bytes_written"] += len(data)
        max_bytes = self.settings.max_bytes
        try:
            removed = store.evict(max_bytes, keep=req.key)
        except OSError as exc:
            log.warning("cache_evict_failed", path=str(store.programs), error=str(exc))
            return
        if removed:
            self.c["evictions"] += len(removed)
            log.info("cache_evicted", entries=len(removed), bytes=sum(f.size for f in removed),
                     max_bytes=max_bytes)  # fmt: skip


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
            RuntimeWarning, stacklevel=4,
        )
