"""The disk tier: one file per key in a private folder, atomic writes, a lock per key stripe,
LRU eviction by modification time (a hit touches its file), the folder's hit/miss totals. Every
operation handles whatever kind of file sits at an entry's path (guide: "Hostile files")."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netcl.core.paths import write_atomic
from netcl.runtime.cache._config import log
from netcl.runtime.cache._entry import EntryError, decode, read_file

if TYPE_CHECKING:
    import filelock  # loaded by the first lock: a third of the package's import cost

__all__ = [
    "COUNTERS",
    "CacheStats",
    "DiskStore",
    "EntryFile",
    "TempFile",
    "pid_alive",
    "probe",
    "refusal",
    "write_atomic",
]

SUFFIX = ".clprg"
TMP_SUFFIX = ".tmp"
#: Temporary files older than this are left-overs whatever their pid says (a pid can be reused);
#: those whose writer is no longer running go at once.
STALE_TMP_S = 3600.0
#: The LRU order's granularity: a hit touches an entry last modified longer ago (or later).
TOUCH_S = 60.0
_MAX_STATS_BYTES = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
# `.<key or "stats">.<pid>.<mkstemp's random part>.tmp`; `.<key>.<random>.tmp` from older writers
_TMP_NAME = re.compile(r"^\.(?:[0-9a-f]{64}|stats)\.(?:(\d+)\.)?[A-Za-z0-9_]+\.tmp$")


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a cache's counters (this process, this instance; the guide's API section
    says what each counts); a folder's totals across processes have the same fields."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compiles: int = 0
    recoveries: int = 0
    corrupt: int = 0
    write_errors: int = 0
    lock_timeouts: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    remote_hits: int = 0
    remote_writes: int = 0
    remote_errors: int = 0
    remote_rejected: int = 0
    remote_waits: int = 0
    remote_lock_timeouts: int = 0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits + self.remote_hits

    def as_dict(self) -> dict[str, int]:
        # not dataclasses.asdict: its deep copy is ~25 µs, paid twice by every new cache
        return {name: getattr(self, name) for name in COUNTERS}


#: The CacheStats field names: the keys of a cache's counters and of a folder's totals.
COUNTERS = tuple(f.name for f in fields(CacheStats))


@dataclass(frozen=True)
class EntryFile:
    """One entry file as found on disk."""

    key: str
    path: Path
    size: int  #: bytes on disk (a sparse file counts its allocated blocks)
    mtime: float
    kind: str = "file"  #: file, directory, symlink, fifo, socket, device

    @property
    def regular(self) -> bool:
        return self.kind == "file"


@dataclass(frozen=True)
class TempFile:
    """A temporary file of a writer (or a folder moved aside), as found on disk."""

    path: Path
    size: int
    mtime: float
    pid: int | None  #: the writer's pid (None: a name without one, from an older writer)
    alive: bool  #: the writer is still running (by pid) and the file is younger than an hour


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (signal 0: nothing is sent)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:  # ProcessLookupError among them
        return False
    return True


_KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "device")


def _usage(st: os.stat_result) -> int:
    """Bytes a file takes: its size, or its allocated blocks when fewer (a sparse file)."""
    return min(st.st_size, st.st_blocks * 512) if stat.S_ISREG(st.st_mode) else 0


def _why(path: Path | str, st: os.stat_result) -> str | None:
    """Why the folder ``path`` cannot be trusted (None: it can). A folder others can write
    lets them plant binaries that this process would run on its device."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return None
    return f"{path} is not trusted ({why})"


def refusal(root: Path, *, create: bool = False) -> str | None:
    """Why the cache would refuse ``root`` (it, ``programs/`` or ``locks/`` is not a trusted
    folder), None when it would use it; ``create`` makes the missing ones (0700) first. Raises
    ``OSError`` when a folder cannot be examined (or made)."""
    # plain str paths and one stat per folder: every fresh instance pays this on first use
    for d in (str(root), os.path.join(root, "programs"), os.path.join(root, "locks")):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            if not create:
                continue
            with contextlib.suppress(FileExistsError):  # another process made it first
                os.makedirs(d, mode=0o700)
            st = os.stat(d)
        if why := _why(d, st):
            return why
    return None


