"""The remote (fleet) tier on Redis: signed values, a lock per key, bounded latency.

redis-py is imported only when a remote is configured. One :class:`RemoteTier` per (URL, secret)
per process, shared by every ``ProgramCache`` (one connection pool, one breaker). Every Redis
call has short socket timeouts and no retries; a failure is logged, counted and the lookup goes
on without the remote (never an exception out of ``get_program``). After ``BREAKER_FAILURES``
consecutive failures the breaker opens: no Redis call for ``BREAKER_OPEN_S`` seconds, then one
trial call decides whether it closes again.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyopencl as cl

from netcl.core.log import get_logger
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._entry import EntryError
from netcl.runtime.cache._key import FORMAT_VERSION
from netcl.runtime.cache._remote_format import decode_value, encode_value

__all__ = ["RemoteTier", "check_args", "redact", "remote_info", "tier_for"]

log = get_logger("netcl.runtime.cache")

CONNECT_TIMEOUT_S = 0.2
TIMEOUT_S = 0.5
#: Largest value read or written (the reader fetches at most this many bytes + 1).
MAX_VALUE_BYTES = 64 << 20
BREAKER_FAILURES = 3
BREAKER_OPEN_S = 30.0
#: Values expire after 30 days unless rewritten (a Redis eviction policy may drop them sooner).
TTL_S = 30 * 24 * 3600
_POLL_FIRST_S = 0.02
_POLL_MAX_S = 0.25
_PREFIX = f"netcl:cache:v{FORMAT_VERSION}:"
# delete the lock only when it is still ours (it may have expired and been taken by another)
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
    "return 0"
)
# used when NETCL_CACHE_REMOTE_UNSIGNED=1: the tag is then only a checksum, anyone can forge it
_UNSIGNED_SECRET = b"netcl-cache unsigned"
_TRUE = ("1", "true", "yes", "on")

Load = Callable[[memoryview], Any]
Compile = Callable[[], tuple[Any, bytes]]


def redact(url: str) -> str:
    """``url`` with its password (and user name) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None and parts.username is None:
        return url
    if ":" in host:
        host = f"[{host}]"
    netloc = "***@" + host + (f":{port}" if port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


class _Call:
    """State of one lookup: after its first failure a lookup makes no more Redis calls, so one
    ``get_program`` pays at most one timeout."""

    __slots__ = ("c", "ok", "reported")

    def __init__(self, counters: dict[str, int]) -> None:
        self.c = counters
        self.ok = True
        self.reported = False


class RemoteTier:
    """A Redis store of signed program binaries; see the module docstring."""

    def __init__(
        self,
        url: str,
        secret: bytes,
        *,
        signed: bool = True,
        max_bytes: int = MAX_VALUE_BYTES,
        breaker_failures: int = BREAKER_FAILURES,
        breaker_open_s: float = BREAKER_OPEN_S,
    ) -> None:
        import redis  # only here: with no remote configured redis is never imported
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = redact(url)
        self.signed = signed
        self.max_bytes = max_bytes
        self.breaker_failures = breaker_failures
        self.breaker_open_s = breaker_open_s
        self._secret = secret
        # timeouts given in the URL (?socket_timeout=2) win over these defaults
        self._r = redis.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._breaker_errors: tuple[type[BaseException], ...] = (
            redis.ConnectionError, redis.TimeoutError, OSError,
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._mu = threading.Lock()
        self._failures = 0
        self._open_until = 0.0

    # breaker ------------------------------------------------------------------------------------

    @property
    def breaker_open(self) -> bool:
        """Whether Redis calls are suspended after repeated failures."""
        return time.monotonic() < self._open_until

    def _succeeded(self) -> None:
        if self._failures:
            with self._mu:
                if self._open_until:
                    log.info("cache_remote_breaker_closed", url=self.url)
                self._failures = 0
                self._open_until = 0.0

    def _failed(self) -> None:
        with self._mu:
            self._failures += 1
            now = time.monotonic()
            if self._failures >= self.breaker_failures and now >= self._open_until:
                self._open_until = now + self.breaker_open_s
                log.warning(
                    "cache_remote_breaker_open", url=self.url, failures=self._failures,
                    open_s=self.breaker_open_s,
                )

    def _call(self, call: _Call, op: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` timed and guarded; on failure ``call.ok`` turns False, None."""
        if not call.ok or self.breaker_open:
            call.ok = False
            return None
        t0 = time.perf_counter()
        try:
            out = fn(*args, **kw)
        except self._errors as exc:
            tel.remote_duration.record(time.perf_counter() - t0, {"netcl.cache.remote.op": op})
            call.ok = False
            call.c["remote_errors"] += 1
            kind = type(exc).__name__
            tel.remote_errors.add(1, {"error.type": kind})
            log.warning("cache_remote_error", url=self.url, op=op, error_type=kind,
                        error=str(exc))
            # a server that answers (full, read-only replica, no permission) is not down
            if isinstance(exc, self._breaker_errors):
                self._failed()
            return None
        tel.remote_duration.record(time.perf_counter() - t0, {"netcl.cache.remote.op": op})
        self._succeeded()
        return out

    # operations ---------------------------------------------------------------------------------

    def _fetch(self, call: _Call, key: str, ident: str, load: Load) -> tuple[Any, bytes] | None:
        data = self._call(call, "get", self._r.getrange, _PREFIX + key, 0, self.max_bytes)
        if not data:
            return None
        try:
            meta, binary = decode_value(self._secret, key, data, self.max_bytes)
            if meta.get("identity") != ident:
                raise EntryError("identity", f"written for {meta.get('identity')!r}")
            prg = load(binary)
        except EntryError as exc:
            reason, detail = exc.reason, str(exc)
        except cl.Error as exc:
            reason, detail = "rejected", f"rejected by the driver: {exc}"
        else:
            call.c["remote_hits"] += 1
            return prg, bytes(binary)
        if not call.reported:  # a waiter polling the same bad value reports it once
            call.reported = True
            call.c["remote_rejected"] += 1
            tel.remote_rejected.add(1, {"netcl.cache.reason": reason})
            log.warning("cache_remote_rejected", url=self.url, key=key, reason=detail)
        return None

    def _lock_or_wait(
        self, call: _Call, key: str, ident: str, load: Load, wait_s: float
    ) -> tuple[str | None, tuple[Any, bytes] | None]:
        """(token, None) with the lock held, (None, hit) when another machine published the
        program meanwhile, (None, None) when Redis failed or the wait timed out."""
        token = secrets.token_hex(16)
        lock_key = _PREFIX + "lock:" + key
        px = max(1000, int(wait_s * 1000))
        if self._call(call, "lock", self._r.set, lock_key, token, nx=True, px=px):
            return token, None
        if not call.ok:
            return None, None
        call.c["remote_waits"] += 1
        deadline = time.monotonic() + wait_s
        delay = _POLL_FIRST_S
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(delay, left))
            delay = min(2 * delay, _POLL_MAX_S)
            hit = self._fetch(call, key, ident, load)
            if hit is not None:
                return None, hit
            # the holder finished without publishing (build error, crash, no binary): take over
            if self._call(call, "lock", self._r.set, lock_key, token, nx=True, px=px):
                return token, None
            if not call.ok:
                return None, None
        call.c["remote_lock_timeouts"] += 1
        log.warning("cache_remote_lock_timeout", url=self.url, key=key, timeout_s=wait_s)
        return None, None

    def resolve(
        self,
        counters: dict[str, int],
        key: str,
        ident: str,
        meta: dict[str, Any],
        load: Load,
        compile_: Compile,
        wait_s: float,
    ) -> tuple[Any, bytes, bool]:
        """(program, binary, True) from the remote, else ``compile_()`` and publish it:
        (program, binary, False). While another machine compiles the same key, wait up to
        ``wait_s`` for its value, then compile anyway. ``load(binary)`` makes a program of an
        authenticated binary (raising ``cl.Error`` when the driver rejects it)."""
        call = _Call(counters)
        hit = self._fetch(call, key, ident, load)
        if hit is not None:
            return hit[0], hit[1], True
        token, hit = self._lock_or_wait(call, key, ident, load, wait_s)
        if hit is not None:
            return hit[0], hit[1], True
        try:
            prg, binary = compile_()
            if binary:
                self._publish(call, key, binary, meta)
        finally:  # also after a build error: waiters then take the lock and see it themselves
            if token is not None:
                self._call(call, "unlock", self._r.eval, _RELEASE, 1,
                           _PREFIX + "lock:" + key, token)
        return prg, binary, False

    def _publish(self, call: _Call, key: str, binary: bytes, meta: dict[str, Any]) -> None:
        value = encode_value(self._secret, key, binary, meta)
        if len(value) > self.max_bytes:
            log.info("cache_remote_too_large", key=key, bytes=len(value), max_bytes=self.max_bytes)
            return
        if self._call(call, "set", self._r.set, _PREFIX + key, value, ex=TTL_S):
            call.c["remote_writes"] += 1

    def ping(self) -> str | None:
        """None when Redis answers (and accepts our credentials), else why not."""
        try:
            self._r.ping()
        except self._errors as exc:
            return f"{type(exc).__name__}: {exc}"
        return None


# configuration ----------------------------------------------------------------------------------

_TIERS: dict[tuple[str, bytes, bool], RemoteTier | None] = {}
_WARNED: set[tuple[str, str]] = set()
_TIERS_LOCK = threading.Lock()


def _warn_once(event: str, url: str, **kw: Any) -> None:
    if (event, url) not in _WARNED:
        _WARNED.add((event, url))
        log.warning(event, url=redact(url), **kw)


def _settings(url: str | None, secret: str | bytes | None) -> tuple[str, bytes, bool] | None:
    """(url, secret, signed) of a usable configuration, or None (with one warning)."""
    if url is None:
        url = os.environ.get("NETCL_CACHE_REMOTE", "")
    url = url.strip()
    if not url:
        return None
    if secret is None:
        secret = os.environ.get("NETCL_CACHE_REMOTE_KEY", "")
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("redis", "rediss"):
        _warn_once("cache_remote_unusable", url,
                   reason=f"expected a redis:// or rediss:// URL, got scheme {scheme!r}")
        return None
    if key:
        return url, key, True
    if os.environ.get("NETCL_CACHE_REMOTE_UNSIGNED", "").strip().lower() in _TRUE:
        return url, _UNSIGNED_SECRET, False
    _warn_once("cache_remote_unsigned", url,
               reason="no NETCL_CACHE_REMOTE_KEY: a shared store is not trusted without a "
                      "signing key; remote tier off (NETCL_CACHE_REMOTE_UNSIGNED=1 allows it)")
    return None


def check_args(url: object, secret: object) -> None:
    """TypeError naming a ``remote``/``remote_key`` argument of the wrong type."""
    if url is not None and not isinstance(url, str):
        raise TypeError(
            f"ProgramCache: remote must be a redis:// or rediss:// URL string or None, got {url!r}"
        )
    if secret is not None and not isinstance(secret, (str, bytes)):
        raise TypeError(
            f"ProgramCache: remote_key must be a str or bytes secret or None, "
            f"got {type(secret).__name__}"
        )


def tier_for(url: str | None, secret: str | bytes | None) -> RemoteTier | None:
    """The process-wide tier for this configuration (``None`` arguments: the environment), or
    None when no remote is configured or it cannot be used (one warning per configuration)."""
    cfg = _settings(url, secret)
    if cfg is None:
        return None
    with _TIERS_LOCK:
        if cfg in _TIERS:
            return _TIERS[cfg]
        tier: RemoteTier | None = None
        try:
            tier = RemoteTier(cfg[0], cfg[1], signed=cfg[2])
        except ImportError:
            _warn_once("cache_remote_unusable", cfg[0],
                       reason="redis-py is not installed: pip install 'netcl-cache[redis]'")
        except (ValueError, TypeError) as exc:  # a malformed URL or option
            _warn_once("cache_remote_unusable", cfg[0], reason=str(exc))
        _TIERS[cfg] = tier
        return tier


def remote_info(url: str | None = None, secret: str | bytes | None = None) -> dict[str, Any]:
    """What ``netcl cache stats`` shows about the remote tier (asks Redis for a PING)."""
    raw = os.environ.get("NETCL_CACHE_REMOTE", "") if url is None else url
    if not raw.strip():
        return {"configured": False}
    info: dict[str, Any] = {"configured": True, "url": redact(raw.strip())}
    tier = tier_for(url, secret)
    if tier is None:
        info.update(usable=False, reachable=False)
        return info
    error = tier.ping()
    info.update(usable=True, signed=tier.signed, reachable=error is None)
    if error is not None:
        info["error"] = error
    return info
