"""A capture's device memory against the normal run's peak, for code that allocates a
temporary per operation:

- ``chain``: 20 elementwise pyopencl.array operations (``h = tanh(h * 1.01 + 0.1)``, 1M floats);
- ``train``: a training step of a linear model in pyopencl.array (forward, loss, gradient; the
  weights updated in place), 4096 x 256 floats;
- ``fft``: a reikna FFT round trip with pyopencl.array arithmetic between (skipped without
  reikna), 256 x 1024 complex.

The normal run's peak is the most bytes of live buffers at one point: every buffer comes from one
pyopencl MemoryPool, whose live bytes are read at each allocation. The capture's is its arena plus
the buffers it refers to where the caller keeps them (``KernelCapture.memory``). Recorded as
``held_over_peak`` in ``extra_info`` (the target: at most 1.25; before captures owned their
memory the chain's was about 20). Each benchmark times a replay against the normal run
(``paired_floor_s``).

Run: ``python3 -m pytest benchmarks/bench_capture_memory.py -p no:randomly --benchmark-only``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.clmath as clmath
import pyopencl.tools as cltools
import pytest
from pyopencl.elementwise import ElementwiseKernel

from netcl.runtime.capture import KernelCapture

sys.path.insert(0, str(Path(__file__).parent))
from paired import paired_floor, record_floor

N = 1 << 20
OPS = 20


class _Peak:
    """A MemoryPool allocator that notes the most bytes live at any allocation."""

    def __init__(self, queue: cl.CommandQueue) -> None:
        self.pool = cltools.MemoryPool(cltools.ImmediateAllocator(queue))
        self.peak = 0

    def __call__(self, nbytes: int) -> Any:
        buf = self.pool(nbytes)
        self.peak = max(self.peak, self.pool.active_bytes)
        return buf


def _chain(queue: cl.CommandQueue, alloc: Any) -> tuple[Callable[[], Any], Any]:
    x = cla.to_device(queue, np.linspace(-1, 1, N, dtype=np.float32), allocator=alloc)

    def step() -> Any:
        h = x
        for _ in range(OPS):
            h = clmath.tanh(h * 1.01 + 0.1)
        return h

    return step, x


def _train(queue: cl.CommandQueue, alloc: Any) -> tuple[Callable[[], Any], Any]:
    rows, cols = 4096, 256
    rng = np.random.default_rng(0)
    x = cla.to_device(queue, rng.standard_normal((rows, cols), np.float32), allocator=alloc)
    y = cla.to_device(queue, rng.standard_normal(rows, np.float32), allocator=alloc)
    w = cla.zeros(queue, cols, np.float32, allocator=alloc)
    matvec = ElementwiseKernel(
        queue.context,
        "float *out, const float *x, const float *w, int k",
        "float a = 0; for (int j = 0; j < k; ++j) a += x[i * k + j] * w[j];out[i] = a",
        "bench_matvec",
    )
    tmatvec = ElementwiseKernel(
        queue.context,
        "float *out, const float *x, const float *e, int m, int k",
        "float a = 0; for (int r = 0; r < m; ++r) a += x[r * k + i] * e[r]; out[i] = a",
        "bench_tmatvec",
    )

    def step() -> Any:
        pred = cla.empty_like(y)
        matvec(pred, x, w, np.int32(cols))
        err = pred - y
        loss = cla.dot(err, err) / rows
        grad = cla.empty_like(w)
        tmatvec(grad, x, err, np.int32(rows), np.int32(cols))
        w.__isub__(grad * (0.01 / rows))  # in place, as an optimizer updates its weights
        return loss

    return step, w


def _fft(queue: cl.CommandQueue, alloc: Any) -> tuple[Callable[[], Any], Any]:
    cluda = pytest.importorskip("reikna.cluda")
    fft_type = pytest.importorskip("reikna.fft").FFT

    class Thread(cluda.ocl_api().Thread):  # type: ignore[misc, name-defined]
        def allocate(self, size: int) -> Any:  # reikna's own buffers: through the pool too
            return alloc(size)

    thread = Thread(queue)
    shape = (256, 1024)
    rng = np.random.default_rng(1)
    x = cla.to_device(
        queue, (rng.standard_normal(shape) + 1j).astype(np.complex64), allocator=alloc
    )
    fft = fft_type(x).compile(thread)

    def step() -> Any:
        y = cla.empty_like(x)
        fft(y, x)
        y = y * (1.0 / shape[1])  # a filter between the transforms: temporaries
        z = cla.empty_like(x)
        fft(z, y, inverse=1)
        return z - x

    return step, x


WORKLOADS = {"chain": _chain, "train": _train, "fft": _fft}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_capture_memory(benchmark: Any, queue: cl.CommandQueue, workload: str) -> None:
    peak = _Peak(queue)
    step, state = WORKLOADS[workload](queue, peak)
    state0 = state.get()
    want = step().get()
    queue.finish()
    normal_peak = peak.peak
    state.set(state0)  # the same step again: the weights as they were
    cap = KernelCapture()
    with cap:
        out = step()
    mem = cap.memory
    assert mem is not None
    held = mem.arena_bytes + mem.external_bytes
    state.set(state0)
    cap.replay()
    assert np.array_equal(out.get(), want)
    setup, floor = paired_floor(lambda: (step(), queue.finish()))
    benchmark.pedantic(
        lambda: (cap.replay(), queue.finish()), setup=setup, rounds=20, warmup_rounds=2
    )
    record_floor(benchmark, floor)
    benchmark.extra_info.update(
        held_over_peak=held / normal_peak,
        normal_peak_bytes=normal_peak,
        arena_bytes=mem.arena_bytes,
        external_bytes=mem.external_bytes,
        recorded_internal_bytes=mem.internal_bytes,
        recorded_over_peak=(mem.internal_bytes + mem.external_bytes) / normal_peak,
    )
    assert held <= 1.25 * normal_peak, (held, normal_peak)
