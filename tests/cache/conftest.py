"""Helpers for the netcl-cache tests: small real kernels, a result check, captured log events,
a real redis-server on loopback (Debian's; skipped with the install command when absent, a
failure under CI=true)."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core import log
from netcl.runtime.cache import _remote

ADD_SRC = """
__kernel void add(__global const float *a, __global const float *b, __global float *c) {
    const int i = get_global_id(0);
    c[i] = a[i] + b[i] + OFFSET;
}
"""


def _add_src(offset: float = 0.0, tag: str = "") -> str:
    """An add kernel computing a + b + offset; ``tag`` makes the source text unique."""
    return f"// {tag}\n#define OFFSET {offset:.1f}f\n" + ADD_SRC


def _check_add(queue: cl.CommandQueue, prg: cl.Program, offset: float = 0.0) -> None:
    """Run ``prg.add`` on 64 elements and assert the result."""
    n = 64
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 2.0, dtype=np.float32)
    mf = cl.mem_flags
    ctx = queue.context
    da = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    db = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    dc = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
    knl = cl.Kernel(prg, "add")
    knl(queue, (n,), None, da, db, dc)
    out = np.empty_like(a)
    cl.enqueue_copy(queue, out, dc)
    np.testing.assert_allclose(out, a + b + offset)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def device(ctx: cl.Context) -> cl.Device:
    return ctx.devices[0]


@pytest.fixture
def add_src() -> Callable[..., str]:
    """``add_src(offset=0.0, tag="")``: an add kernel computing a + b + offset."""
    return _add_src


@pytest.fixture
def check_add(queue: cl.CommandQueue) -> Callable[..., None]:
    """``check_add(prg, offset=0.0)``: run ``prg.add`` and assert its result."""
    return lambda prg, offset=0.0: _check_add(queue, prg, offset)


@pytest.fixture
def log_events(caplog: pytest.LogCaptureFixture) -> Callable[[str], list[logging.LogRecord]]:
    """``log_events(name)``: the captured log records of structlog event ``name``."""
    return lambda name: [r for r in caplog.records if getattr(r, "event", None) == name]


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail (instead of hanging the suite) when the test blocks for more than 60 s: a blocking
    read of a FIFO, or reading /dev/zero whole, is interrupted by SIGALRM."""

    def expire(signum: int, frame: object) -> None:
        # pytest.fail raises a BaseException: no `except OSError` in the code under test eats it
        signal.alarm(5)  # and again, should something swallow this one too
        pytest.fail("the test blocked for 60 s (a read that waits on a FIFO or device?)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# a real redis-server ------------------------------------------------------------------------

PASSWORD = "test-pass-0123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process on 127.0.0.1 (password, no persistence) in a private folder."""

    def __init__(self, exe: str, folder: Path) -> None:
        self.exe = exe
        self.folder = folder
        self.port = _free_port()
        self.password = PASSWORD
        self.url = f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--requirepass",
                PASSWORD,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def redis_exe(service_binary: Callable[[str, str], str]) -> str:
    exe = service_binary("redis-server", "apt-get install redis-server")
    pytest.importorskip("redis", reason="redis-py missing: pip install 'netcl-cache[redis]'")
    return exe


@pytest.fixture(scope="module")
def server(redis_exe: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(redis_exe, tmp_path_factory.mktemp("redis"))
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture
def own_server(redis_exe: str, tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test alone (it gets killed or reconfigured)."""
    srv = RedisServer(redis_exe, tmp_path / "redis")
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture
def fresh_remote(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a new process: no remote tier or warning remembered, no remote in the environment."""
    monkeypatch.setattr(_remote, "_TIERS", {})
    monkeypatch.setattr(log, "_warned", set())  # warn_once's memory
    for name in ("NETCL_CACHE_REMOTE", "NETCL_CACHE_REMOTE_KEY", "NETCL_CACHE_REMOTE_UNSIGNED"):
        monkeypatch.delenv(name, raising=False)
