"""Capture of code no one here wrote (pyopencl.array) and of copies and fills."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from netcl.core.memory import BufferPool
from netcl.runtime.capture import KernelCapture, capture_disabled

N = 256


def test_pyopencl_array_computation_replayed_with_changed_inputs(
    queue: cl.CommandQueue,
) -> None:
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal(N, dtype=np.float32)
    w0 = rng.standard_normal(N, dtype=np.float32)
    x, w = cla.to_device(queue, x0), cla.to_device(queue, w0)

    def step() -> cla.Array:
        h = x * w + 1.0
        return cla.maximum(h, 0.0 * h) - x / 2.0

    cap = KernelCapture()
    cap.begin()
    y = step()
    n = cap.end()
    assert n >= 4  # pyopencl issues one kernel per elementwise op
    np.testing.assert_allclose(y.get(), np.maximum(x0 * w0 + 1, 0) - x0 / 2, rtol=1e-5, atol=1e-6)
    for _ in range(2):
        x1 = rng.standard_normal(N, dtype=np.float32)
        x.set(x1)  # outside the capture: the recorded input buffer, new contents
        cap.replay()
        np.testing.assert_allclose(
            y.get(), np.maximum(x1 * w0 + 1, 0) - x1 / 2, rtol=1e-5, atol=1e-6
        )
    # rebinding an array's buffer works through its base_data
    x2_host = np.full(N, 2.0, np.float32)
    x2 = cla.to_device(queue, x2_host)
    cap.replay_with_new_buffers({x.base_data.int_ptr: x2.base_data})
    np.testing.assert_allclose(y.get(), np.maximum(2 * w0 + 1, 0) - 1.0, rtol=1e-5, atol=1e-6)


def test_copies_and_fills_are_recorded_with_static_host_arrays(
    queue: cl.CommandQueue, kernels: Any, ctx: cl.Context
) -> None:
    host_in = np.arange(N, dtype=np.float32)
    host_out = np.zeros(N, np.float32)
    dev_in = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    acc = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    dev_out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    cap = KernelCapture()
    cap.begin()
    cl.enqueue_copy(queue, dev_in, host_in)  # host -> device
    cl.enqueue_fill_buffer(queue, acc, np.float32(1.0), 0, 4 * N)  # fill
    kernels.axpy(queue, (N,), None, acc, dev_in, 3.0)  # acc = 1 + 3 x
    cl.enqueue_copy(queue, dev_out, acc)  # device -> device
    cl.enqueue_copy(queue, host_out, dev_out)  # device -> host (blocking)
    assert cap.end() == 1
    ops = [c.operation if hasattr(c, "operation") else c.kernel_name for c in cap.commands]
    assert ops == ["write_buffer", "fill_buffer", "axpy", "copy_buffer", "read_buffer"]
    assert all(c.queue is queue for c in cap.commands)  # each record names its queue
    _, fill, _, copy, _ = cap.commands  # pyopencl's primitives' arguments, minus wait_for
    assert fill.args[1].int_ptr == acc.int_ptr and fill.args[2:5] == (1.0, 0, 4 * N)
    assert [m.int_ptr for m in copy.args[1:]] == [acc.int_ptr, dev_out.int_ptr]  # src, dst
    assert dict(copy.kwargs) == {"byte_count": 4 * N} and dict(fill.kwargs) == {}
    np.testing.assert_allclose(host_out, 1 + 3 * host_in)
    # static buffers: the replay re-reads host_in and re-writes host_out
    host_in[:] = -host_in
    host_out[:] = 0
    cap.replay()
    np.testing.assert_allclose(host_out, 1 - 3 * np.arange(N, dtype=np.float32))
    # a transfer's buffer is rebound like a kernel argument
    other_out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    cl._cl._enqueue_fill_buffer(queue, other_out, np.float32(0), 0, 4 * N)
    host_out[:] = 0
    cap.replay_with_new_buffers({dev_out.int_ptr: other_out})
    np.testing.assert_allclose(host_out, 1 - 3 * np.arange(N, dtype=np.float32))
    check = np.empty(N, np.float32)
    cl._cl._enqueue_read_buffer(queue, other_out, check)
    np.testing.assert_allclose(check, host_out)


def test_pool_allocations_inside_a_capture(queue: cl.CommandQueue, kernels: Any) -> None:
    pool = BufferPool(queue)
    a = pool.allocate(N, np.float32)
    a.write(np.arange(N, dtype=np.float32))
    out = pool.allocate(N, np.float32)
    cap = KernelCapture()
    cap.begin()
    with capture_disabled():  # scratch set-up that must run only once
        scratch = pool.allocate(N, np.float32)
        scratch.write(np.ones(N, np.float32))
    kernels.add(queue, (N,), None, out.buffer, a.buffer, scratch.buffer)
    assert cap.end() == 1
    assert [type(c).__name__ for c in cap.commands] == ["CapturedLaunch"]
    a.write(np.full(N, 4.0, np.float32))
    cap.replay()
    np.testing.assert_allclose(out.to_numpy(), 5.0)
    pool.release_all([a, out, scratch])
