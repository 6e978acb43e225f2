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
    calls = [
        (Tensor.from_numpy(ones, queue), 1.0),
        (cla.to_device(queue, ones), 1.0),
        (cla.to_device(queue, ones), 1),
        (cla.to_device(queue, ones), long_a),
        (cla.to_device(queue, ones), long_b),
    ]
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


def test_last_reason_names_each_guard_that_changed(
    ctx: cl.Context, queue: cl.CommandQueue, scale: cl.Kernel
) -> None:
    """Each kind of key change has its own reason, naming the argument (``rest[0]`` for a
    ``*rest`` one, its name for a keyword one) and the old and new value: keyword names, a
    keyword argument's value, the number of arguments, a Tensor's shape, dtype or queue, an
    Array's strides and offset, a queue of another context (or none), and Tensor arguments
    that share a buffer."""
    src, out = Tensor.from_numpy(np.ones(4, F32), queue), Tensor.empty((4,), F32, queue)

    @capture_step(warmup=0, max_captures=64)
    def step(x: Any, *rest: Any, **kw: Any) -> None:  # the arguments are only its key
        scale(queue, (4,), None, out.buffer, src.buffer, 2.0)

    other_queue = cl.CommandQueue(ctx)
    other_ctx = cl.Context(ctx.devices)
    t4, t8 = Tensor.from_numpy(np.ones(4, F32), queue), Tensor.from_numpy(np.ones(8, F32), queue)
    t16, u16 = (Tensor.from_numpy(np.ones(16, F32), queue) for _ in range(2))
    a8 = cla.to_device(queue, np.ones(8, F32))
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((t4,), {}),
        ((t8,), {}),
        ((Tensor(t8.buffer, (8,), F32, other_queue),), {}),
        ((Tensor.from_numpy(np.ones(8, np.int32), other_queue),), {}),
        ((Tensor.from_numpy(np.ones(8, np.int32), cl.CommandQueue(other_ctx)),), {}),
        ((t8,), {"s": 1}),
        ((t8,), {"b": 2, "s": 1}),
        ((t8,), {"b": 2, "s": 3}),
        ((t16,), {}),
        ((t16, 1.0), {}),
        ((t16, 2.0), {}),
        ((t16, "x" * 58), {}),  # a repr of 60 characters: whole
        ((t16, "y" * 59), {}),  # of 61: cut
        ((t16, t16), {}),
        ((t16, u16), {}),
        ((a8[:4], u16), {}),
        ((a8[::2], u16), {}),
        ((a8[1::2], u16), {}),
        ((cla.Array(ctx, (4,), F32, data=a8.base_data, strides=(8,), offset=4), u16), {}),
    ]
    reasons = []
    for args, kw in calls:
        step(*args, **kw)
        reasons.append(step.last_reason)
    assert reasons == [
        "first capture",
        "shape of x changed (4,) -> (8,)",
        "queue of x changed",
        "dtype of x changed dtype('float32') -> dtype('int32')",
        "context of x changed",
        "keyword arguments changed () -> ('s',)",
        "keyword arguments changed ('s',) -> ('b', 's')",
        "value of s changed 1 -> 3",
        "keyword arguments changed ('b', 's') -> ()",
        "number of arguments changed 1 -> 2",
        "value of rest[0] changed 1.0 -> 2.0",
        "rest[0] changed from a float to a str",
        f"value of rest[0] changed '{'x' * 58}' -> '{'y' * 56}...",
        "rest[0] changed from a str to a Tensor",
        "aliasing between Tensor arguments changed",
        "x changed from a Tensor to a pyopencl Array",
        "strides of x changed (4,) -> (8,)",
        "offset of x changed 0 -> 4",
        "context of x changed",
    ]
    assert step.stats.captures == len(calls)


def test_a_key_recorded_again_after_its_capture_was_dropped_says_so(
    queue: cl.CommandQueue, scale: cl.Kernel
) -> None:
    """A key whose capture was dropped to keep ``max_captures`` records at its next call, and
    its reason says the capture was dropped."""

    @capture_step(warmup=0, max_captures=1)
    def step(x: Tensor) -> Tensor:
        out = Tensor.empty(x.shape, F32, queue)
        scale(queue, (x.size,), None, out.buffer, x.buffer, 2.0)
        return out

    reasons = []
    for n in (4, 8, 4):
        np.testing.assert_array_equal(
            step(Tensor.from_numpy(np.ones(n, F32), queue)).to_numpy(), np.full(n, 2, F32)
        )
        reasons.append(step.last_reason)
    assert reasons == [
        "first capture",
        "shape of x changed (4,) -> (8,)",
        "shape of x changed (8,) -> (4,) (recorded before, dropped to keep 1 captures)",
    ]
    assert step.stats == (0, 3, 0, 2)
