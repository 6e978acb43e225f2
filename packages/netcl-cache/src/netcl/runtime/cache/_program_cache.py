"""ProgramCache: in-process tier -> disk tier -> compile."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pyopencl as cl

from netcl.core import device as core_device
from netcl.core import paths, telemetry
from netcl.core.log import get_logger
from netcl.runtime.cache import _remote
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._entry import EntryError, decode, encode
from netcl.runtime.cache._errors import ProgramBuildError
from netcl.runtime.cache._key import compute_key, normalize_options
from netcl.runtime.cache._stats import CacheStats
from netcl.runtime.cache._store import DiskStore, EntryFile

__all__ = ["DEFAULT_MAX_BYTES", "ProgramCache", "parse_size"]

log = get_logger("netcl.runtime.cache")

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_LOCK_TIMEOUT_S = 60.0
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

try:
    _VERSION = version("netcl-cache")
except PackageNotFoundError:
    _VERSION = "0.0.0"

_tracing = telemetry.tracing
_NAMES: dict[cl.Device, str] = {}
_IDENTITIES: dict[tuple[cl.Device, Any], str] = {}
_STORES: dict[Path, DiskStore] = {}
_LOOKUPS = tel.LOOKUPS
_COUNTER_NAMES = tuple(f.name for f in fields(CacheStats))


def _build(prg: Any, options: bytes, dev: cl.Device) -> None:
    # The raw clBuildProgram: pyopencl's `build` wrapper also fetches every device's build log
    # after a success (to warn about compiler output), ~0.1 ms a disk hit does not need.
    raw = getattr(prg, "_build", None)
    if raw is not None:
        raw(options=options, devices=[dev])
    else:
        prg.build(options, [dev])


def _from_binary(ctx: cl.Context, dev: cl.Device, opts: str, binary: Any) -> cl.Program:
    """A built program of a (checked) binary; ``cl.Error`` when the driver rejects it."""
    prg = cl._cl._Program(ctx, [dev], [binary])
    _build(prg, opts.encode("utf-8", "surrogateescape"), dev)
    return cl.Program(prg)


def _memory_hit_span(key: str, device_name: str) -> None:
    # an in-process hit has nothing to time: the span only records that it happened
    with tel.tracer.start_as_current_span(
        "netcl.cache.get_program",
        attributes={
            "netcl.cache.result": "memory",
            "netcl.cache.key": key,
            "netcl.device.name": device_name,
        },
    ):
        pass


def _entry_meta(dev: cl.Device, ident: str, opts: str, src_len: int) -> dict[str, Any]:
    return {
        "device": dev.name,
        "identity": ident,
        "options": opts,
        "source_bytes": src_len,
        "created": time.time(),
        "writer": f"netcl-cache {_VERSION}",
    }


def parse_size(text: str, what: str) -> int:
    """``"500M"``, ``"2G"``, ``"1048576"`` -> bytes (binary units); ValueError naming ``what``."""
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = s[-1:] if s[-1:] in _UNITS and not s[-1:].isdigit() else ""
    number = s[: len(s) - len(unit)].strip()
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not number or value < 0 or value != value:
        raise ValueError(
            f"{what}: expected a byte count such as 1073741824, 500M or 2G, got {text!r}"
        )
    return int(value)


class ProgramCache:
    """Compiled OpenCL programs, cached in this process and on disk.

    ``cache_dir=None`` means ``NETCL_CACHE_DIR`` or the platform cache folder
    (``~/.cache/netcl``), resolved on first use; nothing touches the disk before that.
    ``max_bytes`` caps the disk tier (default ``NETCL_CACHE_MAX_BYTES`` or 1 GiB; least recently
    used entries go first). ``lock_timeout`` bounds the wait for another process compiling the
    same program, after which this one compiles too. ``NETCL_CACHE_DISABLE=1`` turns the disk
    tier off. ``remote`` is a ``redis://`` or ``rediss://`` URL of a shared remote tier (default
    ``NETCL_CACHE_REMOTE``; ``""`` turns it off) and ``remote_key`` the secret that signs its
    values (default ``NETCL_CACHE_REMOTE_KEY``); a remote without a key is not used.
    """

    #: The error :meth:`get_program` raises when the compiler rejects a program.
    BuildError = ProgramBuildError

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int | None = None,
        lock_timeout: float | None = None,
        remote: str | None = None,
        remote_key: str | bytes | None = None,
    ) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"ProgramCache: max_bytes must be an int >= 0, got {max_bytes!r}")
        if lock_timeout is not None and not lock_timeout >= 0:
            raise ValueError(
                f"ProgramCache: lock_timeout must be a number of seconds >= 0, "
                f"got {lock_timeout!r}"
            )
        self._dir_arg = None if cache_dir is None else Path(cache_dir).expanduser()
        self._max_bytes_arg = max_bytes
        self._lock_timeout = DEFAULT_LOCK_TIMEOUT_S if lock_timeout is None else lock_timeout
        # (ctx, device, source, options) -> (program, key, device name). Keyed on the caller's
        # own objects: a hit hashes a tuple whose source string caches its hash, no sha256.
        self._memory: dict[tuple[Any, ...], tuple[cl.Program, str, str]] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._store: DiskStore | None = None
        self._store_state = "unopened"  # unopened | open | unusable
        _remote.check_args(remote, remote_key)
        # remote tier: configured on the first miss (redis is imported only then, if at all)
        self._remote_args = (remote, remote_key)
        self._remote: _remote.RemoteTier | None = None
        self._remote_resolved = False
        self._c = dict.fromkeys(_COUNTER_NAMES, 0)
        self._flushed = dict.fromkeys(_COUNTER_NAMES, 0)
        # counters go to stats.json at exit (ccache-style totals for `netcl cache stats`)
        _INSTANCES.add(self)

    # configuration ------------------------------------------------------------------------------

    @property
    def cache_dir(self) -> Path:
        """The folder of the disk tier (resolved now when it was left to the default)."""
        return self._dir_arg if self._dir_arg is not None else paths.default_cache_dir()

    @property
    def max_bytes(self) -> int:
        """The size cap of the disk tier in bytes."""
        if self._max_bytes_arg is not None:
            return self._max_bytes_arg
        env = os.environ.get("NETCL_CACHE_MAX_BYTES")
        return parse_size(env, "NETCL_CACHE_MAX_BYTES") if env else DEFAULT_MAX_BYTES

    @property
    def enabled(self) -> bool:
        """Whether the disk tier is on (``NETCL_CACHE_DISABLE`` unset or 0/false/no/off)."""
        flag = os.environ.get("NETCL_CACHE_DISABLE", "").strip().lower()
        return flag in ("", "0", "false", "no", "off")

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
        """A built ``cl.Program`` of ``src_code`` for ``device`` in ``ctx``.

        Looked up in this process first, then on disk (a binary is loaded, not compiled), else
        compiled from source and stored. ``device`` may be left out when ``ctx`` has one device.
        ``options`` are the build options (a string or a list of strings); headers reached
        through their ``-I`` folders are part of the key. Raises ``ProgramCache.BuildError`` with
        the build log when the compiler rejects the source.
        """
        mkey = (ctx, device, src_code, options)
        try:
            hit = self._memory.get(mkey)
        except TypeError:  # unhashable: options given as a list (key on a tuple of it), or a
            if not isinstance(options, list):  # bad argument: raise the error that names it
                self._check_args(ctx, src_code, device)
                normalize_options(options)
                raise
            return self.get_program(ctx, src_code, device, tuple(options))
        if hit is not None:
            self._c["memory_hits"] += 1
            _LOOKUPS["memory"] += 1
            if _tracing():
                _memory_hit_span(hit[1], hit[2])
            return hit[0]
        return self._get_slow(mkey, ctx, src_code, device, options)

    def _get_slow(
        self,
        mkey: tuple[Any, ...],
        ctx: cl.Context,
        src_code: str,
        device: cl.Device | None,
        options: str | Sequence[str] | None,
    ) -> cl.Program:
        dev = self._check_args(ctx, src_code, device)
        opts = normalize_options(options)
        with self._lock:
            key_lock = self._key_locks.setdefault(mkey, threading.Lock())
        try:
            with key_lock:  # threads wanting the same program: one builds, the others take it
                hit = self._memory.get(mkey)
                if hit is not None:  # built by the thread this one waited for
                    self._c["memory_hits"] += 1
                    _LOOKUPS["memory"] += 1
                    if _tracing():
                        _memory_hit_span(hit[1], hit[2])
                    return hit[0]
                if _tracing():
                    with tel.tracer.start_as_current_span("netcl.cache.get_program") as span:
                        span.set_attribute("netcl.device.name", self._name(dev))
                        prg, key, result = self._resolve(ctx, src_code, dev, opts)
                        span.set_attribute("netcl.cache.key", key)
                        span.set_attribute("netcl.cache.result", result)
                else:
                    prg, key, result = self._resolve(ctx, src_code, dev, opts)
                self._memory[mkey] = (prg, key, self._name(dev))
        finally:  # also after a failed build (never cached): no lock stays behind per source
            with self._lock:
                if self._key_locks.get(mkey) is key_lock:  # not a newer one of a later caller
                    del self._key_locks[mkey]
        _LOOKUPS[result] += 1
        return prg

    def _check_args(self, ctx: Any, src_code: Any, device: Any) -> cl.Device:
        if not isinstance(ctx, cl.Context):
            raise TypeError(f"get_program: ctx must be a pyopencl.Context, got {ctx!r}")
        if not isinstance(src_code, str):
            raise TypeError(
                f"get_program: src_code must be a str of OpenCL C, got {type(src_code).__name__}"
            )
        if not src_code.strip():
            raise ValueError("get_program: src_code is empty")
        devices = ctx.devices
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

    def _identity(self, dev: cl.Device) -> str:
        # a few slow driver queries (~0.1 ms on PoCL): once per device and process. Keyed on
        # the function too, so a replaced device_identity (a test faking a driver) is honoured.
        fn = core_device.device_identity
        ident = _IDENTITIES.get((dev, fn))
        if ident is None:
            ident = _IDENTITIES[(dev, fn)] = fn(dev)
        return ident

    def _name(self, dev: cl.Device) -> str:
        name = _NAMES.get(dev)
        if name is None:
            name = _NAMES[dev] = dev.name
        return name

    def _resolve(
        self, ctx: cl.Context, src_code: str, dev: cl.Device, opts: str
    ) -> tuple[cl.Program, str, str]:
        """(program, key, result) through the disk tier and the compiler."""
        ident = self._identity(dev)
        src = src_code.encode("utf-8", "surrogateescape")
        key = compute_key(src, opts, ident)
        store = self._open_store() if self.enabled else None
        if store is None:
            prg, _, result = self._fetch_or_compile(ctx, src_code, dev, opts, key, ident, len(src))
            return prg, key, result
        prg, damaged = self._load(store, key, ctx, dev, opts)
        if prg is not None:
            return prg, key, "disk"
        with store.lock(key, self._lock_timeout) as locked:
            if locked == "timeout":
                self._c["lock_timeouts"] += 1
            if locked == "held":
                # whoever held the lock may have just written this entry (or repaired it)
                prg, again = self._load(store, key, ctx, dev, opts, report=damaged is None)
                if prg is not None:
                    return prg, key, "disk"
                damaged = damaged or again
            prg, binary, result = self._fetch_or_compile(
                ctx, src_code, dev, opts, key, ident, len(src)
            )
            if result == "compiled":
                self._c["misses"] += 1
            if binary:  # compiled, or a remote hit: written to the local tier either way
                self._save(store, key, binary, ident, dev, opts, len(src))
        if damaged is not None:
            self._c["recoveries"] += 1
            return prg, key, "recovered" if result == "compiled" else result
        return prg, key, result

    # remote tier --------------------------------------------------------------------------------

    def _remote_tier(self) -> _remote.RemoteTier | None:
        if not self._remote_resolved:
            self._remote = _remote.tier_for(*self._remote_args)
            self._remote_resolved = True
        return self._remote

    def _fetch_or_compile(
        self, ctx: cl.Context, src_code: str, dev: cl.Device, opts: str, key: str, ident: str,
        src_len: int,
    ) -> tuple[cl.Program, bytes, str]:
        """(program, binary, "remote") from the remote tier, else (.., "compiled") built here
        and published to the remote (when one is configured)."""
        remote = self._remote_tier()
        if remote is None:
            return (*self._compile(ctx, src_code, dev, opts, key), "compiled")
        prg, binary, fetched = remote.resolve(
            self._c, key, ident, _entry_meta(dev, ident, opts, src_len),
            lambda b: _from_binary(ctx, dev, opts, b),
            lambda: self._compile(ctx, src_code, dev, opts, key),
            self._lock_timeout,
        )
        return prg, binary, "remote" if fetched else "compiled"

    def _open_store(self) -> DiskStore | None:
        if self._store_state == "open":
            return self._store
        if self._store_state == "unusable":
            return None
        root = self.cache_dir
        try:
            # A folder found trusted stays trusted for this process (only this user or root
            # could change that): a fresh instance then skips the three stat calls.
            store = _STORES.get(root)
            if store is None:
                store = _STORES[root] = DiskStore.open(root)
        except PermissionError as exc:
            log.warning("cache_dir_untrusted", path=str(root), reason=str(exc))
        except OSError as exc:
            log.warning("cache_dir_unusable", path=str(root), error=str(exc))
        else:
            self._store = store
            self._store_state = "open"
            return store
        # not the store of an earlier open, which _save gave up on when its folder vanished
        self._store = None
        self._store_state = "unusable"
        return None

    def _load(
        self,
        store: DiskStore,
        key: str,
        ctx: cl.Context,
        dev: cl.Device,
        opts: str,
        report: bool = True,
    ) -> tuple[cl.Program | None, str | None]:
        """(program, None) on a hit, (None, None) when absent, (None, reason) when damaged."""
        try:
            data = store.read(key)
        except OSError as exc:
            reason = f"unreadable: {exc}"
        else:
            if data is None:
                return None, None
            try:
                binary = decode(data, key)
                prg = cl._cl._Program(ctx, [dev], [binary])
                _build(prg, opts.encode("utf-8", "surrogateescape"), dev)
            except EntryError as exc:
                reason = str(exc)
            except cl.Error as exc:
                reason = f"rejected by the driver: {exc}"
            else:
                store.touch(key)
                self._c["disk_hits"] += 1
                self._c["bytes_read"] += len(data)
                return cl.Program(prg), None
        if report:
            self._c["corrupt"] += 1
            short = reason.split(":", 1)[0]
            log.warning(
                "cache_entry_corrupt", path=str(store.path(key)), key=key, reason=reason
            )
            tel.recoveries.add(1, {"netcl.cache.reason": short})
        return None, reason

    def _compile(
        self, ctx: cl.Context, src_code: str, dev: cl.Device, opts: str, key: str
    ) -> tuple[cl.Program, bytes]:
        """Build from source for ``dev``: (program, its binary, b'' when the driver has none)."""
        self._c["compiles"] += 1
        t0 = time.perf_counter()
        cm: AbstractContextManager[Any] = (
            tel.tracer.start_as_current_span(
                "netcl.cache.compile",
                attributes={"netcl.compile.options": opts, "netcl.cache.key": key},
            )
            if _tracing()
            else contextlib.nullcontext()
        )
        try:
            with cm as span:
                prg = cl._cl._Program(ctx, src_code)
                try:
                    _build(prg, opts.encode("utf-8", "surrogateescape"), dev)
                except cl.Error as exc:
                    try:
                        build_log = str(prg.get_build_info(dev, cl.program_build_info.LOG))
                    except cl.Error:
                        build_log = ""
                    err = ProgramBuildError(
                        device_name=dev.name, options=opts, log=build_log or str(exc),
                        code=getattr(exc, "code", None),
                    )
                    if span is not None:
                        span.set_attribute("netcl.compile.log", err.log)
                    raise err from exc
        finally:
            tel.compile_duration.record(
                time.perf_counter() - t0, {"netcl.device.name": dev.name}
            )
        binary = b""
        try:
            devs = prg.get_info(cl.program_info.DEVICES)
            binary = bytes(prg.get_info(cl.program_info.BINARIES)[devs.index(dev)])
        except (cl.Error, ValueError) as exc:  # a driver that gives no binary: not cached
            log.warning("cache_no_binary", device=dev.name, error=str(exc))
        return cl.Program(prg), binary

    def _save(
        self,
        store: DiskStore,
        key: str,
        binary: bytes,
        ident: str,
        dev: cl.Device,
        opts: str,
        src_len: int,
    ) -> None:
        data = encode(key, binary, _entry_meta(dev, ident, opts, src_len))
        try:
            store.write(key, data)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):  # folder removed meanwhile: check it again
                _STORES.pop(store.root, None)
                self._store_state = "unopened"
            self._c["write_errors"] += 1
            log.warning(
                "cache_write_failed", path=str(store.path(key)), key=key,
                errno=exc.errno, error=str(exc),
            )
            return
        self._c["bytes_written"] += len(data)
        try:
            removed = store.evict(self.max_bytes, keep=key)
        except OSError as exc:
            log.warning("cache_evict_failed", path=str(store.programs), error=str(exc))
            return
        if removed:
            self._c["evictions"] += len(removed)
            log.info(
                "cache_evicted", entries=len(removed), bytes=sum(f.size for f in removed),
                max_bytes=self.max_bytes,
            )

    # maintenance --------------------------------------------------------------------------------

    def entries(self) -> list[EntryFile]:
        """The entry files on disk, least recently used first (empty when the tier is off)."""
        store = self._open_store()
        return store.entries() if store is not None else []

    def clear(self, *, memory: bool = True, disk: bool = True) -> int:
        """Forget the in-process programs and/or delete the disk entries; returns files removed."""
        if memory:
            self._memory.clear()
        removed = 0
        if disk:
            store = self._open_store()
            if store is not None:
                for f in store.entries():
                    removed += store.remove(f.path)
                for p, _ in store.temp_files():
                    removed += store.remove(p)
        return removed

    def prune(self, max_bytes: int | None = None) -> dict[str, int]:
        """Delete damaged entries and stale temporary files, then evict down to ``max_bytes``
        (default: the cap). Returns counts by kind."""
        store = self._open_store()
        out = {"damaged": 0, "temp": 0, "evicted": 0}
        if store is None:
            return out
        for f in store.entries():
            try:
                with open(f.path, "rb") as fh:
                    decode(fh.read(), f.key)
            except FileNotFoundError:
                continue
            except (OSError, EntryError):
                out["damaged"] += store.remove(f.path)
        out["temp"] = store.remove_stale_temps()
        cap = self.max_bytes if max_bytes is None else max_bytes
        out["evicted"] = len(store.evict(cap))
        return out

    def flush_stats(self) -> None:
        """Add this instance's counters since the last flush to the folder's ``stats.json``
        (done at exit; ``netcl cache stats`` shows the totals)."""
        delta = {k: v - self._flushed[k] for k, v in self._c.items() if v != self._flushed[k]}
        if not delta or self._store_state != "open" or self._store is None:
            return
        try:
            self._store.add_counters(delta)
        except Exception as exc:  # never fail an exit over statistics
            log.info("cache_stats_not_saved", path=str(self._store.root), error=str(exc))
            return
        self._flushed.update({k: self._c[k] for k in delta})

    def __repr__(self) -> str:
        where = self._dir_arg if self._dir_arg is not None else "default"
        return f"ProgramCache(cache_dir={where!s}, in_memory={len(self._memory)})"


_INSTANCES: weakref.WeakSet[ProgramCache] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    for cache in list(_INSTANCES):
        cache.flush_stats()
