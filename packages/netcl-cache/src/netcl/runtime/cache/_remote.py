"""The remote (fleet) tier on Redis, shaped like the disk tier: ``get`` a value, ``decode`` it,
``lock`` a key while compiling it, ``put`` the result, ``unlock``; the lookup decides the order.
One :class:`RemoteTier` per configuration and process (one connection pool, one breaker)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from netcl.core import telemetry
from netcl.runtime.cache import _telemetry as tel
from netcl.runtime.cache._config import (
    REMOTE,
    RemoteSettings,
    log,
    redact,
    remote_settings,
    warn_unusable,
)
from netcl.runtime.cache._entry import FORMAT_VERSION, decode, encode

__all__ = ["Lease", "RemoteError", "RemoteTier", "remote_info", "tier_for"]

CONNECT_TIMEOUT_S = 0.2
TIMEOUT_S = 0.5
#: Values expire after 30 days unless rewritten (a Redis eviction policy may drop them sooner).
TTL_S = 30 * 24 * 3600
_POLL_FIRST_S = 0.02
_POLL_MAX_S = 0.25
_PREFIX = f"netcl:cache:v{FORMAT_VERSION}:"
# Take the lock (1), or take over a stale one (2), or leave it (0). The value is
# "<token>:<server time in ms>". Stale: no expiry (anyone who can write to Redis could leave
# one, stalling every machine), an expiry beyond ours, or older than our lock timeout.
_TAKE = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local px = tonumber(ARGV[2])
local mine = ARGV[1] .. ':' .. now
if redis.call('set', KEYS[1], mine, 'NX', 'PX', px) then return 1 end
local ttl = redis.call('pttl', KEYS[1])
local stamp = tonumber(string.match(redis.call('get', KEYS[1]) or '', ':(%d+)$') or '')
if ttl == -1 or ttl > px or (stamp and now - stamp > px) then
  redis.call('set', KEYS[1], mine, 'PX', px)
  return 2
end
return 0
"""
# delete the lock only when it is still ours (it may have expired and been taken by another)
_RELEASE = """
local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then return redis.call('del', KEYS[1]) end
return 0
"""
_POSITIVE = ("socket_timeout", "socket_connect_timeout")
_AT_LEAST = {"socket_read_size": 1, "max_connections": 1, "health_check_interval": 0, "db": 0}


class RemoteError(Exception):
    """A Redis call failed (``failed``: tried, an error) or was skipped (breaker open);
    ``down``: the server did not answer (connection, timeout)."""

    def __init__(self, message: str, *, failed: bool, down: bool) -> None:
        super().__init__(message)
        self.failed, self.down = failed, down


@dataclass
class Lease:
    """:meth:`RemoteTier.lock`'s outcome: ``token`` None when the wait timed out; ``waited``:
    another machine held the lock first (its value may be there now)."""

    key: str
    token: str | None
    waited: bool


