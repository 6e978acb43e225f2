"""The disk tier: one file per key in a private folder, atomic writes, a lock per key stripe,
LRU eviction by modification time (a hit touches its file). Anything may sit at an entry's path
(a FIFO, a link, a folder, a sparse 8 GB file): entries are opened without blocking or following
links, read only as far as their header declares, and every operation handles every kind of
file. Temporary files, ``.<key>.<writer pid>.<random>.tmp``, count against the cap."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock

from netcl.core.log import get_logger
from netcl.runtime.cache._entry import EntryError, decode, read_file

__all__ = ["DiskStore", "EntryFile", "TempFile", "UntrustedFolderError", "pid_alive", "probe",
           "refusal", "write_atomic"]  # fmt: skip

log = get_logger("netcl.runtime.cache")

SUFFIX = ".clprg"
TMP_SUFFIX = ".tmp"
#: Temporary files older than this are left-overs whatever their pid says (a pid can be reused);
#: those whose writer is no longer running go at once.
STALE_TMP_S = 3600.0
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# `.<key or "stats">.<pid>.<mkstemp's random part>.tmp`; `.<key>.<random>.tmp` from older writers
_TMP_NAME = re.compile(r"^\.(?:[0-9a-f]{64}|stats)\.(?:(\d+)\.)?[A-Za-z0-9_]+\.tmp$")


class UntrustedFolderError(PermissionError):
    """A cache folder that is not a folder, not ours, or writable by others."""


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


_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"),
          (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"))  # fmt: skip


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "device")


def _usage(st: os.stat_result) -> int:
    """Bytes a file takes: its size, or its allocated blocks when fewer (a sparse file)."""
    if not stat.S_ISREG(st.st_mode):
        return 0
    return min(st.st_size, getattr(st, "st_blocks", st.st_size // 512 + 1) * 512)


def _why(path: Path | str, st: os.stat_result) -> str | None:
    """Why the folder ``path`` cannot be trusted (None: it can). A folder others can write
    lets them plant binaries that this process would run on its device."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return None
    return f"{path} is not trusted ({why})"


def refusal(root: Path, *, create: bool = False) -> str | None:
    """Why the cache would refuse the folder ``root`` (it, ``programs/`` or ``locks/`` is not a
    folder, or not trusted), None when it would use it; with ``create`` the missing ones are made
    (0700) first. Raises ``OSError`` when a folder cannot be examined (or made)."""
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
    None when it could. Found out by making and removing a folder in it (or the nearest one
    above): the one test that also holds for root and for special file systems (/proc)."""
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


def write_atomic(target: Path, data: bytes, prefix: str) -> None:
    """Write ``target`` through a temporary file renamed into place: a reader sees the old file
    or the new one, never a part; nothing is left behind on error."""
    # `<prefix><pid>.<random>.tmp`: prune knows whose it is and whether its writer still runs
    fd, tmp = tempfile.mkstemp(
        prefix=f"{prefix}{os.getpid()}.", suffix=TMP_SUFFIX, dir=target.parent
    )
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
    ``root/stats.json``; :meth:`open` refuses a folder it cannot trust."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.programs = root / "programs"
        self.locks = root / "locks"
        self._prefix = os.path.join(self.programs, "")  # str paths: a hit skips pathlib

    @classmethod
    def open(cls, root: Path) -> DiskStore:
        """The store at ``root``, its folders made (0700) when missing; raises
        :class:`UntrustedFolderError` or ``OSError`` (cannot create)."""
        why = refusal(root, create=True)
        if why is not None:
            raise UntrustedFolderError(why)
        return cls(root)

    # entries ------------------------------------------------------------------------------------

    def path(self, key: str) -> Path:
        return self.programs / (key + SUFFIX)

    def read(self, key: str) -> bytes | None:
        """The bytes of entry ``key`` (None: there is none); EntryError for what is not a
        regular file or is too large, ``OSError`` when it cannot be read."""
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

    def touch(self, key: str) -> None:
        """Mark an entry used now (LRU order); failures (read-only folder) are harmless."""
        with contextlib.suppress(OSError):
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
        found = [EntryFile(e.name[: -len(SUFFIX)], Path(e.path), _usage(st), st.st_mtime,
                           _kind(st.st_mode))
                 for e, st in self._scan() if e.name.endswith(SUFFIX) and e.name[0] != "."]
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
        removed = sum(self.remove(f.path) for f in self.entries())
        return removed + self.remove_dead_temps()

    def prune(self, max_bytes: int) -> dict[str, int]:
        """Remove what is not a valid entry for its name and the temporary files of writers
        that are gone, then evict down to ``max_bytes``; counts by kind."""
        out = {"damaged": 0, "temp": 0, "evicted": 0}
        for f in self.entries():
            with contextlib.suppress(OSError, EntryError):
                if f.regular and decode(self.read(f.key) or b"", f.key):
                    continue
            out["damaged"] += self.remove(f.path)  # 0 when it went meanwhile
        out["temp"] = self.remove_dead_temps()
        out["evicted"] = len(self.evict(max_bytes))
        return out

    def remove_dead_temps(self) -> int:
        """Remove temporary files whose writer is gone (or older than an hour)."""
        return sum(self.remove(t.path) for t in self.temp_files() if not t.alive)

    # locks --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[str]:
        """Hold the lock of ``key``'s stripe (256 lock files: the folder stays bounded). Yields
        ``"held"``, else ``"timeout"`` or ``"failed"`` (read-only, full): go on uncoordinated."""
        lock = filelock.FileLock(str(self.locks / f"{key[:2]}.lock"), timeout=timeout, mode=0o600)
        try:
            self.check_locks()
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

    def check_locks(self) -> None:
        """``FileNotFoundError`` when ``locks/`` is gone (before a lock file is made there)."""
        # filelock would make a missing folder again, readable by all (0755): when the cache
        # folder was removed meanwhile, fail instead, and let the next open make it (0700)
        if not os.path.isdir(self.locks):
            raise FileNotFoundError(errno.ENOENT, "the cache folder was removed", str(self.locks))
