"""Build errors, untrusted folders, read-only folders, a full disk, lock timeouts."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import filelock
import pyopencl as cl
import pytest

from netcl.runtime.cache import ProgramBuildError, ProgramCache
from netcl.runtime.cache._program_cache import _Registry

BAD_SRC = "__kernel void broken(__global float *x) { x[0] = undeclared_name; }\n"


def test_build_error_carries_log_and_device_and_is_not_cached(
    ctx: cl.Context, device: cl.Device, cache_dir: Path
) -> None:
    c = ProgramCache(cache_dir)
    for _ in range(2):  # failures are not cached: the second call compiles and fails again
        with pytest.raises(ProgramBuildError) as info:
            c.get_program(ctx, BAD_SRC, device, "-DX=1")
        err = info.value
        assert "undeclared_name" in err.log
        assert err.device_name == device.name and err.options == "-DX=1"
        # the driver's error code, on the error and in its message
        assert err.code == cl.status_code.BUILD_PROGRAM_FAILURE
        assert f"(error {cl.status_code.BUILD_PROGRAM_FAILURE})" in str(err)
        assert device.name in str(err) and "undeclared_name" in str(err)
        assert isinstance(err.__cause__, cl.RuntimeError)
        assert ProgramCache.BuildError is ProgramBuildError  # the old spelling still works
    assert c.stats.compiles == 2
    assert c.entries() == []
    assert c._tier.key_locks == {}  # the per-program build lock does not outlive a failed build


GROUP_OR_WORLD = {  # folder -> mode: writable by others, or only by the group, is not trusted
    "world-writable": ("programs", 0o777),
    "group-writable-programs": ("programs", 0o770),
    "group-writable-locks": ("locks", 0o730),
    "group-writable-root": (".", 0o720),
}


@pytest.mark.parametrize("how", [*GROUP_OR_WORLD, "other-owner"])
def test_untrusted_folder_is_not_used(
    how: str,
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    ProgramCache(cache_dir, registry=_Registry()).get_program(ctx, add_src(1.0, "trust"), device)
    if how in GROUP_OR_WORLD:
        sub, mode = GROUP_OR_WORLD[how]
        os.chmod(cache_dir / sub, mode)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")  # CI runs as root
        os.chown(cache_dir, 12345, 12345)
    c = ProgramCache(cache_dir, registry=_Registry())  # as a new process: checked again
    with (
        caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"),
        pytest.warns(RuntimeWarning, match="is not used .* is not trusted"),
    ):
        check_add(c.get_program(ctx, add_src(1.0, "trust"), device), 1.0)
    assert c.stats.disk_hits == 0 and c.stats.compiles == 1  # the planted entry is not loaded
    (event,) = log_events("cache_dir_untrusted")
    assert "not trusted" in event.reason  # type: ignore[attr-defined]


def test_folder_that_cannot_be_created(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    (tmp_path / "file").write_text("a regular file where a folder should be")
    c = ProgramCache(tmp_path / "file" / "cache")
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
        with pytest.warns(RuntimeWarning, match="cannot be used .*Not a directory") as warned:
            check_add(c.get_program(ctx, add_src(0.0, "nodir"), device), 0.0)
        check_add(c.get_program(ctx, add_src(1.0, "nodir"), device), 1.0)
    assert c.stats.compiles == 2
    (event,) = log_events("cache_dir_unusable")  # warned once, not per call
    assert "Not a directory" in event.error  # type: ignore[attr-defined]
    # the warning says what it costs and what to do, in full
    assert str(warned[0].message).endswith(
        "; programs compiled now are not kept on disk. Set NETCL_CACHE_DIR to a folder of your "
        "own that you can write (it is created, private to you, when missing)."
    )


def _inject(monkeypatch: pytest.MonkeyPatch, folder: Path, code: int, *, on: str) -> list[str]:
    """Make ``os.write`` (on="write") or creating files (on="create") fail with ``code`` for
    files inside ``folder`` only: fault injection at the system-call wrappers."""
    hits: list[str] = []
    real_write, real_open = os.write, os.open
    prefix = str(folder)

    def write(fd: int, data: bytes) -> int:  # type: ignore[override]
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(prefix):
            hits.append(target)
            raise OSError(code, os.strerror(code), target)
        return real_write(fd, data)

    def open_(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & os.O_CREAT and str(path).startswith(prefix):
            hits.append(str(path))
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    if on == "write":
        monkeypatch.setattr(os, "write", write)
    else:
        monkeypatch.setattr(os, "open", open_)
    return hits


def test_disk_full_on_write(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "enospc-old"), device)  # an intact older entry
    hits = _inject(monkeypatch, cache_dir, errno.ENOSPC, on="write")
    with (
        caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"),
        pytest.warns(RuntimeWarning, match="cannot be written .No space left on device"),
    ):
        check_add(c.get_program(ctx, add_src(2.0, "enospc"), device), 2.0)
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):  # warned once already
        check_add(c.get_program(ctx, add_src(3.0, "enospc-2"), device), 3.0)
    monkeypatch.undo()
    assert hits, "the fault was not reached"
    (event,) = log_events("cache_write_failed")  # once per folder
    assert event.errno == errno.ENOSPC  # type: ignore[attr-defined]
    # the error as the system gave it, naming the file being written
    assert event.error == (  # type: ignore[attr-defined]
        f"[Errno {errno.ENOSPC}] No space left on device: '{hits[0]}'"
    )
    # the entry that could not be written, not only its folder
    key = event.key  # type: ignore[attr-defined]
    assert event.path == str(cache_dir / "programs" / f"{key}.clprg")  # type: ignore[attr-defined]
    assert c.stats.write_errors == 2  # each write that failed
    # no temporary file is left behind and the older entry is intact
    assert [p.name for p in (cache_dir / "programs").iterdir() if p.name.startswith(".")] == []
    c2 = ProgramCache(cache_dir)
    c2.get_program(ctx, add_src(0.0, "enospc-old"), device)
    assert c2.stats.disk_hits == 1 and len(c2.entries()) == 1


def test_read_only_folder(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A populated folder that became read-only (EROFS on every file creation: tests run as
    root, for whom chmod does not stop writes): hits still load, misses compile and warn."""
    ProgramCache(cache_dir).get_program(ctx, add_src(1.0, "ro-old"), device)
    hits = _inject(monkeypatch, cache_dir, errno.EROFS, on="create")
    c = ProgramCache(cache_dir)
    with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
        check_add(c.get_program(ctx, add_src(1.0, "ro-old"), device), 1.0)
        with pytest.warns(RuntimeWarning, match="cannot be written .Read-only file system"):
            check_add(c.get_program(ctx, add_src(2.0, "ro-new"), device), 2.0)
    monkeypatch.undo()
    assert hits
    assert c.stats.disk_hits == 1 and c.stats.compiles == 1 and c.stats.write_errors == 1
    assert log_events("cache_write_failed")
    assert len(ProgramCache(cache_dir).entries()) == 1


