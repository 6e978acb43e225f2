"""ProgramCache: in-process tier -> disk tier -> compile."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import fields
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
from netcl.runtime.cache.version import __version__

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_PROGRAMS", "ProgramCache", "parse_size"]

log = get_logger("netcl.runtime.cache")

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_PROGRAMS = 1024
DEFAULT_LOCK_TIMEOUT_S = 60.0
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

_tracing = telemetry.tracing
_LOOKUPS = tel.LOOKUPS
_COUNTER_NAMES = tuple(f.name for f in fields(CacheStats))
_ref = weakref.ref


class _Registry:
    """What instances of one process share: folders found trusted (a fresh instance skips the
    three stat calls; only this user or root could make them untrusted) and the device
    identities and names (a few slow driver queries, once per device). Pass your own to
    ``ProgramCache(registry=...)`` to start as a new process would."""

    def __init__(self) -> None:
        self.stores: dict[Path, DiskStore] = {}
        self.identities: dict[tuple[cl.Device, Callable[[cl.Device], str]], str] = {}
        self.names: dict[cl.Device, str] = {}

    def identity(self, dev: cl.Device, fn: Callable[[cl.Device], str]) -> str:
        ident = self.identities.get((dev, fn))
        if ident is None:
            ident = self.identities[(dev, fn)] = fn(dev)
        return ident

    def name(self, dev: cl.Device) -> str:
        name = self.names.get(dev)
        if name is None:
            name = self.names[dev] = dev.name
        return name


_REGISTRY = _Registry()
_WARNED: set[tuple[str, str]] = set()


def _config_warning(variable: str, value: str, error: str, default: object) -> None:
    """One warning per bad value and process; the caller then uses the default."""
    if (variable, value) not in _WARNED:
        _WARNED.add((variable, value))
        log.warning(
            "cache_config_invalid", variable=variable, value=value, error=error,
            using=str(default),
        )


def env_max_bytes() -> int:
    """``NETCL_CACHE_MAX_BYTES`` in bytes (the default when unset); ValueError when invalid."""
    env = os.environ.get("NETCL_CACHE_MAX_BYTES", "").strip()
    return parse_size(env, "NETCL_CACHE_MAX_BYTES") if env else DEFAULT_MAX_BYTES


def env_enabled() -> bool:
    """Whether ``NETCL_CACHE_DISABLE`` leaves the disk tier on; ValueError when invalid."""
    flag = os.environ.get("NETCL_CACHE_DISABLE", "").strip().lower()
    if flag in _OFF:
        return True
    if flag in _ON:
        return False
    raise ValueError(
        f"NETCL_CACHE_DISABLE: expected one of 1/true/yes/on or 0/false/no/off, got {flag!r}"
    )


def _purge_dead(cache_ref: weakref.ref[ProgramCache]) -> None:
    # a context the in-process tier keyed on was collected: its entries go (keys of dead
    # weakrefs never match a lookup again; this frees the programs)
    cache = cache_ref()
    if cache is not None:
        cache._drop_dead_contexts()


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


def _entry_meta(dev: cl.Device, ident: str, opts: str, src_len: int) -> dict[str, Any]:
    return {
        "device": dev.name,
        "identity": ident,
        "options": opts,
        "source_bytes": src_len,
        "created": time.time(),
        "writer": f"netcl-cache {__version__}",
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
    if not number or value < 0 or value != value or value == float("inf"):
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
    tier off. ``max_programs`` bounds the in-process tier (least recently used programs go; it
    holds contexts weakly: a context's programs go with it). ``device_identity`` maps a device to
    the string keyed on disk (default :func:`netcl.core.device.device_identity`). ``remote`` is a
    ``redis://`` or ``rediss://`` URL of a shared remote tier (default ``NETCL_CACHE_REMOTE``;
    ``""`` turns it off) and ``remote_key`` the secret that signs its values (default
    ``NETCL_CACHE_REMOTE_KEY``); a remote without a key is not used.
    """

    #: The error :meth:`get_program` raises when the compiler rejects a program.
    BuildError = ProgramBuildError

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int | None = None,
        lock_timeout: float | None = None,
        max_programs: int = DEFAULT_MAX_PROGRAMS,
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
                f"ProgramCache: lock_timeout must be a number of seconds >= 0, "
                f"got {lock_timeout!r}"
            )
        self._dir_arg = None if cache_dir is None else Path(cache_dir).expanduser()
        self._max_bytes_arg = max_bytes
        self._lock_timeout = DEFAULT_LOCK_TIMEOUT_S if lock_timeout is None else lock_timeout
        # (weakref to ctx, device, source, options) -> [program, key, device name, used], in
        # insertion order. Keyed on the caller's own objects: a hit hashes a tuple whose source
        # string caches its hash, no sha256. The context is held weakly (a weakref without
        # callback is shared, so making one per lookup costs ~0.1 µs). The bound evicts by
        # CLOCK (second chance), an LRU approximation whose hit only sets a flag.
        self._memory: OrderedDict[tuple[Any, ...], list[Any]] = OrderedDict()
        self._max_programs = max_programs
        self._watched: weakref.WeakSet[cl.Context] = weakref.WeakSet()
        self._dead_pending = False
        self._device_identity = (
            device_identity if device_identity is not None else core_device.device_identity
        )
        self._registry = registry if registry is not None else _REGISTRY
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
        """The size cap of the disk tier in bytes (an invalid ``NETCL_CACHE_MAX_BYTES``: one
        warning ``cache_config_invalid``, then the default)."""
        if self._max_bytes_arg is not None:
            return self._max_bytes_arg
        try:
            return env_max_bytes()
        except ValueError as exc:
            env = os.environ.get("NETCL_CACHE_MAX_BYTES", "")
            _config_warning("NETCL_CACHE_MAX_BYTES", env, str(exc), DEFAULT_MAX_BYTES)
            return DEFAULT_MAX_BYTES

    @property
    def enabled(self) -> bool:
        """Whether the disk tier is on (``NETCL_CACHE_DISABLE`` unset or 0/false/no/off; an
        invalid value: one warning, then on)."""
        try:
            return env_enabled()
        except ValueError as exc:
            env = os.environ.get("NETCL_CACHE_DISABLE", "")
            _config_warning("NETCL_CACHE_DISABLE", env, str(exc), "enabled")
            return True

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
        through their ``-I`` folders are part of the key. Raises
        :class:`~netcl.runtime.cache.ProgramBuildError` (alias ``ProgramCache.BuildError``) with
        the build log when the compiler rejects the source; nothing found on disk and no
        configuration error makes it fail.
        """
        try:
            mkey = (_ref(ctx), device, src_code, options)
            hit = self._memory.get(mkey)
        except TypeError:  # unhashable: options given as a list (key on a tuple of it), or a
            if not isinstance(options, list):  # bad argument: raise the error that names it
                self._check_args(ctx, src_code, device)
                normalize_options(options)
                raise
            return self.get_program(ctx, src_code, device, tuple(options))
        if hit is not None:
            # no span: the netcl.cache.lookups counter counts in-process hits (see README)
            self._c["memory_hits"] += 1
            _LOOKUPS["memory"] += 1
            hit[3] = True  # used since the clock hand last passed (move_to_end would rehash)
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
                    return hit[0]
                name = self._registry.name(dev)
                if _tracing():
                    with tel.tracer.start_as_current_span(
                        tel.SPAN_GET_PROGRAM, attributes={tel.ATTR_DEVICE: name}
                    ) as span:
                        try:
                            key, ident, src_len = self._key(src_code, dev, opts)
                            span.set_attribute(tel.ATTR_KEY, key)
                            prg, result = self._resolve(
                                ctx, src_code, dev, opts, key, ident, src_len
                            )
                        except BaseException as exc:
                            span.set_attribute(tel.ATTR_ERROR_TYPE, tel.error_type(exc))
                            raise
                        span.set_attribute(tel.ATTR_RESULT, result)
                else:
                    key, ident, src_len = self._key(src_code, dev, opts)
                    prg, result = self._resolve(ctx, src_code, dev, opts, key, ident, src_len)
                self._remember(mkey, ctx, [prg, key, name, False])
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

    def _remember(self, mkey: tuple[Any, ...], ctx: cl.Context, entry: list[Any]) -> None:
        with self._lock:
            if self._dead_pending:
                self._purge_locked()
            memory = self._memory
            memory[mkey] = entry
            while len(memory) > self._max_programs:
                k, old = memory.popitem(last=False)
                if old[3] and k != mkey:  # used since last passed: a second chance
                    old[3] = False
                    memory[k] = old
            if ctx not in self._watched:
                self._watched.add(ctx)
                weakref.finalize(ctx, _purge_dead, _ref(self))

    def _drop_dead_contexts(self) -> None:
        # runs from the garbage collector, possibly in this very thread while it holds the lock
        # (inside _remember): never block, leave the purge to the next insertion then
        if not self._lock.acquire(blocking=False):
            self._dead_pending = True
            return
        try:
            self._purge_locked()
        finally:
            self._lock.release()

    def _purge_locked(self) -> None:
        self._dead_pending = False
        for k in [k for k in self._memory if k[0]() is None]:
            del self._memory[k]

    def _key(self, src_code: str, dev: cl.Device, opts: str) -> tuple[str, str, int]:
        """(key, device identity, source bytes): what the disk and remote tiers need."""
        # the identity: a few slow driver queries (~0.1 ms on PoCL), once per device and process
        ident = self._registry.identity(dev, self._device_identity)
        src = src_code.encode("utf-8", "surrogateescape")
        return compute_key(src, opts, ident), ident, len(src)

    def _resolve(
        self, ctx: cl.Context, src_code: str, dev: cl.Device, opts: str, key: str, ident: str,
        src_len: int,
    ) -> tuple[cl.Program, str]:
        """(program, result) through the disk, remote and compile tiers."""
        store = self._open_store() if self.enabled else None
        if store is None:
            prg, _, result = self._fetch_or_compile(ctx, src_code, dev, opts, key, ident, src_len)
            return prg, result
        prg, damaged = self._load(store, key, ctx, dev, opts)
        if prg is not None:
            return prg, "disk"
        with store.lock(key, self._lock_timeout) as locked:
            if locked == "timeout":
                self._c["lock_timeouts"] += 1
            if locked == "held":
                # whoever held the lock may have just written this entry (or repaired it)
                prg, again = self._load(store, key, ctx, dev, opts, report=damaged is None)
                if prg is not None:
                    return prg, "disk"
                damaged = damaged or again
            prg, binary, result = self._fetch_or_compile(
                ctx, src_code, dev, opts, key, ident, src_len
            )
            if result == "compiled":
                self._c["misses"] += 1
            if binary:  # compiled, or a remote hit: written to the local tier either way
                self._save(store, key, binary, ident, dev, opts, src_len)
        if damaged is not None:
            self._c["recoveries"] += 1
            return prg, "recovered" if result == "compiled" else result
        return prg, result

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
            stores = self._registry.stores
            store = stores.get(root)
            if store is None:
                store = stores[root] = DiskStore.open(root)
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
            data = store.read(key)  # a FIFO, link, folder or huge file: EntryError, no wait
        except EntryError as exc:
            reason = str(exc)
        except OSError as exc:
            reason = f"unreadable: {exc}"
        else:
            if data is None:
                return None, None
            try:
                prg = _from_binary(ctx, dev, opts, decode(data, key))
            except EntryError as exc:
                reason = str(exc)
            except cl.Error as exc:
                reason = f"rejected by the driver: {exc}"
            else:
                store.touch(key)
                self._c["disk_hits"] += 1
                self._c["bytes_read"] += len(data)
                return prg, None
        if report:
            self._c["corrupt"] += 1
            short = reason.split(":", 1)[0]
            log.warning(
                "cache_entry_corrupt", path=str(store.path(key)), key=key, reason=reason
            )
            tel.recoveries.add(1, {tel.ATTR_REASON: short})
        return None, reason

    def _compile(
        self, ctx: cl.Context, src_code: str, dev: cl.Device, opts: str, key: str
    ) -> tuple[cl.Program, bytes]:
        """Build from source for ``dev``: (program, its binary, b'' when the driver has none)."""
        self._c["compiles"] += 1
        t0 = time.perf_counter()
        cm: AbstractContextManager[Any] = (
            tel.tracer.start_as_current_span(
                tel.SPAN_COMPILE, attributes={tel.ATTR_OPTIONS: opts, tel.ATTR_KEY: key}
            )
            if _tracing()
            else contextlib.nullcontext()
        )
        point = {tel.ATTR_DEVICE: self._registry.name(dev)}
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
                    point[tel.ATTR_ERROR_TYPE] = tel.error_type(err)
                    if span is not None:
                        span.set_attribute(tel.ATTR_LOG, err.log)
                        span.set_attribute(tel.ATTR_ERROR_TYPE, point[tel.ATTR_ERROR_TYPE])
                    raise err from exc
        except BaseException as exc:  # an interrupt mid-build is a failed point too
            point.setdefault(tel.ATTR_ERROR_TYPE, tel.error_type(exc))
            raise
        finally:
            tel.compile_duration.record(time.perf_counter() - t0, point)
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
                self._registry.stores.pop(store.root, None)
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
        """Forget the in-process programs and/or delete the disk entries (whatever kind of file
        sits at an entry's path) and the temporary files of writers that are gone; a running
        writer's temporary file is kept (its rename then adds one valid entry). Returns the
        number of files removed."""
        if memory:
            with self._lock:
                self._memory.clear()
        if disk:
            store = self._open_store()
            if store is not None:
                return store.clear()
        return 0

    def prune(self, max_bytes: int | None = None) -> dict[str, int]:
        """Delete damaged entries (anything that is not a valid entry for its name: a folder,
        a FIFO, a link, a truncated or oversized file) and the temporary files of writers that
        are gone, then evict down to ``max_bytes`` (default: the cap). Returns counts by kind:
        ``damaged``, ``temp``, ``evicted``."""
        store = self._open_store()
        if store is None:
            return {"damaged": 0, "temp": 0, "evicted": 0}
        return store.prune(self.max_bytes if max_bytes is None else max_bytes)

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
