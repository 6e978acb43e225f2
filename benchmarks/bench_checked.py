"""Checked mode's cost (``BufferPool(check_memory=True)``, ``NETCL_CHECK_MEMORY=1``): a graph run
and a captured replay with guards filled and read back after each node (each recorded launch),
against the same work with the mode off, timed in alternation in the same run.

Run: ``python3 -m pytest benchmarks/bench_checked.py -p no:randomly --benchmark-only``. The
ratio is ``checked_over_plain`` in each benchmark's ``extra_info`` (fastest rounds of each); the
benchmark's own rounds are the checked ones, paired with a plain round before each
(``paired_floor_s``). Not gated: the mode is for tests and debugging.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.capture import KernelCapture
from netcl.runtime.graph import Graph, GraphExecutor

sys.path.insert(0, str(Path(__file__).parent))
from capture_workloads import interleaved_times
from paired import paired_floor, record_floor

NODES = 64
SIZE = 256
RELU = """__kernel void relu(__global const float *a, __global float *out) {
    size_t i = get_global_id(0); out[i] = fmax(a[i], 0.0f); }"""


@pytest.fixture(scope="module")
def relu(ctx: cl.Context) -> cl.Kernel:
    return cl.Kernel(cl.Program(ctx, RELU).build(), "relu")


def _rounds(benchmark: Any, n: int) -> int:
    return 1 if benchmark.disabled else n


def _ratio(benchmark: Any, plain: Callable[[], None], checked: Callable[[], None]) -> None:
    """Time both in alternation, record the ratio, then benchmark the checked one, paired."""
    times = interleaved_times({"plain": plain, "checked": checked}, _rounds(benchmark, 200))
    best = {name: min(ts) for name, ts in times.items()}
    benchmark.extra_info.update(
        plain_us=round(best["plain"] * 1e6, 2),
        checked_us=round(best["checked"] * 1e6, 2),
        checked_over_plain=round(best["checked"] / best["plain"], 2),
    )
    setup, floor = paired_floor(plain)
    benchmark.pedantic(checked, setup=setup, rounds=_rounds(benchmark, 200), warmup_rounds=2)
    record_floor(benchmark, floor)


@pytest.mark.benchmark(group="checked-mode")
@pytest.mark.parametrize("kind", ["noop", "relu_kernel"])
def test_checked_graph_run(benchmark: Any, queue: cl.CommandQueue, relu: Any, kind: str) -> None:
    """GraphExecutor.run over a 64-op chain of 256 floats (+ finish), checked vs plain pool."""

    def fn(inputs: list[Tensor], out: Tensor) -> None:
        if kind != "noop":
            relu(out.queue, (out.size,), None, inputs[0].buffer, out.buffer)

    x = Tensor.from_numpy(np.linspace(-1, 1, SIZE, dtype=np.float32), queue)
    g = Graph()
    cur: Any = x
    for i in range(NODES):
        cur = g.add_op(f"n{i}", fn, [cur], (SIZE,), np.float32)
    runs = []
    for checked in (False, True):
        pool = BufferPool(queue, check_memory=checked)
        ex = GraphExecutor(pool)

        def run(pool: BufferPool = pool, ex: GraphExecutor = ex) -> None:
            pool.release(ex.run(g))
            queue.finish()

        run()  # plan and warm up
        runs.append(run)
    _ratio(benchmark, *runs)
    benchmark.extra_info["nodes"] = NODES


@pytest.mark.benchmark(group="checked-mode")
def test_checked_replay(benchmark: Any, queue: cl.CommandQueue, relu: Any) -> None:
    """KernelCapture.replay of 64 relu launches over pool tensors (+ finish), checked vs plain
    pool: a checked replay refills the guards, then runs and checks launch by launch."""
    replays = []
    for checked in (False, True):
        pool = BufferPool(queue, check_memory=checked)
        ts = [pool.allocate((SIZE,), np.float32) for _ in range(2)]
        ts[0].write(np.linspace(-1, 1, SIZE, dtype=np.float32))
        cap = KernelCapture()
        with cap:
            for i in range(NODES):
                relu(queue, (SIZE,), None, ts[i % 2].buffer, ts[1 - i % 2].buffer)

        def replay(cap: KernelCapture = cap) -> None:
            cap.replay()
            queue.finish()

        replay()
        replays.append(replay)
    _ratio(benchmark, *replays)
    benchmark.extra_info["launches"] = NODES