class RemoteTier:
    """A Redis store of signed program binaries."""

    #: Largest value read or written (the reader fetches at most this many bytes + 1).
    max_bytes = 64 << 20
    #: Failures in a row that open the breaker, and how long it then stays open.
    breaker_failures = 3
    breaker_open_s = 30.0

    def __init__(self, settings: RemoteSettings) -> None:
        import redis  # only here: with no remote configured redis is never imported

        self.url = redact(settings.url)
        self.signed = settings.signed
        self.timeout_s = settings.timeout_s
        self._secret = settings.secret
        self._r = _client(settings.url)
        self._timeout_error = redis.TimeoutError
        self._down_errors = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._answered = redis.RedisError
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
                self._failures, self._open_until = 0, 0.0

    def _failed(self) -> None:
        with self._mu:
            self._failures += 1
            now = time.monotonic()
            if self._failures >= self.breaker_failures and now >= self._open_until:
                self._open_until = now + self.breaker_open_s
                log.warning(
                    "cache_remote_breaker_open",
                    url=self.url,
                    failures=self._failures,
                    open_s=self.breaker_open_s,
                )

    def _call(self, op: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` within the deadline, timed; a failure is logged, counted,
        raised as :class:`RemoteError`."""
        if self.breaker_open:
            raise RemoteError("breaker open", failed=False, down=True)
        t0 = time.perf_counter()
        try:
            out = self._within_deadline(fn, *args, **kw)
        except Exception as exc:  # redis' errors, and whatever else: never into get_program
            kind = telemetry.error_type(exc)
            tel.REMOTE_ERRORS.add(1, kind)
            log.warning("cache_remote_error", url=self.url, op=op, error_type=kind, error=str(exc))
            # a server that answers (full, read-only replica, no permission) is not down
            down = isinstance(exc, self._down_errors) or not isinstance(exc, self._answered)
            if down:
                self._failed()
            raise RemoteError(f"{kind}: {exc}", failed=True, down=down) from exc
        finally:
            tel.remote_duration.record(time.perf_counter() - t0, {tel.ATTR_REMOTE_OP: op})
        self._succeeded()
        return out

    def _within_deadline(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        # redis-py's timeouts bound each socket operation, not a call: a server that sends a
        # byte before every read timeout would hold one lookup for minutes. So the call runs
        # in a thread of its own, waited for until the deadline; past it the pool's
        # connections are closed, which ends the abandoned call.
        done: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                done.append((True, fn(*args, **kw)))
            except BaseException as exc:
                done.append((False, exc))

        worker = threading.Thread(target=run, name="netcl-cache-remote", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if not done:
            self._r.connection_pool.disconnect()
            raise self._timeout_error(f"no answer within the deadline of {self.timeout_s:g} s")
        ok, value = done[0]
        if not ok:
            raise value
        return value

    # operations ---------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The raw value of ``key`` (at most ``max_bytes`` + 1 bytes), None when absent."""
        data = self._call("get", self._r.getrange, _PREFIX + key, 0, self.max_bytes)
        return bytes(data) if data else None

    def decode(self, key: str, ident: str, data: bytes) -> memoryview:
        """The binary of an authentic value of ``key`` for device ``ident``, else EntryError."""
        return decode(data, key, secret=self._secret, ident=ident, max_bytes=self.max_bytes)[1]

    def lock(self, key: str, wait_s: float) -> Lease:
        """Take the lock of ``key`` (expiring after ``wait_s``, at least 1 s), taking over a
        stale one; while another machine holds it, poll (20 ms, doubling to 250 ms) for up to
        ``wait_s``. Each attempt is one call with its own deadline."""
        token = secrets.token_hex(16)
        px = max(1000, int(wait_s * 1000))
        if self._take(key, token, px):
            return Lease(key, token, waited=False)
        deadline = time.monotonic() + wait_s
        delay = _POLL_FIRST_S
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(delay, left))
            delay = min(2 * delay, _POLL_MAX_S)
            if self._take(key, token, px):
                return Lease(key, token, waited=True)
        return Lease(key, None, waited=True)

    def _take(self, key: str, token: str, px: int) -> bool:
        taken = self._call("lock", self._r.eval, _TAKE, 1, f"{_PREFIX}lock:{key}", token, px)
        if taken == 2:
            log.warning("cache_remote_lock_stale", url=self.url, key=key)
        return bool(taken)

    def unlock(self, lease: Lease) -> None:
        """Release a lock :meth:`lock` took (only if it is still ours)."""
        self._call("unlock", self._r.eval, _RELEASE, 1, f"{_PREFIX}lock:{lease.key}", lease.token)

    def put(self, key: str, binary: bytes, meta: dict[str, Any]) -> bool:
        """Publish ``binary``; False (not sent) when its value would exceed ``max_bytes``."""
        if len(value := encode(key, binary, meta, self._secret)) > self.max_bytes:
            log.info("cache_remote_too_large", key=key, bytes=len(value), max_bytes=self.max_bytes)
            return False
        return bool(self._call("set", self._r.set, _PREFIX + key, value, ex=TTL_S))

    def ping(self) -> str | None:
        """None when Redis answers (and accepts our credentials), else why not."""
        try:
            self._within_deadline(self._r.ping)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None


def _client(url: str) -> Any:
    """A redis client for ``url``, every option checked now (``ValueError`` naming it): our
    socket timeouts unless the URL gives its own, no retries, no health check pings."""
    import redis
    from redis.backoff import NoBackoff
    from redis.connection import parse_url
    from redis.retry import Retry

    given = parse_url(url)  # type: ignore[no-untyped-call]  # ValueError: an option of the wrong type
    for name in parse_qs(urlsplit(url).query):
        value, low = given.get(name), _AT_LEAST.get(name)
        if name in _POSITIVE and not (isinstance(value, float) and 0 < value < float("inf")):
            raise ValueError(f"option {name!r}: expected a number of seconds > 0, got {value!r}")
        if low is not None and not (isinstance(value, int) and value >= low):
            raise ValueError(f"option {name!r}: expected an integer >= {low}, got {value!r}")
    pool = redis.ConnectionPool.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )
    try:  # a connection object (not connected) checks the rest: unknown names, TLS, protocol
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:  # "... got an unexpected keyword argument 'bogus'"
        name = str(exc).rsplit(" ", 1)[-1]
        raise ValueError(f"option {name} is not one redis-py knows") from None
    except (ValueError, redis.RedisError) as exc:
        raise ValueError(f"redis-py refuses the URL's options: {exc}") from None
    return redis.Redis(connection_pool=pool)


# one tier per configuration ---------------------------------------------------------------------
_TIERS: dict[RemoteSettings, RemoteTier | str] = {}  # the tier, or why there is none
_TIERS_LOCK = threading.Lock()


def tier_for(url: str | None, secret: str | bytes | None) -> RemoteTier | str | None:
    """The process-wide tier of this configuration (``None`` arguments: the environment), or why
    it cannot be used (one warning per configuration); None when there is none (or
    :func:`remote_settings` refused it, with a warning of its own)."""
    if (cfg := remote_settings(url, secret)) is None:
        return None
    with _TIERS_LOCK:
        if cfg not in _TIERS:
            try:
                _TIERS[cfg] = RemoteTier(cfg)
            except ImportError:
                _TIERS[cfg] = (
                    "redis-py is not installed: python3 -m pip install redis (what "
                    "netcl-cache's redis extra adds)"
                )
            except ValueError as exc:  # a malformed URL or an option redis-py would refuse
                _TIERS[cfg] = str(exc)
            if isinstance(reason := _TIERS[cfg], str):
                warn_unusable(cfg.url, reason)
        return _TIERS[cfg]


def remote_info() -> dict[str, Any]:
    """What ``netcl cache stats`` shows about the environment's remote tier (PINGs Redis)."""
    if not (raw := REMOTE.raw().strip()):
        return {"configured": False}
    tier = tier_for(None, None)
    info = {"configured": True, "url": redact(raw), "usable": False, "reachable": False}
    error = tier  # why it is not used (None: refused with a warning), unless it is a tier
    if isinstance(tier, RemoteTier):
        error = tier.ping()
        info.update(usable=True, reachable=error is None, signed=tier.signed)
    if error:
        info["error"] = error
    return info
