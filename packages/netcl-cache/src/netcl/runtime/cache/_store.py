"""The disk tier: one file per key in a private folder, atomic writes, a lock per key stripe,
LRU eviction by modification time (a hit touches its file), and persisted counters."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from netcl.core.log import get_logger

__all__ = ["DiskStore", "EntryFile", "check_trusted"]

log = get_logger("netcl.runtime.cache")

SUFFIX = ".clprg"
TMP_SUFFIX = ".tmp"
#: Temporary files older than this are left-overs of a crashed writer (prune removes them).
STALE_TMP_S = 3600.0


@dataclass(frozen=True)
class EntryFile:
    """One entry file as found on disk."""

    key: str
    path: Path
    size: int
    mtime: float


def check_trusted(path: Path | str) -> str | None:
    """Why ``path`` (a folder) must not be trusted, or None when it is ours and private enough:
    owned by this user and writable by nobody else (a folder others can write lets them plant
    binaries that this process would run on its device)."""
    return _untrusted(os.stat(path))


def _untrusted(st: os.stat_result) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _write_atomic(target: Path, data: bytes, prefix: str) -> None:
    """Write ``target`` through a temporary file in its folder, renamed into place, so a reader
    sees the old file or the new one, never a part; nothing is left behind on error."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=TMP_SUFFIX, dir=target.parent)
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


class DiskStore:
    """Entries under ``root/programs``, lock files under ``root/locks``, counters in
    ``root/stats.json``. Create with :meth:`open`, which refuses a folder it cannot trust."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.programs = root / "programs"
        self.locks = root / "locks"
        self._prefix = os.path.join(self.programs, "")  # str paths: a hit skips pathlib

    @classmethod
    def open(cls, root: Path) -> DiskStore:
        """Create the folders (0700) when missing and check that they can be trusted; raises
        ``PermissionError`` (untrusted) or ``OSError`` (cannot create)."""
        store = cls(root)
        # plain str paths and one stat per folder: every fresh instance pays this on first use
        for d in (str(root), str(store.programs), str(store.locks)):
            try:
                st = os.stat(d)
            except FileNotFoundError:
                # another process may make it first; the trust check below still applies
                with contextlib.suppress(FileExistsError):
                    os.makedirs(d, mode=0o700)
                st = os.stat(d)
            why = _untrusted(st)
            if why is not None:
                raise PermissionError(f"cache folder {d} is not trusted: {why}")
        return store

    # entries ------------------------------------------------------------------------------------

    def path(self, key: str) -> Path:
        return self.programs / (key + SUFFIX)

    def read(self, key: str) -> bytes | None:
        """The bytes of entry ``key``, or None when there is none."""
        try:
            with open(self._prefix + key + SUFFIX, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def touch(self, key: str) -> None:
        """Mark an entry used now (LRU order); failures (read-only folder) are harmless."""
        with contextlib.suppress(OSError):
            os.utime(self._prefix + key + SUFFIX)

    def write(self, key: str, data: bytes) -> None:
        """Write an entry atomically (a reader sees the old file or the new one, never a part).
        Raises ``OSError``."""
        _write_atomic(self.path(key), data, prefix=f".{key}.")

    def entries(self) -> list[EntryFile]:
        """Every entry file (valid or not), oldest use first."""
        found: list[EntryFile] = []
        try:
            it = os.scandir(self.programs)
        except FileNotFoundError:
            return found
        with it:
            for e in it:
                if not e.name.endswith(SUFFIX) or e.name.startswith("."):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:  # evicted by another process meanwhile
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append(
                        EntryFile(e.name[: -len(SUFFIX)], Path(e.path), st.st_size, st.st_mtime)
                    )
        found.sort(key=lambda f: f.mtime)
        return found

    def temp_files(self) -> list[tuple[Path, float]]:
        out: list[tuple[Path, float]] = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.programs) as it:
            for e in it:
                if e.name.startswith(".") and e.name.endswith(TMP_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        out.append((Path(e.path), e.stat(follow_symlinks=False).st_mtime))
        return out

    def remove(self, path: Path) -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def evict(self, max_bytes: int, keep: str | None = None) -> list[EntryFile]:
        """Remove least recently used entries until the total is at most ``max_bytes``; ``keep``
        (the entry just written) survives even when it alone is larger than the cap."""
        files = self.entries()
        total = sum(f.size for f in files)
        removed: list[EntryFile] = []
        for f in files:
            if total <= max_bytes:
                break
            if f.key == keep:
                continue
            if self.remove(f.path):
                removed.append(f)
            total -= f.size
        return removed

    def remove_stale_temps(self, older_than_s: float = STALE_TMP_S) -> int:
        now = time.time()
        return sum(
            self.remove(p) for p, mtime in self.temp_files() if now - mtime > older_than_s
        )

    # locks --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[str]:
        """Hold the lock of ``key``'s stripe (256 lock files, so the folder stays bounded).

        Yields ``"held"``, or ``"timeout"`` / ``"failed"`` (read-only folder, full disk) instead
        of raising: the caller then compiles without coordination."""
        lock = filelock.FileLock(str(self.locks / f"{key[:2]}.lock"), timeout=timeout, mode=0o600)
        try:
            lock.acquire()
        except filelock.Timeout:
            log.warning("cache_lock_timeout", key=key, timeout_s=timeout, lock=lock.lock_file)
            yield "timeout"
            return
        except OSError as exc:  # read-only folder, full disk: go on without coordination
            log.warning("cache_lock_failed", key=key, lock=lock.lock_file, error=str(exc))
            yield "failed"
            return
        try:
            yield "held"
        finally:
            lock.release()

    # persisted counters -------------------------------------------------------------------------

    def load_counters(self) -> dict[str, int]:
        try:
            with open(self.root / "stats.json", "rb") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)}

    def add_counters(self, delta: dict[str, int], timeout: float = 5.0) -> None:
        """Add ``delta`` to ``stats.json`` (under a lock, atomic rewrite); raises ``OSError``."""
        lock = filelock.FileLock(str(self.locks / "stats.lock"), timeout=timeout, mode=0o600)
        with lock:
            total: dict[str, Any] = self.load_counters()
            for k, v in delta.items():
                total[k] = total.get(k, 0) + v
            _write_atomic(
                self.root / "stats.json", json.dumps(total, sort_keys=True).encode(), ".stats."
            )

    def reset_counters(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / "stats.json")

