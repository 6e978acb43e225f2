"""A cache folder that cannot be used (cannot be created, not trusted, not writable): one
warning a user sees with no logging set up, `netcl cache` says "unusable" with exit 1, and the
statistics count what happened. Through the real `python` and `netcl` commands, as typed."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.core import cli
from netcl.runtime.cache import ProgramCache

NETCL = str(Path(sys.executable).with_name("netcl"))

USE = textwrap.dedent("""
    import json
    from netcl.core import device
    from netcl.runtime.cache import ProgramCache, cacher
    ctx = device.default_context()
    for i in range(3):  # three programs, then a second instance on the same folder
        cacher.get_program(ctx, f"__kernel void k(__global float *x) {{ x[0] = {i}.0f; }}")
    ProgramCache().get_program(ctx, "__kernel void k(__global float *x) { x[0] = 9.0f; }")
    print(json.dumps(cacher.stats.as_dict()))
""")


def _python(code: str, folder: Path | str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCL_")}
    env["NETCL_CACHE_DIR"] = str(folder)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )


def _netcl(*args: str, folder: Path | str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCL_")}
    env["NETCL_CACHE_DIR"] = str(folder)
    return subprocess.run([NETCL, *args], capture_output=True, text=True, timeout=120, env=env)


def _untrusted(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    return folder


FOLDERS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "cannot-be-created": (
        lambda _: Path("/proc/netcl"),
        "/proc/netcl cannot be used ([Errno 2] No such file or directory",
    ),
    "not-trusted": (_untrusted, "is not used ("),
}


@pytest.mark.parametrize("kind", sorted(FOLDERS))
def test_one_warning_without_logging_and_the_misses_counted(kind: str, tmp_path: Path) -> None:
    make, says = FOLDERS[kind]
    folder = make(tmp_path)
    out = _python(USE, folder)
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if "RuntimeWarning: netcl cache" in line]
    assert len(warned) == 1, out.stderr  # once, though four lookups and two instances missed
    assert f"the cache folder {folder}" in warned[0] and says in warned[0], warned[0]
    assert "NETCL_CACHE_DIR" in warned[0]  # what to do about it
    stats = json.loads(out.stdout)
    assert stats["misses"] == 3 and stats["compiles"] == 3 and stats["disk_hits"] == 0


@pytest.mark.parametrize("kind", sorted(FOLDERS))
def test_netcl_cache_says_unusable_and_exits_1(kind: str, tmp_path: Path) -> None:
    folder = FOLDERS[kind][0](tmp_path)
    for action in ("stats", "list", "clear", "prune"):
        out = _netcl("cache", action, folder=folder)
        assert out.returncode == 1, (action, out.stdout, out.stderr)
        assert out.stdout == "" and "Traceback" not in out.stderr
        (line,) = out.stderr.splitlines()
        assert line.startswith(f"netcl cache {action}: unusable: {folder} "), line
    out = _netcl("cache", "stats", "--json", folder=folder)
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["exit_code"] == 1 and doc["error"].startswith("unusable:")
    assert not Path("/proc/netcl").exists()


def test_a_folder_that_cannot_be_written(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Read-only (EROFS on every file or folder made inside it; tests run as root, whom chmod
    does not stop): stats says unusable, the library warns once and still compiles."""
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "ro-a"), device)  # it exists
    real_mkdtemp, real_mkstemp = tempfile.mkdtemp, tempfile.mkstemp

    def refuse(real: Callable[..., object]) -> Callable[..., object]:
        def made(*a: object, dir: str | os.PathLike[str] | None = None, **kw: object) -> object:
            if dir is not None and str(dir).startswith(str(cache_dir)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
            return real(*a, dir=dir, **kw)

        return made

    monkeypatch.setattr(tempfile, "mkdtemp", refuse(real_mkdtemp))
    monkeypatch.setattr(tempfile, "mkstemp", refuse(real_mkstemp))
    assert cli.main(["cache", "stats", "--dir", str(cache_dir)]) == 1
    err = capsys.readouterr().err
    assert (
        err == f"netcl cache stats: unusable: {cache_dir} is not writable (Read-only file system)\n"
    )
    assert cli.main(["cache", "list", "--dir", str(cache_dir)]) == 0  # reading still works
    capsys.readouterr()
    c = ProgramCache(cache_dir)
    with pytest.warns(RuntimeWarning, match="cannot be written .Read-only file system"):
        check_add(c.get_program(ctx, add_src(1.0, "ro-b"), device), 1.0)
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        check_add(c.get_program(ctx, add_src(2.0, "ro-c"), device), 2.0)
    assert later == []  # one warning per folder and process
    assert c.stats.write_errors == 2 and c.stats.misses == 2
