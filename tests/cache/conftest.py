"""Helpers for the netcl-cache tests: small real kernels, a result check, captured log events."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

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
