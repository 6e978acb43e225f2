"""Replay survives NULL and local arguments, released buffers, out-of-order and multi-queue
captures, dead threads, raising span processors and larger copy substitutes."""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

from netcl.runtime.capture import KernelCapture, _intercept

N = 256
NULL_SRC = """
__kernel void maybe_add(__global float *out, __global const float *a, __global const float *b) {
    int i = get_global_id(0);
    out[i] = (a ? a[i] : 0.0f) + (b ? b[i] : 100.0f);
}
"""


def test_null_buffer_argument_replays(queue: cl.CommandQueue, buf: Any, host_read: Any) -> None:
    k = cl.Kernel(cl.Program(queue.context, NULL_SRC).build(), "maybe_add")
    a, out = buf(np.arange(N)), buf(np.zeros(N))
    with KernelCapture() as cap:
        k(queue, (N,), None, out, a, None)
    cl._cl._enqueue_fill_buffer(queue, out, np.float32(0), 0, 4 * N)
    cap.replay()
    np.testing.assert_allclose(host_read(out, N), np.arange(N) + 100.0)


def test_zero_size_launches_replay(queue: cl.CommandQueue) -> None:
    empty = cla.zeros(queue, 0, np.float32)
    with KernelCapture() as cap:
        result = empty + 1
        result2 = empty * empty
    assert cap.num_launches == 2
    for _ in range(3):
        cap.replay()
    queue.finish()
    assert result.shape == (0,) and result2.shape == (0,)


