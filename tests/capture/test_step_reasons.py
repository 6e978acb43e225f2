"""What a captured step tells its user about why it recorded again (``last_reason``): the kind
an argument changed from and to, and a long value cut to 60 characters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

from netcl.core.tensor import Tensor
from netcl.runtime.capture import capture_step

F32 = np.float32
SOURCE = """
__kernel void scale(__global float *out, __global const float *x, const float s) {
    int i = get_global_id(0);
    out[i] = x[i] * s;
}
"""


@pytest.fixture(scope="module")
def scale(ctx: cl.Context) -> cl.Kernel:
    kernel = cl.Kernel(cl.Program(ctx, SOURCE).build(), "scale")
    kernel.set_scalar_arg_dtypes([None, None, F32])
    return kernel


def test_last_reason_names_the_kinds_and_cuts_long_values(
    queue: cl.CommandQueue, scale: cl.Kernel
) -> None:
    @capture_step
    def step(x: Any, tag: object) -> Tensor:
        out = Tensor.empty(x.shape, F32, queue)
        src = x.buffer if isinstance(x, Tensor) else x.data
        scale(queue, (x.size,), None, out.buffer, src, 2.0)
        return out

    ones = np.ones(4, F32)
    long_a, long_b = "a" * 100, "b" * 100
    calls = [(Tensor.from_numpy(ones, queue), 1.0), (cla.to_device(queue, ones), 1.0),
             (cla.to_device(queue, ones), 1), (cla.to_device(queue, ones), long_a),
             (cla.to_device(queue, ones), long_b)]  # fmt: skip
    reasons = []
    for x, tag in calls:
        for _ in range(3):  # warm-up, recording, replay
            np.testing.assert_array_equal(step(x, tag).to_numpy(), 2 * ones)
        reasons.append(step.last_reason)
    cut_a, cut_b = repr(long_a)[:57] + "...", repr(long_b)[:57] + "..."
    assert reasons == [
        "first capture",
        "x changed from a Tensor to a pyopencl Array",
        "tag changed from a float to a int",
        "tag changed from a int to a str",
        f"value of tag changed {cut_a} -> {cut_b}",
    ]
    assert len(cut_a) == 60
