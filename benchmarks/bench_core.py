"""netcl-core: telemetry fast path and BufferPool costs, with no OpenTelemetry SDK configured;
and what importing a netcl runtime package costs on top of pyopencl, in fresh processes.

The fast path is what every hot path pays when nothing records: ``telemetry.tracing()`` against the
API's own no-op ``start_as_current_span``.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import subprocess
import sys
from pathlib import Path

import pyopencl as cl
import pyopencl.tools as cltools
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from netcl.core import telemetry
from netcl.core.memory import BufferPool

sys.path.insert(0, str(Path(__file__).parent))
from paired import paired_floor, record_floor

_tracer = telemetry.Scope("netcl.bench", "netcl-core").tracer
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
    """Per call: benchmark time / 1000. Target: well under 1 µs. The no-op span loop is timed
    right before each round (paired rounds, see paired.py): the gate's ratio."""
    benchmark.extra_info["calls_per_round"] = _N
    setup, floor = paired_floor(_loop_noop_span)
    benchmark.pedantic(
        _loop_tracing, setup=setup, rounds=1 if benchmark.disabled else 200, warmup_rounds=2
    )
    record_floor(benchmark, floor)


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


@pytest.mark.benchmark(group="core-pool")
def test_pool_allocate_release(benchmark: BenchmarkFixture, queue: cl.CommandQueue) -> None:
    """100 allocate + release of 4 kB per round, with pyopencl's MemoryPool doing the same
    timed before each round (paired rounds, see paired.py): the gate's ratio (target <= 2).
    5000 rounds, about half a second: 500 (30 ms) read 2.27 once on a fresh H200 lease whose
    later runs read 1.86-1.94."""
    pool = BufferPool(queue)
    mempool = cltools.MemoryPool(cltools.ImmediateAllocator(queue), leading_bits_in_bin_id=6)
    setup, floor_times = paired_floor(lambda: _memorypool_cycle(mempool))
    benchmark.pedantic(
        _pool_cycle,
        args=(pool,),
        setup=setup,
        rounds=1 if benchmark.disabled else 5000,
        warmup_rounds=3,
    )
    record_floor(benchmark, floor_times)
    s = pool.stats
    assert s.live_tensors == 0 and s.misses == 1  # statistics kept: one block, reused


@pytest.mark.benchmark(group="core-pool")
def test_memorypool_allocate_release(benchmark: BenchmarkFixture, queue: cl.CommandQueue) -> None:
    """The anchor: pyopencl's MemoryPool with no bookkeeping around it."""
    pool = cltools.MemoryPool(cltools.ImmediateAllocator(queue), leading_bits_in_bin_id=6)
    benchmark(_memorypool_cycle, pool)


_PACKAGES = [
    "netcl.core.memory",
    "netcl.runtime.cache",
    "netcl.runtime.graph",
    "netcl.runtime.capture",
    "netcl.runtime.scheduler",
]
# after pyopencl, the CPU time (all threads) of importing the module, printed by the child
_TIMED = "import time, pyopencl; t = time.process_time(); import {}; print(time.process_time() - t)"


def _fresh_import(module: str, cpu: list[float], inside: list[float], env: dict[str, str]) -> None:
    """Import ``module`` (after pyopencl) in a fresh interpreter: its CPU time (user + system)
    goes to ``cpu`` (unlike wall time, barely moved by other processes on a loaded machine), and
    the CPU time of the ``import module`` statement alone to ``inside``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = _TIMED.format(module) if module != "pyopencl" else "import pyopencl"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        timeout=120,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if out.strip():
        inside.append(float(out))


@pytest.mark.benchmark(group="core-import")
@pytest.mark.parametrize("module", _PACKAGES)
def test_import_vs_pyopencl(benchmark: BenchmarkFixture, module: str, tmp_path: Path) -> None:
    """A fresh interpreter importing pyopencl then ``module``, with one importing ``pyopencl``
    alone timed right before each round (paired rounds), byte-code written (to a folder of its
    own: the warm-up round writes it, whatever ``PYTHONDONTWRITEBYTECODE`` says). What netcl
    adds, fastest rounds (target <= 30 ms of CPU): ``import_over_pyopencl_cpu_ms`` (whole
    processes, the steadier figure on a loaded machine than ``import_over_pyopencl_ms``, wall
    time) and ``import_cpu_ms`` (the import statement alone, in the child: the steadiest)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    cpu_floor: list[float] = []
    cpu: list[float] = []
    inside: list[float] = []
    setup, floor_times = paired_floor(lambda: _fresh_import("pyopencl", cpu_floor, [], env))
    benchmark.pedantic(
        _fresh_import,
        args=(module, cpu, inside, env),
        setup=setup,
        rounds=1 if benchmark.disabled else 15,
        warmup_rounds=1,
    )
    if benchmark.stats is not None:
        record_floor(benchmark, floor_times)
        floor = min(floor_times)
        benchmark.extra_info["import_over_pyopencl_ms"] = (benchmark.stats.stats.min - floor) * 1e3
        benchmark.extra_info["import_over_pyopencl_cpu_ms"] = (min(cpu) - min(cpu_floor)) * 1e3
        benchmark.extra_info["import_cpu_ms"] = min(inside[1:]) * 1e3  # not the warm-up's
