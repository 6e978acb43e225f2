"""Settings read from the environment, each declared once and read through its declaration;
``netcl config`` lists the declarations of the installed packages: ``SETTINGS`` (a tuple of
:class:`Setting`) in the module each ``netcl.cli`` entry point names (core's are here). The
other netcl packages declare theirs with :class:`Setting` and :func:`flag`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SETTINGS", "Setting", "describe", "flag"]


@dataclass(frozen=True)
class Setting:
    """One environment variable: its ``name``, how its default reads (text, or a function giving the
    text), what it does, and ``check`` (the text -> the value, ValueError when invalid). The code
    reads the setting through :meth:`value`, which uses the same parser, so ``netcl config`` flags
    exactly what the code would refuse. ``secret`` values are never shown."""

    name: str
    default: str | Callable[[], str]
    description: str
    check: Callable[[str], object] | None = None
    secret: bool = False
    shown: Callable[[str], str] | None = None  #: how a set value is displayed (e.g. redacted)

    def raw(self) -> str:
        """The variable's text as set ("" when unset)."""
        return os.environ.get(self.name, "")

    def is_set(self) -> bool:
        """Whether the environment gives a value (not unset, not blank)."""
        return bool(self.raw().strip())

    def default_text(self) -> str:
        """How the default reads (the function called, for a computed default)."""
        return self.default() if callable(self.default) else self.default

    def value(self, unset: Any = None) -> Any:
        """The parsed value of the variable (``check`` applied to its text), ``unset`` when it
        is unset or blank; ValueError (naming the variable) when the text is invalid."""
        raw = self.raw()
        if not raw.strip():
            return unset
        return self.check(raw) if self.check is not None else raw


def describe(setting: Setting) -> dict[str, Any]:
    """What ``netcl config`` shows: name, value, source ("environment"/"default"), the default,
    the description, and ``error`` when the set value is invalid."""
    doc: dict[str, Any] = {
        "name": setting.name,
        "description": setting.description,
        "default": setting.default_text(),
        "error": None,
    }
    if not setting.is_set():
        doc.update(value=doc["default"], source="default")
        return doc
    raw = setting.raw()
    shown = "<hidden>" if setting.secret else setting.shown(raw) if setting.shown else raw
    doc.update(value=shown, source="environment")
    if setting.check is not None:
        try:
            setting.check(raw)
        except ValueError as exc:
            doc["error"] = str(exc)
    return doc


def flag(name: str, meaning: str) -> Callable[[str], bool]:
    """The parser of an on/off variable ``name``: 1/true/yes/on, 0/false/no/off (any case) or
    blank; anything else is a ValueError that names the variable and says what 1 does
    (``meaning``, e.g. "to turn the disk tier off")."""

    def check(raw: str) -> bool:
        value = raw.strip().lower()
        if value in _ON:
            return True
        if value in _OFF:
            return False
        raise ValueError(
            f"{name}={raw!r}: expected 1 {meaning} or 0 for off (true/false, yes/no "
            "and on/off work too)"
        )

    return check


_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def _cache_dir_default() -> str:
    import platformdirs  # only when shown: not on the import path of the runtime

    return platformdirs.user_cache_dir("netcl")


def _pool_limit(raw: str) -> Callable[[int], int]:
    """``NETCL_POOL_LIMIT``'s text -> the limit in bytes given the device's global memory."""
    text = raw.strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if 0 <= pct <= 100:  # NaN and inf fail it
                return lambda global_mem: int(global_mem * pct / 100)
        elif int(text) >= 0:
            return lambda _: int(text)
    except ValueError:
        pass
    raise ValueError(
        f"NETCL_POOL_LIMIT={raw!r}: expected a number of bytes (a whole number >= 0, "
        "0 for no limit) or a percentage of the device's global memory from 0% to "
        "100%, such as '50%'"
    )


CACHE_DIR = Setting(
    "NETCL_CACHE_DIR", _cache_dir_default, "folder of the OpenCL program cache (and its statistics)"
)
POOL_LIMIT = Setting(
    "NETCL_POOL_LIMIT",
    "0 (no limit)",
    "BufferPool limit: bytes, or N% of the device's global memory",
    _pool_limit,
)


def _profile(raw: str) -> str:
    """``NETCL_PROFILE``'s text -> ``off``, ``summary`` or ``commands`` (what 1 means)."""
    text = raw.strip().lower()
    if text in ("summary", "commands"):
        return text
    if text in _ON:
        return "commands"
    if text in _OFF:
        return "off"
    raise ValueError(
        f"NETCL_PROFILE={raw!r}: expected 1 to turn profiling on for the default "
        "queue with every command's device time (or commands, the same), summary for "
        "one device time per replay, graph node and plan, or 0 for off (true/false, "
        "yes/no and on/off work too)"
    )


PROFILE = Setting(
    "NETCL_PROFILE",
    "0",
    "device time: 1 or commands (a profiling default "
    "queue, every command's), summary (one per replay, node, plan; a plain default "
    "queue, stamped on a side queue), 0 (plain default queue)",
    _profile,
)
# the device-time mode as set in code (netcl.core.profiling's collector), which counts before
# NETCL_PROFILE; None until set
profile_in_code: str | None = None
CHECK_MEMORY = Setting(
    "NETCL_CHECK_MEMORY",
    "0",
    "checked mode: guard bytes around pool and "
    "graph blocks, checked after each graph node and replay; freed blocks "
    "poisoned (slow: for tests and debugging)",
    flag("NETCL_CHECK_MEMORY", "to turn checked mode on"),
)
TRACE_FILE = Setting(
    "NETCL_TRACE_FILE",
    "netcl-trace.json",
    "file the chrome_trace span exporter writes (a Chrome/Perfetto timeline)",
)
PYOPENCL_CTX = Setting(
    "PYOPENCL_CTX",
    "(unset)",
    "pyopencl's own device choice, e.g. 0 or 0:1; "
    "unset: netcl takes the first GPU, else the first device",
)

#: core's settings, in the order ``netcl config`` lists them.
SETTINGS = (CACHE_DIR, POOL_LIMIT, PROFILE, CHECK_MEMORY, TRACE_FILE, PYOPENCL_CTX)
