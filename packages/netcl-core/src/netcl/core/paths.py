"""Where netcl keeps files on disk."""

from __future__ import annotations

from pathlib import Path

from netcl.core._settings import CACHE_DIR

__all__ = ["default_cache_dir"]


def default_cache_dir() -> Path:
    """``NETCL_CACHE_DIR`` if set, else the platform's user cache dir (``~/.cache/netcl``)."""
    return Path(CACHE_DIR.value() or CACHE_DIR.default_text()).expanduser()
