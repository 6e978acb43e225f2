from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core import memory
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor

pytestmark = pytest.mark.usefixtures("otel_mode")


def test_released_block_is_handed_out_again(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    a = pool.allocate((256,), "float32")
    ptr = a.buffer.int_ptr
    pool.release(a)
    b = pool.allocate((256,), "float32")
    assert b.buffer.int_ptr == ptr
    s = pool.stats
    assert (s.hits, s.misses) == (1, 1)


def test_allocated_tensor_holds_data(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    t = pool.allocate((3, 5), np.int32)
    host = np.arange(15, dtype=np.int32).reshape(3, 5)
    t.write(host)
    np.testing.assert_array_equal(t.to_numpy(), host)
    pool.release(t)


def test_statistics(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    a = pool.allocate((1000,), "float32")
    b = pool.allocate((500,), "float64")
    block_a, block_b = pool.block_bytes(4000), pool.block_bytes(4000)
    s = pool.stats
    assert s.bytes_in_use == block_a + block_b
    assert s.peak_bytes == s.bytes_in_use
    assert s.live_tensors == 2
    # size classes round up by at most 1/64
    assert 4000 <= block_a <= 4000 * (1 + 1 / 64) + 1
    pool.release(a)
    s = pool.stats
    assert s.bytes_in_use == block_b
    assert s.peak_bytes == block_a + block_b
    assert s.bytes_held == block_a
    pool.reset_peak()
    assert pool.stats.peak_bytes == block_b
    pool.release(b)
    pool.free_held()
    s = pool.stats
    assert (s.bytes_in_use, s.bytes_held, s.live_tensors) == (0, 0, 0)


def test_double_release(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    t = pool.allocate((8,), "float32")
    pool.release(t)
    with pytest.raises(ValueError, match="already released"):
        pool.release(t)


def test_foreign_tensor(queue: cl.CommandQueue) -> None:
    pool, other = BufferPool(queue), BufferPool(queue)
    t = other.allocate((8,), "float32")
    with pytest.raises(ValueError, match="was not allocated by this pool"):
        pool.release(t)
    assert other.owns(t) and not pool.owns(t)
    other.release(t)


def test_dropped_tensor_comes_back(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    t = pool.allocate((1024,), "float32")
    ptr = t.buffer.int_ptr
    del t
    gc.collect()
    assert pool.stats.bytes_in_use == 0
    again = pool.allocate((1024,), "float32")
    assert again.buffer.int_ptr == ptr


def test_release_all_reports_first_error_after_releasing_the_rest(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    a, b = pool.allocate(4, "float32"), pool.allocate(4, "float32")
    pool.release(a)
    with pytest.raises(ValueError, match="already released"):
        pool.release_all([a, b])
    assert pool.stats.live_tensors == 0


def _hammer(pool: BufferPool, threads: int = 8, rounds: int = 60, free_every: int = 0) -> list[str]:
    """Threads that start together, each keeping several tensors alive at once and writing its
    own marker into each: returns every block that was handed out while another tensor held it
    (seen as a live int_ptr taken twice, or as a marker overwritten by another tensor).
    ``free_every``: each thread frees the pool's held blocks every that many rounds, so new
    device blocks keep being allocated while other threads copy."""
    problems: list[str] = []
    lock = threading.Lock()
    live: set[int] = set()
    start = threading.Barrier(threads)
    allocations = [0]
    before = pool.stats

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            start.wait()
            for r in range(rounds):
                held: list[tuple[Tensor, np.ndarray]] = []
                for k in range(int(rng.integers(2, 6))):
                    t = pool.allocate((int(rng.choice([64, 128, 256])),), "float32")
                    ptr = t.buffer.int_ptr
                    with lock:
                        allocations[0] += 1
                        if ptr in live:
                            problems.append(f"block {ptr:#x} handed out while live")
                        live.add(ptr)
                    mark = np.full(t.shape, seed * 1000 + r * 10 + k, np.float32)
                    t.write(mark)
                    held.append((t, mark))
                for t, mark in held:
                    if not np.array_equal(t.to_numpy(), mark):
                        with lock:
                            problems.append(f"tensor of thread {seed} overwritten")
                    with lock:
                        live.discard(t.buffer.int_ptr)
                    pool.release(t)
                if free_every and r % free_every == 0:
                    pool.free_held()
        except BaseException as exc:  # reported by the test
            problems.append(repr(exc))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for th in workers:
            th.start()
        for th in workers:
            th.join()
    finally:
        sys.setswitchinterval(old)
    s = pool.stats
    counted = s.hits + s.misses - before.hits - before.misses
    if counted != allocations[0]:  # the lock-free hit counter lost or gained a count
        problems.append(f"hits + misses grew by {counted} for {allocations[0]} allocations")
    return problems


def test_threads_never_share_a_block(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    assert _hammer(pool) == []
    s = pool.stats
    assert s.live_tensors == 0 and s.bytes_in_use == 0
    assert s.hits > s.misses  # blocks were reused
    assert s.misses <= 8 * 5 * 3  # at most every thread's live set, per size class


def test_threads_copy_while_others_allocate_new_blocks(queue: cl.CommandQueue) -> None:
    """New device blocks are allocated all along (held blocks are freed every other round) while
    other threads are inside blocking copies on the same queue: on NVIDIA's driver this crashed
    the interpreter when the pool prepared new blocks on the caller's queue."""
    pool = BufferPool(queue)
    assert _hammer(pool, rounds=40, free_every=2) == []
    s = pool.stats
    assert s.live_tensors == 0 and s.bytes_in_use == 0
    assert s.misses > 8 * 5 * 3, s  # more new blocks than the live sets of the first rounds


class _LeakyPool(BufferPool):
    """A broken pool: it gives a block back to pyopencl as soon as it hands it out, so the next
    request of that size class gets a block that a live tensor still uses."""

    def allocate(self, shape: Any, dtype: Any, *, _nbytes: int = 0) -> Tensor:
        t = super().allocate(shape, dtype, _nbytes=_nbytes)
        block = t._buffer
        t._buffer = cl.Buffer.from_int_ptr(block.int_ptr, retain=True)
        block.release()
        return t

    def release(self, tensor: Tensor) -> None:
        tensor._bin = None


def test_thread_check_catches_a_pool_that_hands_out_a_live_block(queue: cl.CommandQueue) -> None:
    problems = _hammer(_LeakyPool(queue), threads=4, rounds=5)
    assert any("handed out while live" in p for p in problems)


def test_pool_gauges_per_pool(
    queue: cl.CommandQueue, metric_points: Callable[[str], list[Any]]
) -> None:
    pool = BufferPool(queue, name="test-gauges")
    other = BufferPool(queue)
    assert other.name.startswith("pool-") and other.name != pool.name
    t = pool.allocate((4096,), "float32")
    u = pool.allocate((100,), "float32")
    pool.release(u)

    def value(metric: str, name: str) -> int:
        (point,) = [p for p in metric_points(metric) if p.attributes["netcl.pool.id"] == name]
        return int(point.value)

    s = pool.stats
    assert value("netcl.pool.used", "test-gauges") == s.bytes_in_use == pool.block_bytes(16384)
    assert value("netcl.pool.peak", "test-gauges") == s.peak_bytes
    assert value("netcl.pool.held", "test-gauges") == s.bytes_held == pool.block_bytes(400)
    assert value("netcl.pool.used", other.name) == 0
    # set on change: free_held looks at the figures, no stats read needed
    pool.release(t)
    pool.free_held()
    assert value("netcl.pool.used", "test-gauges") == value("netcl.pool.held", "test-gauges") == 0
    assert value("netcl.pool.peak", "test-gauges") == s.peak_bytes
    # exact when read, with no stats() call: a hit and a release of a held block
    again = pool.allocate((4096,), "float32")
    pool.release(pool.allocate((4096,), "float32"))
    assert value("netcl.pool.used", "test-gauges") == pool.block_bytes(16384)
    assert value("netcl.pool.held", "test-gauges") == pool.block_bytes(16384)
    pool.release(again)
    assert value("netcl.pool.used", "test-gauges") == 0
    assert value("netcl.pool.held", "test-gauges") == pool.block_bytes(16384) * 2
    del pool, again  # a dropped pool's gauges go with it
    assert not [
        p
        for p in metric_points("netcl.pool.used")
        if p.attributes["netcl.pool.id"] == "test-gauges"
    ]


def test_released_tensor_cannot_be_used(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    t = pool.allocate((8,), "float32")
    pool.release(t)
    for use in (
        t.to_numpy,
        lambda: t.write(np.zeros(8, np.float32)),
        lambda: t.as_array().get(),
        lambda: t.buffer,
    ):
        with pytest.raises(RuntimeError, match=r"Tensor\(shape=\(8,\).*was released"):
            use()
    assert not pool.owns(t)
    assert t.shape == (8,) and t.nbytes == 32  # metadata stays readable


def test_release_of_a_non_tensor(queue: cl.CommandQueue) -> None:
    with pytest.raises(TypeError, match="expected a Tensor, got 3"):
        BufferPool(queue).release(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [(2**62,), (10**12,), (2**40, 2**40)])
def test_beyond_max_allocation_is_a_memory_error(
    queue: cl.CommandQueue, shape: tuple[int, ...]
) -> None:
    pool = BufferPool(queue)
    keep = pool.allocate((256,), "float32")
    before = pool.stats
    nbytes = int(np.prod(shape, dtype=object)) * 4
    with pytest.raises(MemoryError) as info:
        pool.allocate(shape, "float32")
    msg = str(info.value)
    dev = queue.device
    assert f"cannot allocate {nbytes} bytes for shape {shape} float32:" in msg
    assert f"at most {dev.max_mem_alloc_size} bytes at once" in msg
    assert f"{before.bytes_in_use} bytes in use, 0 held" in msg
    assert f"{dev.global_mem_size} bytes of global memory" in msg
    assert pool.stats == before
    pool.release(keep)


def test_limit_frees_held_blocks_then_fails(queue: cl.CommandQueue) -> None:
    probe = BufferPool(queue)
    block, small_block, big = (probe.block_bytes(n) for n in (4096, 64, 8192))
    limit = block + big + 8
    pool = BufferPool(queue, limit=limit)
    assert pool.limit == limit
    a, b = pool.allocate((1024,), "float32"), pool.allocate((1024,), "float32")
    pool.release(b)
    small = pool.allocate((16,), "float32")  # fits beside a and the held b
    pool.release(small)
    assert pool.stats.bytes_held == block + small_block
    # a new block of 8 kB does not fit beside the held ones: they are freed and the retry fits
    assert 2 * block + small_block <= limit < 2 * block + small_block + big
    c = pool.allocate((2048,), "float32")
    s = pool.stats
    assert s.bytes_held == 0 and s.bytes_in_use == block + big
    with pytest.raises(
        MemoryError,
        match=rf"pool limit is {limit} bytes; pool: "
        rf"{block + big} bytes in use, 0 held, limit {limit}",
    ):
        pool.allocate((256,), "float32")
    s2 = pool.stats
    assert (s2.bytes_in_use, s2.bytes_held, s2.live_tensors) == (block + big, 0, 2)
    pool.release_all([a, c])


def test_limit_from_environment(queue: cl.CommandQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    def limit_env(value: str) -> None:
        monkeypatch.setenv("NETCL_POOL_LIMIT", value)

    limit_env("8192")
    assert BufferPool(queue).limit == 8192
    assert BufferPool(queue, limit=0).limit == 0  # the argument wins
    limit_env("50%")
    assert BufferPool(queue).limit == queue.device.global_mem_size // 2
    limit_env("lots")
    with pytest.raises(ValueError, match="NETCL_POOL_LIMIT='lots': expected a number of bytes"):
        BufferPool(queue)
    with pytest.raises(ValueError, match="limit=-1 must be an int >= 0"):
        BufferPool(queue, limit=-1)


def test_out_of_device_memory_retries_after_freeing_held_blocks(
    queue: cl.CommandQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device allocation that fails while blocks are held: the pool frees them, collects
    garbage, retries; a second failure is a MemoryError with the pool's figures."""
    pool = BufferPool(queue)
    pool.release(pool.allocate((4096,), "float32"))
    dropped = pool.allocate((2048,), "float32")
    real = pool._mempool
    fail = [1]

    class Flaky:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def allocate(self, nbytes: int) -> Any:
            if fail[0]:
                fail[0] -= 1
                code = cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE
                raise cl.MemoryError(cl._cl._ErrorRecord("clCreateBuffer", code, "injected"))
            return real.allocate(nbytes)

    flaky = Flaky()
    monkeypatch.setattr(pool, "_mempool", flaky)
    del dropped  # garbage the retry collects
    t = pool.allocate((100,), "float32")
    assert fail == [0] and pool.stats.bytes_held == 0 and pool.stats.live_tensors == 1
    fail[0] = 2
    with pytest.raises(
        MemoryError,
        match=r"cannot allocate 400 bytes.*out of device memory.*"
        r"bytes in use, 0 held; device",
    ):
        pool.allocate((100,), "float32")
    pool.release(t)


def test_structured_dtype_spelled_as_a_list(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    t = pool.allocate((4,), [("a", "f4"), ("b", "i4")])
    assert t.nbytes == 32 and t.dtype.names == ("a", "b")
    pool.release(t)


def test_a_new_block_is_ready_without_the_callers_queue(queue: cl.CommandQueue) -> None:
    """The pool backs a new block on a queue of its own before handing it out, so allocation
    neither enqueues on nor waits for the caller's queue: a block is usable at once through
    another queue while the caller's queue is stalled (NVIDIA's driver crashed when the pool's
    work shared the caller's queue with other threads' blocking copies)."""
    gate = cl.UserEvent(queue.context)
    cl.enqueue_barrier(queue, wait_for=[gate])  # the caller's queue is stuck until the gate opens
    other = cl.CommandQueue(queue.context, queue.device)
    pool = BufferPool(queue)
    host = np.arange(64, dtype=np.float32)
    back = np.zeros_like(host)
    done = threading.Event()

    def use() -> None:
        t = pool.allocate((64,), "float32")
        cl.enqueue_copy(other, t.buffer, host)
        cl.enqueue_copy(other, back, t.buffer)
        done.set()

    worker = threading.Thread(target=use, daemon=True)
    worker.start()
    try:
        ready = done.wait(20)
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
        worker.join()
        queue.finish()
    assert ready, "a new pool block waited for work queued on the caller's stalled queue"
    np.testing.assert_array_equal(back, host)


def test_a_new_block_that_cannot_be_backed_is_retried_then_a_memory_error(
    queue: cl.CommandQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Devices that allocate lazily (NVIDIA) report running out of memory when a new block is
    first used, which the pool does at once (its backing read): that error frees the held blocks and
    retries like a failed allocation; a second one is a MemoryError and keeps no block."""
    pool = BufferPool(queue)
    pool.release(pool.allocate((4096,), "float32"))
    real_read = memory._read_buffer
    fail = [1]
    backed: list[Any] = []

    def flaky_read(q: cl.CommandQueue, mem: Any, host: Any, *args: Any) -> Any:
        if q is pool._backing:  # the pool backing a new block
            backed.append(mem)
            if fail[0]:
                fail[0] -= 1
                code = cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE
                raise cl.MemoryError(cl._cl._ErrorRecord("clEnqueueReadBuffer", code, "injected"))
        return real_read(q, mem, host, *args)

    monkeypatch.setattr(memory, "_read_buffer", flaky_read)
    t = pool.allocate((100,), "float32")
    assert fail == [0] and len(backed) == 2  # the new block, then the retry's
    s = pool.stats
    assert (s.live_tensors, s.bytes_held) == (1, 0)
    assert (s.hits, s.misses) == (0, 2)  # the block that could not be backed is no miss
    t.write(np.arange(100, dtype=np.float32))
    np.testing.assert_array_equal(t.to_numpy(), np.arange(100, dtype=np.float32))
    fail[0] = 2
    with pytest.raises(MemoryError, match=r"cannot allocate 800 bytes.*out of device memory"):
        pool.allocate((200,), "float32")
    s = pool.stats
    assert (s.live_tensors, s.bytes_held, s.hits, s.misses) == (1, 0, 0, 2)
    pool.release(t)
    assert pool.stats.bytes_in_use == 0


def test_each_spelling_of_a_dtype_gets_its_own_type_and_size(queue: cl.CommandQueue) -> None:
    """Allocations of one shape in different dtypes, ``None`` (numpy's float64) included, each
    get that dtype and a block of its size, in whatever order they come."""
    pool = BufferPool(queue)
    spellings: list[Any] = [np.int8, "float32", None, np.dtype(np.int16), "f8", None, np.int8]
    for dtype in spellings:
        t = pool.allocate((6,), dtype)
        assert (t.shape, t.dtype) == ((6,), np.dtype(dtype)), dtype
        assert t.buffer.size >= 6 * np.dtype(dtype).itemsize
        t.write(np.arange(6).astype(np.dtype(dtype)))
        np.testing.assert_array_equal(t.to_numpy(), np.arange(6).astype(np.dtype(dtype)))
        pool.release(t)


def test_the_peak_counts_reused_blocks_after_free_held(queue: cl.CommandQueue) -> None:
    """After free_held, tensors served from reused blocks still raise the pool's peak: the
    reported peak is the most bytes ever in use at once."""
    pool = BufferPool(queue)
    small, large = pool.block_bytes(4096), pool.block_bytes(8192)
    pool.release(pool.allocate(1024, np.float32))
    pool.free_held()  # the block goes back to the device; nothing else changes
    assert pool.stats.peak_bytes == small and pool.stats.bytes_held == 0
    pool.release(pool.allocate(1024, np.float32))  # a new block each, then in the bins
    pool.release(pool.allocate(2048, np.float32))
    a, b = pool.allocate(1024, np.float32), pool.allocate(2048, np.float32)  # both reused
    pool.release_all([a, b])
    s = pool.stats
    assert (s.peak_bytes, s.bytes_in_use) == (small + large, 0)


def test_a_pool_remembers_at_most_4096_request_shapes(queue: cl.CommandQueue) -> None:
    """Each new (dtype, shape) is remembered to make its next request cheap, up to 4096: a
    program asking for ever new shapes does not grow its pool without bound. (Read from the
    pool's private table: the bound is about memory, which no public figure shows.)"""
    pool = BufferPool(queue)
    for n in range(1, 4200):
        pool.release(pool.allocate((n,), np.uint8))
    assert sum(len(shapes) for shapes in pool._sizes.values()) == 4096
    pool.release(pool.allocate((5000,), np.uint8))  # still served past the bound
