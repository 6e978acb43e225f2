"""Helpers for the netcl-graph tests: real OpenCL kernels (built with plain pyopencl) and op fns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool
from netcl.core.packing import Interval
from netcl.core.tensor import Tensor

KERNELS = r"""
__kernel void add(__global const float *a, __global const float *b, __global float *out) {
    size_t i = get_global_id(0);
    out[i] = a[i] + b[i];
}
__kernel void relu(__global const float *a, __global float *out) {
    size_t i = get_global_id(0);
    out[i] = fmax(a[i], 0.0f);
}
/* out[i] = k * a[i % na] + b[i % nb]: a broadcasting mix used by the random DAGs */
__kernel void mix_bcast(__global const float *a, uint na, __global const float *b, uint nb,
                  float k, __global float *out) {
    size_t i = get_global_id(0);
    out[i] = k * a[i % na] + b[i % nb];
}
/* c[m, n] = sum_k a[m, k] * w[k, n] + bias[n] */
__kernel void gemm_bias(__global const float *a, __global const float *w,
                        __global const float *bias, uint K, uint N, __global float *c) {
    size_t m = get_global_id(0), n = get_global_id(1);
    float acc = bias[n];
    for (uint k = 0; k < K; ++k) acc += a[m * K + k] * w[k * N + n];
    c[m * N + n] = acc;
}
/* row-wise softmax over N columns */
__kernel void softmax(__global const float *a, uint N, __global float *out) {
    size_t m = get_global_id(0);
    float mx = -INFINITY;
    for (uint j = 0; j < N; ++j) mx = fmax(mx, a[m * N + j]);
    float s = 0.0f;
    for (uint j = 0; j < N; ++j) s += exp(a[m * N + j] - mx);
    for (uint j = 0; j < N; ++j) out[m * N + j] = exp(a[m * N + j] - mx) / s;
}
"""


class Kernels:
    """The test kernels of one context, and op fns that launch them on ``out.queue``."""

    def __init__(self, ctx: cl.Context) -> None:
        prg = cl.Program(ctx, KERNELS).build()
        self.add_k = prg.add
        self.relu_k = prg.relu
        self.mix_k = prg.mix_bcast
        self.gemm_k = prg.gemm_bias
        self.softmax_k = prg.softmax

    def add(self, inputs: list[Tensor], out: Tensor) -> None:
        a, b = inputs
        self.add_k(out.queue, (out.size,), None, a.buffer, b.buffer, out.buffer)

    def relu(self, inputs: list[Tensor], out: Tensor) -> None:
        (a,) = inputs
        self.relu_k(out.queue, (out.size,), None, a.buffer, out.buffer)

    def mix_fn(self, k: float) -> Callable[[list[Tensor], Tensor], None]:
        """``out = k*in0 + in1`` (broadcast by index modulo), folding further inputs in one by
        one, ``out = k*out + in_j``, each a launch of its own: several kernels per op."""

        def fn(inputs: list[Tensor], out: Tensor) -> None:
            q, n = out.queue, (out.size,)
            first = inputs[0]
            second = inputs[1] if len(inputs) > 1 else inputs[0]
            evt = self.mix_k(
                q,
                n,
                None,
                first.buffer,
                np.uint32(first.size),
                second.buffer,
                np.uint32(second.size),
                np.float32(k),
                out.buffer,
            )
            for extra in inputs[2:]:
                # the op orders its own launches (out-of-order queues); the executor orders ops
                evt = self.mix_k(
                    q,
                    n,
                    None,
                    out.buffer,
                    np.uint32(out.size),
                    extra.buffer,
                    np.uint32(extra.size),
                    np.float32(k),
                    out.buffer,
                    wait_for=[evt],
                )

        return fn

    def gemm_bias(self, inputs: list[Tensor], out: Tensor) -> None:
        a, w, bias = inputs
        m, k = a.shape
        n = w.shape[1]
        self.gemm_k(
            out.queue,
            (m, n),
            None,
            a.buffer,
            w.buffer,
            bias.buffer,
            np.uint32(k),
            np.uint32(n),
            out.buffer,
        )

    @staticmethod
    def mix_ref(k: float, ins: list[np.ndarray[Any, Any]], n: int) -> np.ndarray[Any, Any]:
        """numpy reference of :meth:`mix_fn` for an output of ``n`` elements."""
        return mix_ref(k, ins, n)

    def softmax(self, inputs: list[Tensor], out: Tensor) -> None:
        (a,) = inputs
        m, n = a.shape
        self.softmax_k(out.queue, (m,), None, a.buffer, np.uint32(n), out.buffer)


def mix_ref(k: float, ins: list[np.ndarray[Any, Any]], n: int) -> np.ndarray[Any, Any]:
    """numpy reference of :meth:`Kernels.mix_fn` for an output of ``n`` elements."""
    idx = np.arange(n)
    k32 = np.float32(k)
    first = ins[0]
    second = ins[1] if len(ins) > 1 else ins[0]
    out = (k32 * first[idx % first.size] + second[idx % second.size]).astype(np.float32)
    for extra in ins[2:]:
        out = (k32 * out + extra[idx % extra.size]).astype(np.float32)
    return out


@pytest.fixture(scope="session")
def kernels(ctx: cl.Context) -> Kernels:
    return Kernels(ctx)


@pytest.fixture
def pool(queue: cl.CommandQueue) -> BufferPool:
    return BufferPool(queue)


@pytest.fixture(autouse=True)
def _both_telemetry_modes(otel_mode: str) -> str:
    """Every graph test runs with and without an SDK (see ``otel_mode``)."""
    return otel_mode


def overlapping(items: list[Interval], offsets: tuple[int, ...]) -> list[tuple[int, int]]:
    """Pairs of values alive together whose byte ranges overlap (empty for a valid placement)."""
    bad: list[tuple[int, int]] = []
    for i, a in enumerate(items):
        for j in range(i + 1, len(items)):
            b = items[j]
            alive_together = a.first <= b.last and b.first <= a.last
            lo, hi = offsets[i], offsets[j]
            if alive_together and lo < hi + b.size and hi < lo + a.size:
                bad.append((i, j))
    return bad
