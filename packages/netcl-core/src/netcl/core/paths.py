"""Where netcl keeps files on disk, and how it writes them."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from netcl.core.settings import CACHE_DIR

__all__ = ["default_cache_dir", "write_atomic"]


def default_cache_dir() -> Path:
    """``NETCL_CACHE_DIR`` if set, else the platform's user cache dir (``~/.cache/netcl``)."""
    return Path(CACHE_DIR.value() or CACHE_DIR.default_text()).expanduser()


def write_atomic(target: Path, data: bytes, prefix: str) -> None:
    """Write ``target`` through a temporary file renamed into place: a reader sees the old file
    or the new one, never a part; nothing is left behind on error."""
    # `<prefix><pid>.<random>.tmp`: a cleaner knows whose it is and whether its writer still runs
    fd, tmp = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}.", suffix=".tmp", dir=target.parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
