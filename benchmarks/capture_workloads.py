"""Workloads for bench_capture.py (and its telemetry probe): a launch loop and an MLP step."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from itertools import starmap
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from pyopencl.elementwise import ElementwiseKernel

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor

ADD_SRC = """
__kernel void add(__global float *out, __global const float *a, __global const float *b) {
    int i = get_global_id(0);
    out[i] = a[i] + b[i];
}
"""

MLP_SRC = """
__kernel void matmul(__global float *out, __global const float *x, __global const float *w,
                     const int k, const int m) {
    int i = get_global_id(0);
    int row = i / m, col = i % m;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += x[row * k + j] * w[j * m + col];
    out[i] = acc;
}
__kernel void bias_relu(__global float *out, __global const float *h, __global const float *b,
                        const int m) {
    int i = get_global_id(0);
    out[i] = fmax(h[i] + b[i % m], 0.0f);
}
"""

LAUNCH_SIZE = 256  # elements per launch: the baseline add kernel
LAUNCHES = 200  # launches per round / per capture
BATCH, WIDTH, LAYERS = 16, 64, 8


class AddLoop:
    """``LAUNCHES`` launches of a 256-element add: bare preset-argument loop and its capture."""

    def __init__(self, queue: cl.CommandQueue) -> None:
        from netcl.runtime.capture import KernelCapture

        ctx = queue.context
        self.queue = queue
        self.kernel = cl.Kernel(cl.Program(ctx, ADD_SRC).build(), "add")
        host = np.arange(LAUNCH_SIZE, dtype=np.float32)
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        self.a = cl.Buffer(ctx, flags, hostbuf=host)
        self.out = cl.Buffer(ctx, flags, hostbuf=np.zeros_like(host))
        self.kernel.set_args(self.out, self.a, self.a)
        self.capture = KernelCapture()
        with self.capture:  # a launch that raises leaves pyopencl unpatched
            for _ in range(LAUNCHES):
                self.kernel(queue, (LAUNCH_SIZE,), None, self.out, self.a, self.a)
        assert self.capture.num_launches == LAUNCHES
        queue.finish()

    def bare(self) -> None:
        enqueue, queue, kernel, size = (
            cl.enqueue_nd_range_kernel,
            self.queue,
            self.kernel,
            (LAUNCH_SIZE,),
        )
        for _ in range(LAUNCHES):
            enqueue(queue, kernel, size, None)

    def replay(self) -> None:
        self.capture.replay()

    def calls(self) -> None:
        """``LAUNCHES`` plain ``knl(...)`` launches (arguments passed in the call)."""
        kernel, queue, size, out, a = self.kernel, self.queue, (LAUNCH_SIZE,), self.out, self.a
        for _ in range(LAUNCHES):
            kernel(queue, size, None, out, a, a)

    def record(self) -> None:
        """The same launches recorded: begin(), the launches, end() (replay form built)."""
        from netcl.runtime.capture import KernelCapture

        cap = KernelCapture()
        cap.begin()
        self.calls()
        cap.end()

    def check(self) -> None:
        out = np.empty(LAUNCH_SIZE, np.float32)
        cl.enqueue_copy(self.queue, out, self.out)
        np.testing.assert_allclose(out, 2 * np.arange(LAUNCH_SIZE, dtype=np.float32))


class PythonOpsMLP:
    """An MLP step as framework-style Python ops: kernel looked up by name, output taken from a
    BufferPool, launch, intermediates released as soon as they are consumed."""

    def __init__(self, queue: cl.CommandQueue, seed: int = 0) -> None:
        self.queue = queue
        self.pool = BufferPool(queue)
        prg = cl.Program(queue.context, MLP_SRC).build()
        self.kernels: dict[str, cl.Kernel] = {
            "matmul": cl.Kernel(prg, "matmul"),
            "bias_relu": cl.Kernel(prg, "bias_relu"),
        }
        self.kernels["matmul"].set_scalar_arg_dtypes([None, None, None, np.int32, np.int32])
        self.kernels["bias_relu"].set_scalar_arg_dtypes([None, None, None, np.int32])
        rng = np.random.default_rng(seed)
        self.w_host = [
            (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
            for _ in range(LAYERS)
        ]
        self.b_host = [rng.standard_normal(WIDTH).astype(np.float32) * 0.1 for _ in range(LAYERS)]
        self.w = [Tensor.from_numpy(w, queue) for w in self.w_host]
        self.b = [Tensor.from_numpy(b, queue) for b in self.b_host]
        self.x = Tensor.from_numpy(rng.standard_normal((BATCH, WIDTH)).astype(np.float32), queue)

    def op(self, name: str, shape: tuple[int, ...], *args: Any) -> Tensor:
        out = self.pool.allocate(shape, np.float32)
        kernel = self.kernels[name]
        kernel(self.queue, (out.size,), None, out.buffer, *args)
        return out

    def step(self) -> Tensor:
        h = self.x
        for w, b in zip(self.w, self.b, strict=True):
            z = self.op("matmul", (BATCH, WIDTH), h.buffer, w.buffer, WIDTH, WIDTH)
            if h is not self.x:
                self.pool.release(h)
            h = self.op("bias_relu", (BATCH, WIDTH), z.buffer, b.buffer, WIDTH)
            self.pool.release(z)
        return h

    def by_hand(self) -> Callable[[], None]:
        """The step's launches enqueued by hand, each kernel object with its arguments set once
        (outputs of their own, held for good): what a replay of the step enqueues, without it."""
        program, queue = self.kernels["matmul"].program, self.queue
        launches: list[tuple[cl.Kernel, tuple[int, ...]]] = []

        def op(name: str, *args: Any) -> Tensor:
            out = self.pool.allocate((BATCH, WIDTH), np.float32)
            kernel = cl.Kernel(program, name)
            kernel.set_args(out.buffer, *args)
            launches.append((kernel, (out.size,)))
            return out

        h, n = self.x, np.int32(WIDTH)
        for w, b in zip(self.w, self.b, strict=True):
            z = op("matmul", h.buffer, w.buffer, n, n)
            h = op("bias_relu", z.buffer, b.buffer, n)
        calls = [(queue, kernel, size, None) for kernel, size in launches]

        def run() -> None:  # driven from C, as a replay drives its launches
            deque(starmap(cl.enqueue_nd_range_kernel, calls), 0)

        return run

    def reference(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        h = x
        for w, b in zip(self.w_host, self.b_host, strict=True):
            h = np.maximum(h @ w + b, 0)
        return h


class ArrayMLP:
    """The same step written with pyopencl.array: pyopencl's ElementwiseKernel for the matmul,
    array arithmetic and ``maximum`` for bias and ReLU (pyopencl allocates every result)."""

    def __init__(self, queue: cl.CommandQueue, model: PythonOpsMLP) -> None:
        self.queue = queue
        self.matmul = ElementwiseKernel(
            queue.context,
            "float *out, const float *x, const float *w, int k, int m",
            "int row = i / m, col = i % m; float acc = 0.0f;"
            "for (int j = 0; j < k; ++j) acc += x[row * k + j] * w[j * m + col];"
            "out[i] = acc",
            "mlp_matmul",
        )
        self.w = [cla.to_device(queue, w) for w in model.w_host]
        # pyopencl.array does not broadcast: biases tiled to the batch
        self.b = [cla.to_device(queue, np.tile(b, (BATCH, 1))) for b in model.b_host]
        self.zeros = cla.zeros(queue, (BATCH, WIDTH), np.float32)
        self.x = cla.to_device(queue, model.x.to_numpy())

    def step(self) -> cla.Array:
        h = self.x
        for w, b in zip(self.w, self.b, strict=True):
            z = cla.empty_like(self.zeros)
            self.matmul(z, h, w, np.int32(WIDTH), np.int32(WIDTH))
            h = cla.maximum(z + b, self.zeros)
        return h


def interleaved(
    fns: dict[str, Callable[[], object]],
    rounds: int,
    setup: Callable[[], object] | None = None,
    stat: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """Seconds per call of each fn (median by default), timed in alternation so that drift
    and other processes' load hit all contenders alike."""
    return {name: stat(ts) for name, ts in interleaved_times(fns, rounds, setup).items()}


def interleaved_times(
    fns: dict[str, Callable[[], object]],
    rounds: int,
    setup: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter
    for _ in range(rounds):
        for name, fn in fns.items():
            if setup is not None:
                setup()
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return times
