"""The cache's settings, each declared once (core's :class:`~netcl.core.settings.Setting`) and
read through its declaration. A bad value never fails a lookup: one warning
``cache_config_invalid`` per value and process, then the default."""

from __future__ import annotations

from typing import NamedTuple, TypeVar
from urllib.parse import urlsplit, urlunsplit

from netcl.core.log import get_logger, warn_once
from netcl.core.settings import Setting, flag

__all__ = [
    "DEFAULT_MAX_BYTES",
    "SETTINGS",
    "RemoteSettings",
    "parse_size",
    "read",
    "redact",
    "remote_settings",
    "warn_unusable",
]

log = get_logger("netcl.runtime.cache")

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_REMOTE_TIMEOUT_S = 1.0
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# used when NETCL_CACHE_REMOTE_UNSIGNED=1: the tag is then only a checksum, anyone can forge it
UNSIGNED_SECRET = b"netcl-cache unsigned"
T = TypeVar("T")


def parse_size(text: str, what: str) -> int:
    """``"500M"``, ``"2G"``, ``"1048576"`` -> bytes (binary units); ValueError naming ``what``."""
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = s[-1:] if s[-1:] in _UNITS and not s[-1:].isdigit() else ""
    number = s[: len(s) - len(unit)].strip()
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not number or not 0 <= value < float("inf"):
        raise ValueError(
            f"{what}: expected a byte count such as 1073741824, 500M or 2G, got {text!r}"
        )
    return int(value)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(
            f"NETCL_CACHE_REMOTE_TIMEOUT: expected a number of seconds > 0 such "
            f"as 1 or 0.5, got {raw.strip()!r}"
        )
    return value


def _remote_url(raw: str) -> str:
    url = raw.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if url and scheme not in ("redis", "rediss"):
        raise ValueError(
            f"NETCL_CACHE_REMOTE: expected a redis:// or rediss:// URL, got scheme {scheme!r}"
        )
    return url


def redact(url: str) -> str:
    """``url`` with its password (and user name) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None and parts.username is None:
        return url
    netloc = "***@" + (f"[{host}]" if ":" in host else host)
    return urlunsplit(parts._replace(netloc=netloc + (f":{port}" if port is not None else "")))


MAX_BYTES = Setting(
    "NETCL_CACHE_MAX_BYTES",
    "1 GiB",
    "size cap of the disk tier, e.g. 500M or 2G",
    lambda raw: parse_size(raw, "NETCL_CACHE_MAX_BYTES"),
)
DISABLE = Setting(
    "NETCL_CACHE_DISABLE",
    "0",
    "1 turns the disk tier off (memory tier only)",
    flag("NETCL_CACHE_DISABLE", "to turn the disk tier off"),
)
REMOTE = Setting(
    "NETCL_CACHE_REMOTE",
    "(none)",
    "redis:// or rediss:// URL of a shared remote tier",
    _remote_url,
    shown=lambda raw: redact(raw.strip()),
)
REMOTE_KEY = Setting(
    "NETCL_CACHE_REMOTE_KEY",
    "(none)",
    "secret signing remote entries (required unless NETCL_CACHE_REMOTE_UNSIGNED=1)",
    secret=True,
)
REMOTE_TIMEOUT = Setting(
    "NETCL_CACHE_REMOTE_TIMEOUT",
    f"{DEFAULT_REMOTE_TIMEOUT_S:g} s",
    "seconds one remote call may take in all",
    _seconds,
)
REMOTE_UNSIGNED = Setting(
    "NETCL_CACHE_REMOTE_UNSIGNED",
    "0",
    "1 uses a remote without a key (entries then carry only a checksum)",
    flag("NETCL_CACHE_REMOTE_UNSIGNED", "to use a remote without a key"),
)
#: netcl-cache's settings, in the order ``netcl config`` lists them.
SETTINGS = (MAX_BYTES, DISABLE, REMOTE, REMOTE_KEY, REMOTE_TIMEOUT, REMOTE_UNSIGNED)


def read(setting: Setting, default: T) -> T:
    """The value of ``setting``, ``default`` when unset or invalid (then one warning
    ``cache_config_invalid`` per value and process)."""
    try:
        value: T = setting.value(default)
    except ValueError as exc:
        raw = setting.raw()
        warn_once(
            log,
            ("cache_config_invalid", setting.name, raw),
            "cache_config_invalid",
            variable=setting.name,
            value=raw,
            error=str(exc),
            using=str(default),
        )
        return default
    return value


class RemoteSettings(NamedTuple):
    """A usable remote configuration (hashable: one tier per value)."""

    url: str
    secret: bytes
    signed: bool
    timeout_s: float  #: the deadline of one remote call


def warn_unusable(url: str, reason: str) -> None:
    """Say once per URL that the remote tier at ``url`` is not used, and why (the URL's
    password redacted)."""
    warn_once(
        log, ("cache_remote_unusable", url), "cache_remote_unusable", url=redact(url), reason=reason
    )


def remote_settings(url: str | None, secret: str | bytes | None) -> RemoteSettings | None:
    """The remote configuration (``None`` arguments: the environment), or None when there is
    none or it cannot be used (one warning per configuration and process)."""
    raw = REMOTE.raw() if url is None else url
    try:
        url = _remote_url(raw)
    except ValueError as exc:
        warn_unusable(raw, str(exc))
        return None
    if not url:
        return None
    key: str | bytes = REMOTE_KEY.value("") if secret is None else secret
    timeout = read(REMOTE_TIMEOUT, DEFAULT_REMOTE_TIMEOUT_S)
    if key:
        return RemoteSettings(url, key.encode() if isinstance(key, str) else key, True, timeout)
    if read(REMOTE_UNSIGNED, False):
        return RemoteSettings(url, UNSIGNED_SECRET, False, timeout)
    warn_once(
        log,
        ("cache_remote_unsigned", url),
        "cache_remote_unsigned",
        url=redact(url),
        reason="no NETCL_CACHE_REMOTE_KEY: a shared store is not trusted without a signing "
        "key; remote tier off (NETCL_CACHE_REMOTE_UNSIGNED=1 allows it)",
    )
    return None