def test_local_memory_and_scalars_are_kept_per_launch(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    group = 32
    x = np.arange(N, dtype=np.float32)
    src, sums, out = buf(x), buf(np.zeros(N // group)), buf(np.zeros(N))
    with KernelCapture() as cap:
        kernels.block_sum(queue, (N,), (group,), src, sums, cl.LocalMemory(4 * group))
        kernels.scale_shift(queue, (N,), None, out, src, 2.0, 1)
        kernels.scale_shift(queue, (N,), None, out, out, 3.0, 5)
    cl._cl._enqueue_fill_buffer(queue, out, np.float32(0), 0, 4 * N)
    cap.replay()
    np.testing.assert_allclose(host_read(out, N), (x * 2 + 1) * 3 + 5)
    np.testing.assert_allclose(host_read(sums, N // group), x.reshape(-1, group).sum(axis=1))


def test_released_buffers_and_dropped_kernels_stay_alive(
    queue: cl.CommandQueue, buf: Any, host_read: Any
) -> None:
    prg = cl.Program(queue.context, NULL_SRC).build()
    k = cl.Kernel(prg, "maybe_add")
    x = np.arange(N, dtype=np.float32)
    a, b, out = buf(x), buf(x), buf(np.zeros(N))
    ptr = a.int_ptr
    with KernelCapture() as cap:
        k(queue, (N,), None, out, a, b)
    a.release()
    b.release()
    del k, prg, a, b
    gc.collect()
    for _ in range(3):
        cl._cl._enqueue_fill_buffer(queue, out, np.float32(0), 0, 4 * N)
        cap.replay()
        np.testing.assert_allclose(host_read(out, N), 2 * x)
    assert ptr in cap._program.index.uses  # type: ignore[union-attr]


def test_reset_drops_the_recordings_references(
    queue: cl.CommandQueue, kernels: Any, buf: Any
) -> None:
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    before = a.reference_count
    cap = KernelCapture()
    with cap:
        kernels.add(queue, (N,), None, out, a, a)
    assert a.reference_count > before  # the recording holds references of its own
    cap.reset()
    gc.collect()
    assert a.reference_count == before


def test_out_of_order_queue_replays_with_recorded_dependencies(ctx: cl.Context) -> None:
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    try:
        oq = cl.CommandQueue(ctx, properties=props)
    except cl.Error as exc:  # pragma: no cover - device without out-of-order queues
        pytest.skip(f"the device has no out-of-order queues: {exc}")
    n = 4096
    a = cla.to_device(oq, np.arange(n, dtype=np.float32))
    with KernelCapture() as cap:
        b = a + 1
        c = b * b
        d = c - a
        d.get()
    rng = np.random.default_rng(0)
    for _ in range(20):
        new = rng.standard_normal(n).astype(np.float32)
        a.set(new)
        oq.finish()
        done = cap.replay()
        assert done is not None
        done.wait()  # the whole replay, not only its last command
        np.testing.assert_allclose(d.get(), (new + 1) ** 2 - new, rtol=1e-5, atol=1e-4)


def test_two_queues_replay_with_cross_queue_waits(
    ctx: cl.Context, kernels: Any, buf: Any, host_read: Any
) -> None:
    q1, q2 = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    x = np.arange(N, dtype=np.float32)
    src, mid, out = buf(x), buf(np.zeros(N)), buf(np.zeros(N))
    with KernelCapture() as cap:
        ev = kernels.scale_shift(q1, (N,), None, mid, src, 2.0, 0)
        kernels.scale_shift(q2, (N,), None, out, mid, 1.0, 3, wait_for=[ev])
    q1.finish()
    q2.finish()
    assert cap._program.plan is not None  # type: ignore[union-attr]
    for scale in (3.0, 5.0):
        cl._cl._enqueue_write_buffer(q1, src, x * scale)
        q1.finish()
        cap.replay()
        q2.finish()
        np.testing.assert_allclose(host_read(out, N), x * scale * 2 + 3)


def test_a_dead_threads_capture_records_no_other_thread(
    queue: cl.CommandQueue, kernels: Any, buf: Any
) -> None:
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    dead = KernelCapture()

    def begin_and_exit() -> None:
        dead.begin()
        kernels.add(queue, (N,), None, out, a, a)

    t = threading.Thread(target=begin_and_exit)
    t.start()
    t.join()
    try:
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                with KernelCapture() as mine:
                    kernels.add(queue, (N,), None, out, a, a)
                assert mine.num_launches == 1
            except BaseException as exc:
                errors.append(exc)

        for _ in range(10):
            threads = [threading.Thread(target=worker) for _ in range(3)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        assert not errors, errors
        assert dead.num_launches == 1
        assert dead.end() == 1  # still ends (and replays) from another thread
        dead.replay()
    finally:
        dead.reset()
    queue.finish()


def test_larger_substitute_for_a_recorded_copy(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    x = np.arange(N, dtype=np.float32)
    src, dst, out = buf(x), buf(np.zeros(N)), buf(np.zeros(N))
    with KernelCapture() as cap:
        cl.enqueue_copy(queue, dst, src)  # byte count left to pyopencl (-1)
        kernels.add(queue, (N,), None, out, dst, dst)
    bigger = buf(np.concatenate([x * 10, np.ones(N)]))
    cap.replay_with_new_buffers({src.int_ptr: bigger})
    np.testing.assert_allclose(host_read(out, N), x * 20)
    small = buf(np.zeros(N // 2))
    with pytest.raises(ValueError, match=r"recorded command 0 \(copy_buffer\) uses 1024 bytes"):
        cap.replay_with_new_buffers({dst.int_ptr: buf(np.zeros(N)), src.int_ptr: small})
    cap.replay()
    np.testing.assert_allclose(host_read(out, N), x * 2)


def test_a_raising_span_processor_changes_nothing(
    spans: Any, kernels: Any, queue: cl.CommandQueue, buf: Any, host_read: Any
) -> None:
    """An SDK failure never reaches the caller: begin() with a span processor that raises
    records as usual (it used to raise out of begin())."""
    from opentelemetry import trace

    class ProcessorError(Exception):
        pass

    class Raising:
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            raise ProcessorError("on_start")

        def on_end(self, span: Any) -> None:
            pass

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 0) -> bool:
            return True

    provider = trace.get_tracer_provider()
    provider._active_span_processor._span_processors += (Raising(),)  # type: ignore[attr-defined]
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    try:
        cap = KernelCapture()
        cap.begin()
        assert cap.is_recording and _intercept.is_patched()
        kernels.add(queue, (N,), None, out, a, a)
        assert cap.end() == 1
        assert not _intercept.is_patched()
        cl._cl._enqueue_fill_buffer(queue, out, np.float32(0), 0, 4 * N)
        cap.replay()
        np.testing.assert_allclose(host_read(out, N), 2.0)
    finally:
        procs = provider._active_span_processor._span_processors  # type: ignore[attr-defined]
        provider._active_span_processor._span_processors = tuple(  # type: ignore[attr-defined]
            p for p in procs if not isinstance(p, Raising)
        )


def test_preset_arguments_changed_during_the_capture(
    queue: cl.CommandQueue, buf: Any, host_read: Any
) -> None:
    """Arguments set before begin() and changed inside the capture: each launch replays with
    what it ran with (the preset buffer first, the NULL set inside the capture second)."""
    k = cl.Kernel(cl.Program(queue.context, NULL_SRC).build(), "maybe_add")
    x = np.arange(N, dtype=np.float32)
    a, b, out1, out2 = buf(x), buf(x * 10), buf(np.zeros(N)), buf(np.zeros(N))
    k.set_args(out1, a, b)
    with KernelCapture() as cap:
        cl.enqueue_nd_range_kernel(queue, k, (N,), None)  # out1 = x + 10x
        k.set_arg(0, out2)
        k.set_arg(1, None)
        cl.enqueue_nd_range_kernel(queue, k, (N,), None)  # out2 = 0 + 10x
    k.set_arg(2, None)  # after end(): reaches no replay
    for out in (out1, out2):
        cl._cl._enqueue_fill_buffer(queue, out, np.float32(-1), 0, 4 * N)
    cap.replay()
    np.testing.assert_allclose(host_read(out1, N), x * 11)
    np.testing.assert_allclose(host_read(out2, N), x * 10)


def test_a_pools_own_work_is_not_recorded(queue: cl.CommandQueue) -> None:
    """A BufferPool backs each new block with a read on a queue of its own: that is the pool's
    bookkeeping, not the application's work, so a capture neither records nor replays it (it
    did, and every replay then took the slow multi-queue path)."""
    from netcl.core.memory import BufferPool

    pool = BufferPool(queue)
    cap = KernelCapture()
    with cap:
        tensors = [pool.allocate((n,), "float32") for n in (100, 1000, 10000)]  # new blocks
    assert pool.stats.misses == 3
    assert cap.commands == ()
    pool.release_all(tensors)


def test_a_call_that_fails_inside_the_capture_leaves_the_rest_recorded(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    # each hook counts the calls it is inside (a nested pyopencl call is not recorded twice): a
    # call that raised must not leave the count up, or nothing after it would be recorded
    x, y, small = buf(np.ones(N)), buf(np.zeros(N)), buf(np.zeros(4))
    with KernelCapture() as cap:
        with pytest.raises(cl.Error):
            kernels.add(queue, (N,), (N + 1,), y, x, x)  # a local size that does not divide
        with pytest.raises(cl.Error):
            cl.enqueue_copy(queue, small, x, byte_count=4 * N)  # more than `small` holds
        with pytest.raises(cl.Error):
            kernels.add.set_args(y, x, np.float32(1))  # a scalar where a buffer goes
        kernels.add.set_args(y, x, x)
        cl.enqueue_nd_range_kernel(queue, kernels.add, (N,), None)
        cl.enqueue_copy(queue, small, y, byte_count=16)
        kernels.axpy(queue, (N,), None, y, x, np.float32(3))
    assert (cap.num_launches, len(cap.commands)) == (2, 3)
    cl._cl._enqueue_fill_buffer(queue, y, np.float32(0), 0, 4 * N)
    cap.replay()
    np.testing.assert_allclose(host_read(y, N), 5.0)
    np.testing.assert_allclose(host_read(small, 4), 2.0)
