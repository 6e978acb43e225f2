"""netcl-core: telemetry fast path and BufferPool costs, with no OpenTelemetry SDK configured.

The fast path is what every hot path pays when nothing records: ``telemetry.tracing()`` against the
API's own no-op ``start_as_current_span``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyopencl as cl
import pyopencl.tools as cltools
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from netcl.core import telemetry
from netcl.core.memory import BufferPool

_tracer = telemetry.tracer("netcl.bench", "netcl-core")
_N = 1000  # calls per round: a single call is below the timer's resolution


def _loop_tracing() -> None:
    tracing = telemetry.tracing
    for _ in range(_N):
        if tracing():
            raise AssertionError("an SDK is configured in the benchmark process")


def _loop_noop_span() -> None:
    start = _tracer.start_as_current_span
    for _ in range(_N):
        with start("netcl.bench.noop"):
            pass


@pytest.mark.benchmark(group="core-telemetry")
def test_tracing_check(benchmark: BenchmarkFixture) -> None:
    """Per call: benchmark time / 1000. Target: well under 1 µs."""
    benchmark.extra_info["calls_per_round"] = _N
    benchmark(_loop_tracing)


@pytest.mark.benchmark(group="core-telemetry")
def test_noop_span_api(benchmark: BenchmarkFixture) -> None:
    """The anchor: what a span costs through the bare API with no SDK."""
    benchmark.extra_info["calls_per_round"] = _N
    benchmark(_loop_noop_span)


def _pool_cycle(pool: BufferPool) -> None:
    for _ in range(100):
        pool.release(pool.allocate((1024,), "float32"))


def _memorypool_cycle(pool: cltools.MemoryPool) -> None:
    for _ in range(100):
        pool.allocate(4096).release()


def _best(f: Callable[[], None], reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.benchmark(group="core-pool")
def test_pool_allocate_release(benchmark: BenchmarkFixture, queue: cl.CommandQueue) -> None:
    """100 allocate + release of 4 kB per round. ``pool_over_memorypool`` (extra_info): against
    pyopencl's MemoryPool on the same sizes, best times of rounds interleaved in this run
    (target <= 2)."""
    pool = BufferPool(queue)
    benchmark(_pool_cycle, pool)
    bare = cltools.MemoryPool(cltools.ImmediateAllocator(queue), leading_bits_in_bin_id=6)
    t_pool = t_bare = float("inf")
    for _ in range(1 if benchmark.disabled else 40):
        t_pool = min(t_pool, _best(lambda: _pool_cycle(pool)))
        t_bare = min(t_bare, _best(lambda: _memorypool_cycle(bare)))
    benchmark.extra_info.update(
        pool_us_per_cycle=round(t_pool * 1e4, 3),
        memorypool_us_per_cycle=round(t_bare * 1e4, 3),
        pool_over_memorypool=round(t_pool / t_bare, 3),
    )
    s = pool.stats
    assert s.live_tensors == 0 and s.misses == 1  # statistics kept: one block, reused


@pytest.mark.benchmark(group="core-pool")
def test_memorypool_allocate_release(benchmark: BenchmarkFixture, queue: cl.CommandQueue) -> None:
    """The anchor: pyopencl's MemoryPool with no bookkeeping around it."""
    pool = cltools.MemoryPool(cltools.ImmediateAllocator(queue), leading_bits_in_bin_id=6)
    benchmark(_memorypool_cycle, pool)
