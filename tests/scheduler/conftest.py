"""Fixtures of the scheduler tests: a second queue on the same context and a small program."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pytest

SOURCE = """
// a producer slow enough that a consumer on another queue, left unordered, reads stale data
__kernel void produce(__global uint *out, int iters) {
    uint i = get_global_id(0);
    uint x = i;
    for (int k = 0; k < iters; ++k) x = x * 1664525u + 1013904223u;
    out[i] = x;
}
__kernel void consume(__global const uint *in, __global uint *out) {
    uint i = get_global_id(0);
    out[i] = in[i] ^ 0x5a5a5a5au;
}
__kernel void scale(__global float *a, float k) {
    uint i = get_global_id(0);
    a[i] = a[i] * k;
}
// one work item: counts how many times an op's kernel ran
__kernel void bump(__global uint *counts, uint k) {
    counts[k] += 1u;
}
"""


@dataclass
class Kernels:
    produce: cl.Kernel
    consume: cl.Kernel
    scale: cl.Kernel
    bump: cl.Kernel


@pytest.fixture(scope="session")
def kernels(ctx: cl.Context) -> Kernels:
    prg = cl.Program(ctx, SOURCE).build()
    return Kernels(*(cl.Kernel(prg, name) for name in ("produce", "consume", "scale", "bump")))


@pytest.fixture(scope="session")
def queue_b(ctx: cl.Context) -> cl.CommandQueue:
    """A second in-order queue on the same context: nothing orders it against ``queue``."""
    return cl.CommandQueue(ctx)


@pytest.fixture
def gate(ctx: cl.Context) -> Iterator[cl.UserEvent]:
    """A user event that holds back commands waiting on it; always released at teardown so no
    command stays stuck in a queue."""
    ev = cl.UserEvent(ctx)
    yield ev
    if ev.command_execution_status != cl.command_execution_status.COMPLETE:
        with contextlib.suppress(cl.Error):  # already set by the test (complete or failed)
            ev.set_status(cl.command_execution_status.COMPLETE)


def _produced(n: int, iters: int) -> npt.NDArray[np.uint32]:
    x = np.arange(n, dtype=np.uint32)
    a, c = np.uint32(1664525), np.uint32(1013904223)
    for _ in range(iters):
        x = x * a + c
    return x


@pytest.fixture(scope="session")
def expected_consumed() -> Callable[[int, int], npt.NDArray[np.uint32]]:
    """``expected_consumed(n, iters)``: what ``consume`` writes after ``produce``, on the host."""
    return lambda n, iters: _produced(n, iters) ^ np.uint32(0x5A5A5A5A)


@pytest.fixture
def release_later() -> Iterator[Callable[..., threading.Timer]]:
    """``release_later(user_event, delay, status=COMPLETE)``: set the status from a timer thread
    after ``delay`` seconds. Timers are joined at teardown."""
    timers: list[threading.Timer] = []

    def start(ev: cl.UserEvent, delay: float, status: int = 0) -> threading.Timer:
        timer = threading.Timer(delay, ev.set_status, args=(status,))
        timers.append(timer)
        timer.start()
        return timer

    yield start
    for t in timers:
        t.join(10)


@pytest.fixture
def uint_buffer(ctx: cl.Context, queue: cl.CommandQueue) -> Callable[..., cl.Buffer]:
    """``uint_buffer(n, fill=0)``: a device buffer of ``n`` uint32, filled (blocking)."""

    def make(n: int, fill: int = 0) -> cl.Buffer:
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n * 4)
        cl.enqueue_fill_buffer(queue, buf, np.uint32(fill), 0, n * 4).wait()
        return buf

    return make
