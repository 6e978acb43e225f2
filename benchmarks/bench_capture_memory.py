"""A capture's device memory against the normal run's peak: a step of 20 elementwise
pyopencl.array operations (``h = tanh(h * 1.01 + 0.1)``, 1M floats), which allocates a
temporary per operation. The normal run's peak is the most bytes of live buffers at one point
(every buffer through one pyopencl MemoryPool, its live bytes read after each operation); the
capture's is its arena plus the buffers it refers to where the caller keeps them
(``KernelCapture.memory``). Recorded as ``held_over_peak`` in ``extra_info`` (the target:
at most 1.25; before captures owned their memory it was about 20). The benchmark times a replay
against the normal run (``paired_floor_s``).

Run: ``python3 -m pytest benchmarks/bench_capture_memory.py -p no:randomly --benchmark-only``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.clmath as clmath
import pyopencl.tools as cltools

from netcl.runtime.capture import KernelCapture

sys.path.insert(0, str(Path(__file__).parent))
from paired import paired_floor, record_floor

N = 1 << 20
OPS = 20


def _chain(h: cla.Array, peak: list[int] | None = None, pool: Any = None) -> cla.Array:
    for _ in range(OPS):
        scaled = h * 1.01
        shifted = scaled + 0.1
        if peak is not None:  # the worst point of an operation: its input, result and more
            peak[0] = max(peak[0], pool.active_bytes)
        del scaled
        h = clmath.tanh(shifted)
        if peak is not None:
            peak[0] = max(peak[0], pool.active_bytes)
    return h


def test_capture_memory_of_a_20_op_chain(benchmark: Any, queue: cl.CommandQueue) -> None:
    pool = cltools.MemoryPool(cltools.ImmediateAllocator(queue))
    x = cla.to_device(queue, np.linspace(-1, 1, N, dtype=np.float32), allocator=pool)
    peak = [0]
    want = _chain(x, peak, pool).get()
    cap = KernelCapture()
    with cap:
        out = _chain(x)
    mem = cap.memory
    assert mem is not None
    held = mem.arena_bytes + mem.external_bytes
    cap.replay()
    assert np.array_equal(out.get(), want)
    setup, floor = paired_floor(lambda: (_chain(x), queue.finish()))
    benchmark.pedantic(lambda: (cap.replay(), queue.finish()), setup=setup, rounds=20,
                       warmup_rounds=2)
    record_floor(benchmark, floor)
    benchmark.extra_info.update(
        held_over_peak=held / peak[0], normal_peak_bytes=peak[0], arena_bytes=mem.arena_bytes,
        external_bytes=mem.external_bytes, recorded_internal_bytes=mem.internal_bytes,
        recorded_over_peak=(mem.internal_bytes + mem.external_bytes) / peak[0],
    )
    assert held <= 1.25 * peak[0], (held, peak[0])
