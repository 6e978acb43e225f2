"""Kernels shared by the capture tests (real OpenCL programs on the session's device)."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.capture import _intercept

SOURCE = """
__kernel void axpy(__global float *y, __global const float *x, const float a) {
    int i = get_global_id(0);
    y[i] += a * x[i];
}
__kernel void add(__global float *out, __global const float *a, __global const float *b) {
    int i = get_global_id(0);
    out[i] = a[i] + b[i];
}
__kernel void scale_shift(__global float *out, __global const float *a, const float s,
                          const int shift) {
    int i = get_global_id(0);
    out[i] = a[i] * s + (float)shift;
}
__kernel void block_sum(__global const float *x, __global float *out, __local float *scratch) {
    int l = get_local_id(0);
    scratch[l] = x[get_global_id(0)];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
        if (l < s) scratch[l] += scratch[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) out[get_group_id(0)] = scratch[0];
}
"""

# an MLP's two kernels (test_step, test_saved)
MLP_SOURCE = """
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


class Kernels:
    def __init__(self, ctx: cl.Context) -> None:
        self.program = cl.Program(ctx, SOURCE).build()
        self.axpy = cl.Kernel(self.program, "axpy")
        self.axpy.set_scalar_arg_dtypes([None, None, np.float32])
        self.add = cl.Kernel(self.program, "add")
        self.scale_shift = cl.Kernel(self.program, "scale_shift")
        self.scale_shift.set_scalar_arg_dtypes([None, None, np.float32, np.int32])
        self.block_sum = cl.Kernel(self.program, "block_sum")


@pytest.fixture(scope="session")
def kernels(ctx: cl.Context) -> Kernels:
    return Kernels(ctx)


@pytest.fixture
def buf(ctx: cl.Context, queue: cl.CommandQueue):  # type: ignore[no-untyped-def]
    """``buf(array)``: a new device buffer holding a copy of ``array`` (float32)."""

    def make(array: object) -> cl.Buffer:
        host = np.ascontiguousarray(array, dtype=np.float32)
        return cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)

    return make


def read(queue: cl.CommandQueue, buffer: cl.Buffer, n: int) -> np.ndarray:  # type: ignore[type-arg]
    out = np.empty(n, np.float32)
    cl._cl._enqueue_read_buffer(queue, buffer, out)  # straight to the driver, never recorded
    return out


@pytest.fixture
def host_read(queue: cl.CommandQueue):  # type: ignore[no-untyped-def]
    return lambda buffer, n: read(queue, buffer, n)


@pytest.fixture(autouse=True)
def _no_leaked_interception():  # type: ignore[no-untyped-def]
    """Every test must leave pyopencl unpatched."""
    setter = cl.Kernel.__dict__["_set_arg_multi"]
    yield
    assert not _intercept.is_patched(), "a test left the capture hooks installed"
    assert cl.Kernel.__dict__["_set_arg_multi"] is setter


@pytest.fixture
def opencl_loader() -> ctypes.CDLL:
    """The OpenCL ICD loader for ctypes calls (native code a capture must see or refuse): the
    system's, else the one pyopencl's wheel bundles. A fresh handle: set its argtypes freely."""
    name = ctypes.util.find_library("OpenCL")
    if name is None:
        bundled = glob.glob(os.path.join(os.path.dirname(cl.__file__), ".libs", "libOpenCL*"))
        name = bundled[0] if bundled else None
    if name is None:  # pragma: no cover - every pyopencl install has a loader
        pytest.skip("no OpenCL ICD loader found for ctypes")
    return ctypes.CDLL(name)