def probe(root: Path, *, write: bool) -> str | None:
    """Why the cache could not create ``root`` (when missing) or, with ``write``, write in it;
    None when it could. Making and removing a folder there is the one test that also holds for
    root and for special file systems (/proc)."""
    if root.exists():
        if not write:
            return None
        where, verb = root / "programs" if (root / "programs").is_dir() else root, "is not writable"
    else:
        where, verb = root.parent, "cannot be created"
        while not where.exists() and where != where.parent:
            where = where.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".netcl-probe.", dir=where))
    except OSError as exc:
        return f"{root} {verb} ({exc.strerror or exc})"
    return None


class DiskStore:
    """Entries under ``root/programs``, lock files under ``root/locks``, counters in
    ``root/stats.json``. A folder not there yet reads as empty; :func:`refusal` says whether
    the cache may use it (and makes it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.programs = root / "programs"
        self.locks = root / "locks"
        self.stats_file = root / "stats.json"  #: the hit/miss totals (remove it to zero them)
        self._prefix = os.path.join(self.programs, "")  # str paths: a hit skips pathlib

    # entries ------------------------------------------------------------------------------------
    def path(self, key: str) -> Path:
        return self.programs / (key + SUFFIX)

    def read(self, key: str) -> tuple[bytes, float] | None:
        """(bytes, modification time) of entry ``key`` (None: there is none); EntryError for
        what is not a regular file or too large, ``OSError`` when it cannot be read."""
        try:
            fd = os.open(self._prefix + key + SUFFIX, _OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise EntryError("special", "a symbolic link") from exc
            if exc.errno == errno.ENXIO:  # a socket
                raise EntryError("special", "a socket") from exc
            raise
        try:
            return read_file(fd)
        finally:
            os.close(fd)

    def meta(self, f: EntryFile) -> dict[str, Any] | None:
        """The metadata of ``f`` when it is a valid entry for its name (None: it went meanwhile);
        else :class:`EntryError` or ``OSError`` naming why not."""
        if not f.regular:
            raise EntryError("special", f"a {f.kind}")
        found = self.read(f.key)
        return None if found is None else decode(found[0], f.key)[0]

    def touch(self, key: str, mtime: float) -> None:
        """Mark an entry last modified at ``mtime`` used now (LRU order) unless that is within
        :data:`TOUCH_S`: a hit on one used or written just now skips the ``utime`` (~3 µs)."""
        if abs(time.time() - mtime) >= TOUCH_S:
            with contextlib.suppress(OSError):  # a read-only folder: harmless
                os.utime(self._prefix + key + SUFFIX)

    def write(self, key: str, data: bytes) -> None:
        """Write an entry atomically (a folder in the way is removed first); raises OSError."""
        try:
            write_atomic(self.path(key), data, prefix=f".{key}.")
        except IsADirectoryError:
            self.remove(self.path(key))
            write_atomic(self.path(key), data, prefix=f".{key}.")

    def _scan(self) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
        """Every file of ``programs/`` with its own (not a link's target's) status."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.programs) as it:
            for e in it:
                with contextlib.suppress(FileNotFoundError):  # removed by another process
                    yield e, e.stat(follow_symlinks=False)

    def entries(self) -> list[EntryFile]:
        """Every entry file (valid or not), oldest use first."""
        found = [
            EntryFile(
                e.name[: -len(SUFFIX)], Path(e.path), _usage(st), st.st_mtime, _kind(st.st_mode)
            )
            for e, st in self._scan()
            if e.name.endswith(SUFFIX) and e.name[0] != "."
        ]
        return sorted(found, key=lambda f: f.mtime)

    def temp_files(self) -> list[TempFile]:
        """This cache's temporary files (and folders moved aside), with their writer's state."""
        out: list[TempFile] = []
        now = time.time()
        for e, st in self._scan():
            if m := _TMP_NAME.match(e.name):
                pid = int(m.group(1)) if m.group(1) else None
                alive = now - st.st_mtime < STALE_TMP_S and (pid is None or pid_alive(pid))
                out.append(TempFile(Path(e.path), _usage(st), st.st_mtime, pid, alive))
        return out

    def remove(self, path: Path) -> bool:
        """Remove whatever is at ``path`` (a folder is first renamed aside, so the name is free
        at once); False when nothing was there."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            aside = path
            if _TMP_NAME.match(path.name) is None:  # free the name first: one atomic rename
                stem = path.name.removesuffix(SUFFIX)
                stem = stem if re.fullmatch("[0-9a-f]{64}", stem) else "stats"
                aside = path.with_name(f".{stem}.{os.getpid()}.{time.monotonic_ns()}{TMP_SUFFIX}")
                try:
                    os.rename(path, aside)
                except FileNotFoundError:
                    return False
            shutil.rmtree(aside, ignore_errors=True)
        return True

    def evict(self, max_bytes: int, keep: str | None = None) -> list[EntryFile]:
        """Remove least recently used regular entries until entries and temporary files take at
        most ``max_bytes``; ``keep`` (the entry just written) stays, even alone over the cap."""
        files = [f for f in self.entries() if f.regular]
        total = sum(f.size for f in files) + sum(t.size for t in self.temp_files())
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

    def clear(self) -> int:
        """Remove every entry and the temporary files of writers that are gone; the count."""
        return sum(self.remove(f.path) for f in self.entries()) + self.remove_dead_temps()

    def prune(self, max_bytes: int) -> dict[str, int]:
        """Remove what is not a valid entry for its name and the temporary files of writers
        that are gone, then evict down to ``max_bytes``; counts by kind."""
        out = {"damaged": 0, "temp": 0, "evicted": 0}
        for f in self.entries():
            with contextlib.suppress(OSError, EntryError):
                self.meta(f)
                continue
            out["damaged"] += self.remove(f.path)  # 0 when it went meanwhile
        out["temp"] = self.remove_dead_temps()
        out["evicted"] = len(self.evict(max_bytes))
        return out

    def remove_dead_temps(self) -> int:
        """Remove temporary files whose writer is gone (or older than an hour)."""
        return sum(self.remove(t.path) for t in self.temp_files() if not t.alive)

    # locks and totals ---------------------------------------------------------------------------
    def _file_lock(self, path: str, timeout: float) -> filelock.FileLock:
        # filelock would make a missing folder again, readable by all (0755): when the cache
        # folder was removed meanwhile, fail instead, and let the next open make it (0700)
        if not os.path.isdir(self.locks):
            raise FileNotFoundError(errno.ENOENT, "the cache folder was removed", str(self.locks))
        import filelock

        return filelock.FileLock(path, timeout=timeout, mode=0o600)

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[str]:
        """Hold the lock of ``key``'s stripe (256 lock files: the folder stays bounded). Yields
        ``"held"``, else ``"timeout"`` or ``"failed"`` (read-only, full): go on uncoordinated."""
        import filelock

        path = str(self.locks / f"{key[:2]}.lock")
        try:
            lock = self._file_lock(path, timeout)
            lock.acquire()
        except filelock.Timeout:
            log.warning("cache_lock_timeout", key=key, timeout_s=timeout, lock=path)
            yield "timeout"
            return
        except OSError as exc:  # read-only folder, full disk: go on without coordination
            log.warning("cache_lock_failed", key=key, lock=path, error=str(exc))
            yield "failed"
            return
        try:
            yield "held"
        finally:
            lock.release()

    def totals(self) -> dict[str, int]:
        """The folder's hit/miss totals, ``{}`` when there are none or they are unreadable (only
        a small regular file is read, opened like an entry: no blocking, no link followed)."""
        try:
            fd = os.open(self.stats_file, _OPEN_FLAGS)
            try:
                st = os.fstat(fd)
                small = stat.S_ISREG(st.st_mode) and st.st_size <= _MAX_STATS_BYTES
                data = json.loads(os.read(fd, _MAX_STATS_BYTES)) if small else {}
            finally:
                os.close(fd)
        except (OSError, ValueError):
            data = {}
        items = data.items() if isinstance(data, dict) else ()
        return {k: v for k, v in items if isinstance(v, int)}

    def add_totals(self, delta: dict[str, int]) -> None:
        """Add ``delta`` to the totals (under a lock, atomic rewrite); raises ``OSError``."""
        with self._file_lock(str(self.locks / "stats.lock"), 5.0):
            total = self.totals()
            for k, v in delta.items():
                total[k] = total.get(k, 0) + v
            write_atomic(self.stats_file, json.dumps(total, sort_keys=True).encode(), ".stats.")
