"""Settings of a cache, from its arguments and the environment: the disk tier's folder, cap and
switch, the lock timeout, and the remote tier's URL and key. A bad value never fails a lookup:
one warning ``cache_config_invalid`` per value and process, then the default."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from netcl.core import paths
from netcl.core._settings import Setting
from netcl.core.log import get_logger

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_PROGRAMS",
    "DEFAULT_REMOTE_TIMEOUT_S", "RemoteSettings", "Settings", "check_remote_args",
    "env_enabled", "env_max_bytes", "env_remote_timeout", "parse_size", "redact",
    "remote_settings", "SETTINGS",
]

log = get_logger("netcl.runtime.cache")

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_PROGRAMS = 1024
DEFAULT_LOCK_TIMEOUT_S = 60.0
DEFAULT_REMOTE_TIMEOUT_S = 1.0
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# used when NETCL_CACHE_REMOTE_UNSIGNED=1: the tag is then only a checksum, anyone can forge it
UNSIGNED_SECRET = b"netcl-cache unsigned"

_WARNED: set[tuple[str, str]] = set()
_REMOTE_WARNED: set[tuple[str, str]] = set()


def config_warning(variable: str, value: str, error: str, default: object) -> None:
    """One warning per bad value and process; the caller then uses the default."""
    if (variable, value) not in _WARNED:
        _WARNED.add((variable, value))
        log.warning(
            "cache_config_invalid", variable=variable, value=value, error=error,
            using=str(default),
        )


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


def env_max_bytes() -> int:
    """``NETCL_CACHE_MAX_BYTES`` in bytes (the default when unset); ValueError when invalid."""
    env = MAX_BYTES.raw().strip()
    return parse_size(env, "NETCL_CACHE_MAX_BYTES") if env else DEFAULT_MAX_BYTES


def env_enabled() -> bool:
    """Whether ``NETCL_CACHE_DISABLE`` leaves the disk tier on; ValueError when invalid."""
    flag = DISABLE.raw().strip().lower()
    if flag in _OFF:
        return True
    if flag in _ON:
        return False
    raise ValueError(
        f"NETCL_CACHE_DISABLE: expected one of 1/true/yes/on or 0/false/no/off, got {flag!r}"
    )


def env_remote_timeout() -> float:
    """``NETCL_CACHE_REMOTE_TIMEOUT``: seconds one remote call may take in all (connect,
    transfer, lock); the default when unset, ValueError when invalid."""
    env = REMOTE_TIMEOUT.raw().strip()
    if not env:
        return DEFAULT_REMOTE_TIMEOUT_S
    try:
        value = float(env)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(
            f"NETCL_CACHE_REMOTE_TIMEOUT: expected a number of seconds > 0 such as 1 or 0.5, "
            f"got {env!r}"
        )
    return value


def _remote_url(raw: str) -> str:
    url = raw.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if url and scheme not in ("redis", "rediss"):
        raise ValueError(
            f"NETCL_CACHE_REMOTE: expected a redis:// or rediss:// URL, got scheme {scheme!r}"
        )
    return redact(url)


MAX_BYTES = Setting(
    "NETCL_CACHE_MAX_BYTES", "1 GiB", "size cap of the disk tier, e.g. 500M or 2G",
    lambda raw: parse_size(raw, "NETCL_CACHE_MAX_BYTES"),
)  # fmt: skip
DISABLE = Setting(
    "NETCL_CACHE_DISABLE", "0", "1 turns the disk tier off (memory tier only)",
    lambda _raw: env_enabled(),
)  # fmt: skip
REMOTE = Setting(
    "NETCL_CACHE_REMOTE", "(none)", "redis:// or rediss:// URL of a shared remote tier",
    _remote_url, shown=lambda raw: redact(raw.strip()),
)  # fmt: skip
REMOTE_KEY = Setting(
    "NETCL_CACHE_REMOTE_KEY", "(none)", "secret signing remote entries (required unless "
    "NETCL_CACHE_REMOTE_UNSIGNED=1)", secret=True,
)  # fmt: skip
REMOTE_TIMEOUT = Setting(
    "NETCL_CACHE_REMOTE_TIMEOUT", f"{DEFAULT_REMOTE_TIMEOUT_S:g} s",
    "seconds one remote call may take in all", lambda _raw: env_remote_timeout(),
)  # fmt: skip
REMOTE_UNSIGNED = Setting(
    "NETCL_CACHE_REMOTE_UNSIGNED", "0",
    "1 uses a remote without a key (entries then carry only a checksum)",
)  # fmt: skip
#: netcl-cache's settings, in the order ``netcl config`` lists them.
SETTINGS = (MAX_BYTES, DISABLE, REMOTE, REMOTE_KEY, REMOTE_TIMEOUT, REMOTE_UNSIGNED)


def _remote_timeout() -> float:
    try:
        return env_remote_timeout()
    except ValueError as exc:
        env = REMOTE_TIMEOUT.raw()
        config_warning("NETCL_CACHE_REMOTE_TIMEOUT", env, str(exc), DEFAULT_REMOTE_TIMEOUT_S)
        return DEFAULT_REMOTE_TIMEOUT_S


class Settings:
    """The local settings of one cache: arguments given, the environment for the rest (read
    when asked, so a change of the environment is seen by the next lookup)."""

    __slots__ = ("dir_arg", "lock_timeout", "max_bytes_arg")

    def __init__(
        self, dir_arg: Path | None, max_bytes_arg: int | None, lock_timeout: float
    ) -> None:
        self.dir_arg = dir_arg
        self.max_bytes_arg = max_bytes_arg
        self.lock_timeout = lock_timeout

    @property
    def cache_dir(self) -> Path:
        return self.dir_arg if self.dir_arg is not None else paths.default_cache_dir()

    @property
    def max_bytes(self) -> int:
        if self.max_bytes_arg is not None:
            return self.max_bytes_arg
        try:
            return env_max_bytes()
        except ValueError as exc:
            env = MAX_BYTES.raw()
            config_warning("NETCL_CACHE_MAX_BYTES", env, str(exc), DEFAULT_MAX_BYTES)
            return DEFAULT_MAX_BYTES

    @property
    def enabled(self) -> bool:
        try:
            return env_enabled()
        except ValueError as exc:
            env = DISABLE.raw()
            config_warning("NETCL_CACHE_DISABLE", env, str(exc), "enabled")
            return True


# remote tier ------------------------------------------------------------------------------------


class RemoteSettings(NamedTuple):
    """A usable remote configuration (hashable: one tier per value)."""

    url: str
    secret: bytes
    signed: bool
    timeout_s: float  #: the deadline of one remote call


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


def remote_warning(event: str, url: str, **kw: Any) -> None:
    """One warning per event and configuration (the URL shown without its password)."""
    if (event, url) not in _REMOTE_WARNED:
        _REMOTE_WARNED.add((event, url))
        log.warning(event, url=redact(url), **kw)


def check_remote_args(url: object, secret: object) -> None:
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


def remote_settings(url: str | None, secret: str | bytes | None) -> RemoteSettings | None:
    """The remote configuration (``None`` arguments: the environment), or None when there is
    none or it cannot be used (one warning per configuration)."""
    if url is None:
        url = REMOTE.raw()
    url = url.strip()
    if not url:
        return None
    if secret is None:
        secret = REMOTE_KEY.raw()
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("redis", "rediss"):
        remote_warning("cache_remote_unusable", url,
                       reason=f"expected a redis:// or rediss:// URL, got scheme {scheme!r}")
        return None
    if key:
        return RemoteSettings(url, key, True, _remote_timeout())
    if REMOTE_UNSIGNED.raw().strip().lower() in _ON:
        return RemoteSettings(url, UNSIGNED_SECRET, False, _remote_timeout())
    remote_warning("cache_remote_unsigned", url,
                   reason="no NETCL_CACHE_REMOTE_KEY: a shared store is not trusted without a "
                          "signing key; remote tier off (NETCL_CACHE_REMOTE_UNSIGNED=1 allows it)")
    return None
