"""Each launch's geometry as the caller gave it: offsets and local sizes replayed launch by
launch (the same kernel and arguments with other sizes is another launch), and launches made on
another thread while one records pass through to the driver untouched."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.runtime.capture import KernelCapture

N = 32


def test_offsets_and_sizes_are_replayed_launch_by_launch(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    x = np.arange(N, dtype=np.float32)
    y, xb = buf(np.zeros(N)), buf(x)
    with KernelCapture() as cap:
        kernels.axpy(queue, (8,), (4,), y, xb, 1.0, global_offset=(16,))  # y[16:24] += x
        kernels.axpy(queue, (4,), None, y, xb, 1.0)  # the same arguments, other sizes: y[0:4]
    once = np.zeros(N, np.float32)
    once[16:24], once[0:4] = x[16:24], x[0:4]
    np.testing.assert_array_equal(host_read(y, N), once)
    cap.replay()
    np.testing.assert_array_equal(host_read(y, N), 2 * once)


def test_a_direct_enqueue_keeps_its_offset_and_g_times_l(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    """``cl.enqueue_nd_range_kernel`` called directly (arguments set in the capture): each
    launch replays with its global offset and ``g_times_l``; the same size objects with
    another ``g_times_l``, or the local size object as the global size, are another launch."""
    x = np.arange(N, dtype=np.float32)
    y, xb = buf(np.zeros(N)), buf(x)
    kernel = cl.Kernel(kernels.program, "axpy")
    size, local = (4,), (2,)
    with KernelCapture() as cap:
        kernel.set_args(y, xb, np.float32(1))
        cl.enqueue_nd_range_kernel(queue, kernel, size, local, (16,))  # y[16:20] += x
        cl.enqueue_nd_range_kernel(queue, kernel, size, local, None, g_times_l=True)  # y[0:8]
        cl.enqueue_nd_range_kernel(queue, kernel, size, local, None)  # y[0:4] += x
        cl.enqueue_nd_range_kernel(queue, kernel, local, local, None)  # y[0:2] += x
    assert cap.num_launches == 4
    once = np.zeros(N, np.float32)
    once[16:20], once[0:8] = x[16:20], x[0:8]
    once[0:4] += x[0:4]
    once[0:2] += x[0:2]
    np.testing.assert_array_equal(host_read(y, N), once)
    cap.replay()
    np.testing.assert_array_equal(host_read(y, N), 2 * once)


def test_a_launch_on_another_thread_passes_through_with_its_geometry(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    x = np.arange(N, dtype=np.float32)
    xb, sums, y = buf(x), buf(np.zeros(N // 4)), buf(np.zeros(N))

    def elsewhere() -> None:  # not recording: straight to the driver, as the caller asked
        kernels.block_sum(queue, (N,), (4,), xb, sums, cl.LocalMemory(16))
        kernels.axpy(queue, (8,), None, y, xb, 1.0, global_offset=(8,))
        queue.finish()

    with KernelCapture() as cap:
        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
    assert cap.num_launches == 0
    np.testing.assert_array_equal(host_read(sums, N // 4), x.reshape(-1, 4).sum(axis=1))
    expect = np.zeros(N, np.float32)
    expect[8:16] = x[8:16]
    np.testing.assert_array_equal(host_read(y, N), expect)
