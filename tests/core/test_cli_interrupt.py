"""The `netcl` command and the demo as a user meets them: a bad option is reported by the
subcommand that got it, Ctrl-C ends with one line and exit status 130, and progress written to
a log has no carriage returns."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the script beside the interpreter (a virtual environment's), else the one on PATH (a system
# Python with the distributions installed elsewhere, as on the GPU machine: docs, Running on a GPU)
_BESIDE = Path(sys.executable).with_name("netcl")
NETCL = str(_BESIDE) if _BESIDE.exists() else shutil.which("netcl") or str(_BESIDE)
DEMO = Path(__file__).resolve().parents[2] / "demo" / "demo.py"


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["cache", "stats", "-v"], "netcl cache stats"),
        (["cache", "-v", "list"], "netcl cache list"),
        (["info", "--bogus"], "netcl info"),
    ],
)
def test_unknown_option_is_reported_by_its_subcommand(
    argv: list[str], prog: str, tmp_path: Path
) -> None:
    proc = subprocess.run([NETCL, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"{prog}: error: unrecognized arguments: "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _wait_for(proc: subprocess.Popen[bytes], needle: bytes, seconds: float) -> bytes:
    """stderr until ``needle`` shows up (the process is then where the test wants it)."""
    assert proc.stderr is not None
    seen = b""
    deadline = time.monotonic() + seconds
    while needle not in seen:
        assert time.monotonic() < deadline, seen
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, seen  # ended before getting there
        seen += chunk
    return seen


# `netcl` itself, and `main()` writing to a stream without isatty() (a logging shim): neither
# is a terminal, so neither gets the fresh line a terminal's echoed ^C needs
_NO_ISATTY = """
import sys
from netcl.core import cli

class Shim:
    def write(self, text): return sys.__stderr__.write(text)
    def flush(self): sys.__stderr__.flush()

sys.stderr = Shim()
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "how", [[NETCL], [sys.executable, "-c", _NO_ISATTY]], ids=["netcl", "stderr_without_isatty"]
)
def test_ctrl_c_in_netcl_is_one_line_and_130(tmp_path: Path, how: list[str]) -> None:
    """`netcl cache stats` waiting on a remote that never answers, interrupted."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing ever replies
    env = {
        **os.environ,
        "NETCL_CACHE_REMOTE": f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
        "NETCL_CACHE_REMOTE_KEY": "k",
        "NETCL_CACHE_REMOTE_TIMEOUT": "60",
    }
    pytest.importorskip("redis")
    with silent:
        proc = subprocess.Popen(
            [*how, "cache", "stats", "--dir", str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        held: list[socket.socket] = []  # kept open: the client waits on it for an answer
        deadline = time.monotonic() + 60
        while not _accept(silent, held) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert err.decode() == "netcl: interrupted\n", err


def _accept(server: socket.socket, held: list[socket.socket]) -> bool:
    server.settimeout(0.05)
    try:
        held.append(server.accept()[0])
    except TimeoutError:
        return False
    return True


def test_demo_ctrl_c_and_progress_in_a_log(tmp_path: Path) -> None:
    """The demo with stderr to a pipe (as in a log): no `\\r`; Ctrl-C during --linger: 130, one
    line, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--steps", "3000", "--no-console", "--linger", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        seen = _wait_for(proc, b" s more\n", 400)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
    err = (seen + rest).decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.splitlines()[-1] == "demo.py: interrupted", err
    assert "\r" not in err, err
    for line in err.splitlines():
        if line.startswith("replaying"):
            assert line.count("replaying") == 1, line
