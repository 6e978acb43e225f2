"""The demo's OpenCL kernels: a small MLP (GEMM, bias + ReLU, bias + softmax) and their numpy
references."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

SOURCE = r"""
__kernel void gemm(__global const float *a, __global const float *w, __global float *c,
                   const int K, const int N) {
    const int row = get_global_id(0), col = get_global_id(1);
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a[row * K + k] * w[k * N + col];
    c[row * N + col] = acc;
}

__kernel void bias_relu(__global const float *x, __global const float *b, __global float *y,
                        const int N) {
    const int i = get_global_id(0);
    y[i] = fmax(x[i] + b[i % N], 0.0f);
}

__kernel void bias_softmax(__global const float *x, __global const float *b, __global float *y,
                           const int N) {
    const int row = get_global_id(0);
    float m = -INFINITY;
    for (int j = 0; j < N; ++j) m = fmax(m, x[row * N + j] + b[j]);
    float s = 0.0f;
    for (int j = 0; j < N; ++j) {
        const float e = exp(x[row * N + j] + b[j] - m);
        y[row * N + j] = e;
        s += e;
    }
    for (int j = 0; j < N; ++j) y[row * N + j] /= s;
}
"""

Array = npt.NDArray[np.float32]


def mlp_reference(x: Array, weights: list[tuple[Array, Array]]) -> Array:
    """What the device computes, in numpy (float64 accumulation, float32 result)."""
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(weights):
        h = h @ w + b
        if i < len(weights) - 1:
            h = np.maximum(h, 0.0)
    h = np.exp(h - h.max(axis=1, keepdims=True))
    return (h / h.sum(axis=1, keepdims=True)).astype(np.float32)
