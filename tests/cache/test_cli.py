"""`netcl cache` for scripts: one JSON document, every counter, exit codes, options anywhere,
no traceback for a user error, a closed pipe ends quietly."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.core import cli
from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._store import CacheStats

NETCL = str(Path(sys.executable).with_name("netcl"))
COUNTERS = [f for f in CacheStats.__dataclass_fields__]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NETCL, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _one_line_no_traceback(err: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("action", ["stats", "list", "clear", "prune"])
def test_json_on_a_folder_not_created_yet(
    action: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "not-yet"
    assert cli.main(["cache", action, "--json", "--dir", str(missing)]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # the whole of stdout is one JSON document
    assert doc["exists"] is False and doc["cache_dir"] == str(missing)
    if action == "stats":  # every counter, zeros included
        for name in [*COUNTERS, "entries", "bytes", "temp_files", "temp_bytes", "hits"]:
            assert doc[name] == 0, name
    assert not missing.exists()  # nothing created

    if action == "stats":  # and in words
        assert cli.main(["cache", action, "--dir", str(missing)]) == 0
        assert f"{missing} (not created yet)" in capsys.readouterr().out


def test_list_names_each_entrys_kind_device_and_options(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "list-row"), device, options=["-DX=1"])
    assert cli.main(["cache", "list", "--json", "--dir", str(cache_dir)]) == 0
    (row,) = json.loads(capsys.readouterr().out)["entries"]
    assert (row["kind"], row["status"], row["options"]) == ("file", "ok", "-DX=1")
    assert row["device"] == device.name.strip()
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit):
        cli.main(["cache", "list", "--help"])
    assert "--dir DIR" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["cache", "--dir", "{d}", "--json", "stats"],
        ["cache", "stats", "--dir", "{d}", "--json"],
        ["cache", "--json", "stats", "--dir", "{d}"],
        ["cache", "--dir", "/elsewhere", "stats", "--dir", "{d}", "--json"],  # the last wins
    ],
)
def test_options_before_or_after_the_action(
    argv: list[str],
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "opts-anywhere"), device)
    assert cli.main([a.format(d=cache_dir) for a in argv]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cache_dir"] == str(cache_dir) and doc["entries"] == 1


def test_refusals_exit_1_with_one_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    untrusted = tmp_path / "untrusted"
    untrusted.mkdir(mode=0o777)
    os.chmod(untrusted, 0o777)
    for folder, why in [(a_file, "is not a directory"), (untrusted, "is not trusted")]:
        for action in ("stats", "list", "clear", "prune"):
            assert cli.main(["cache", action, "--dir", str(folder), "--json"]) == 1
            out, err = capsys.readouterr()
            doc = json.loads(out)
            assert doc["exit_code"] == 1 and why in doc["error"]
            _one_line_no_traceback(err)
            assert why in err


def test_read_only_folder_exit_1(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EROFS on every removal inside the folder (tests run as root, whom chmod does not stop)."""
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, "ro-cli"), device)
    real_unlink = os.unlink
    prefix = str(cache_dir)

    def unlink(path: str | os.PathLike[str], *a: object, **kw: object) -> None:
        if str(path).startswith(prefix):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", unlink)
    assert cli.main(["cache", "clear", "--dir", str(cache_dir)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    _one_line_no_traceback(err)
    assert "Read-only file system" in err
    assert cli.main(["cache", "prune", "--max-bytes", "0", "--dir", str(cache_dir), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["exit_code"] == 1


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["cache", "prune", "--max-bytes", "abc"], {}, "argument --max-bytes: expected a byte"),
        (["cache", "prune", "--max-bytes", "-1"], {}, "got '-1'"),
        (["cache", "stats"], {"NETCL_CACHE_MAX_BYTES": "10X"}, "NETCL_CACHE_MAX_BYTES"),
        (["cache", "stats", "--json"], {"NETCL_CACHE_DISABLE": "maybe"}, "NETCL_CACHE_DISABLE"),
        (["cache", "explode"], {}, "invalid choice: 'explode'"),
        (["cache"], {}, "required: ACTION"),
        (["cache", "list", "--frobnicate"], {}, "unrecognized arguments: --frobnicate"),
    ],
)
def test_usage_errors_exit_2_in_one_line(
    argv: list[str], env: dict[str, str], needle: str, tmp_path: Path
) -> None:
    proc = _run(*argv, "--dir", str(tmp_path), env=env)
    assert proc.returncode == 2, proc
    _one_line_no_traceback(proc.stderr)
    assert needle in proc.stderr
    if "--json" in argv and proc.stdout:  # our own checks still answer in JSON
        assert json.loads(proc.stdout)["exit_code"] == 2


def test_bad_env_is_only_a_warning_for_actions_that_do_not_need_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "10X")
    assert cli.main(["cache", "prune", "--max-bytes", "1M", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert cli.main(["cache", "list", "--json", "--dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == []


def test_closed_pipe_ends_quietly(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    c = ProgramCache(cache_dir)
    for i in range(40):
        c.get_program(ctx, add_src(float(i), "pipe"), device)
    # the reader is gone before the command writes anything: every write fails with EPIPE
    for args in (["cache", "list", "--dir", str(cache_dir)], ["info"]):
        proc = subprocess.Popen([NETCL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 1
        assert err == "", err
    # and as a user types it
    shell = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {NETCL} cache list --dir {cache_dir} | head -1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in shell.stderr and "BrokenPipe" not in shell.stderr
    assert len(shell.stdout.splitlines()) == 1


@pytest.mark.parametrize("sub", ["locks", "programs", "."])
def test_every_action_refuses_what_the_cache_refuses(
    sub: str,
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
) -> None:
    """A folder the library would not use (here: writable by others) is refused by every
    action with exit 1 and one line naming it, and nothing in it is removed."""
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, f"refuse-{sub}"), device)
    (entry,) = ProgramCache(cache_dir).entries()
    os.chmod(cache_dir / sub, 0o777)
    for action in ("stats", "list", "clear", "prune"):
        proc = _run("cache", action, "--dir", str(cache_dir))
        assert proc.returncode == 1, (action, proc.stdout, proc.stderr)
        _one_line_no_traceback(proc.stderr)
        assert f"{cache_dir / sub} is not trusted" in proc.stderr, proc.stderr
        assert entry.path.exists(), action