def test_lock_timeout_falls_back_to_compiling(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    """Another holder keeps the key's lock: after the bounded wait this process compiles."""
    c = ProgramCache(cache_dir, lock_timeout=0.3)
    src = add_src(5.0, "locked")
    c.entries()  # creates the folders
    from netcl.core.device import device_identity
    from netcl.runtime.cache import _entry

    key = _entry.compute_key(src.encode(), "", device_identity(device))
    held = threading.Event()
    done = threading.Event()

    def holder() -> None:
        with filelock.FileLock(str(cache_dir / "locks" / f"{key[:2]}.lock")):
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    try:
        with caplog.at_level(logging.WARNING, logger="netcl.runtime.cache"):
            check_add(c.get_program(ctx, src, device), 5.0)
    finally:
        done.set()
        t.join()
    assert c.stats.lock_timeouts == 1 and c.stats.compiles == 1
    assert log_events("cache_lock_timeout")
    assert len(c.entries()) == 1  # it still stored its result


def test_a_folder_removed_while_running_is_made_again(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    """Someone deletes the cache folder under a running process (rm -rf ~/.cache): the write
    that finds it gone fails, the next lookup makes it again and stores its program. The lock
    and the write that failed are logged, naming the folder gone and the entry not written."""
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "gone-a"), device)
    shutil.rmtree(cache_dir)
    check_add(c.get_program(ctx, add_src(1.0, "gone-b"), device), 1.0)  # its write fails
    assert c.stats.write_errors == 1
    (locked,) = log_events("cache_lock_failed")
    assert locked.error == (  # type: ignore[attr-defined]
        f"[Errno 2] the cache folder was removed: '{cache_dir / 'locks'}'"
    )
    (failed,) = log_events("cache_write_failed")
    key = failed.key  # type: ignore[attr-defined]
    assert failed.path == str(cache_dir / "programs" / f"{key}.clprg")  # type: ignore[attr-defined]
    assert failed.errno == errno.ENOENT  # type: ignore[attr-defined]
    # the error as the system gave it, naming the temporary file of the entry
    assert failed.error.startswith(  # type: ignore[attr-defined]
        f"[Errno 2] No such file or directory: '{cache_dir / 'programs' / ('.' + key)}."
    )
    check_add(c.get_program(ctx, add_src(2.0, "gone-c"), device), 2.0)  # made again
    assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o700
    assert c.stats.write_errors == 1 and len(c.entries()) == 1
    fresh = ProgramCache(cache_dir)
    check_add(fresh.get_program(ctx, add_src(2.0, "gone-c"), device), 2.0)
    assert fresh.stats.disk_hits == 1


def test_two_caches_of_one_process_both_find_their_folder_removed(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[logging.LogRecord]],
) -> None:
    """Two caches of one folder (one process, one registry): the folder is removed, and each
    write that finds it gone is a write error of its cache, never a failed lookup; the next
    lookup makes it again."""
    registry = _Registry()
    one, two = (ProgramCache(cache_dir, registry=registry) for _ in range(2))
    one.get_program(ctx, add_src(0.0, "gone-twice-a"), device)
    two.get_program(ctx, add_src(0.0, "gone-twice-a"), device)  # a disk hit: the folder is open
    shutil.rmtree(cache_dir)
    check_add(one.get_program(ctx, add_src(1.0, "gone-twice-b"), device), 1.0)
    check_add(two.get_program(ctx, add_src(2.0, "gone-twice-c"), device), 2.0)
    assert one.stats.write_errors == 1 and two.stats.write_errors == 1
    assert len(log_events("cache_write_failed")) == 2
    check_add(two.get_program(ctx, add_src(3.0, "gone-twice-d"), device), 3.0)  # made again
    assert len(two.entries()) == 1 and two.stats.write_errors == 1
