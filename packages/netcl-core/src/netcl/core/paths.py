"""Where netcl keeps files on disk."""

from __future__ import annotations

from pathlib import Path

import platformdirs

from netcl.core._settings import CACHE_DIR

__all__ = ["default_cache_dir"]


def default_cache_dir() -> Path:
    """``NETCL_CACHE_DIR`` if set, else the platform's user cache dir (``~/.cache/netcl``)."""
    env = CACHE_DIR.value()
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("netcl"))
