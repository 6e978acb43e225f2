from __future__ import annotations

import gc
import threading

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool


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


def test_threads_never_share_a_block(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    seen: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    live_ptrs: set[int] = set()

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                n = int(rng.choice([64, 128, 256]))
                t = pool.allocate((n,), "float32")
                ptr = t.buffer.int_ptr
                with lock:
                    assert ptr not in live_ptrs, "block handed out twice"
                    live_ptrs.add(ptr)
                    seen.append(ptr)
                with lock:
                    live_ptrs.discard(ptr)
                pool.release(t)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    s = pool.stats
    assert s.live_tensors == 0 and s.bytes_in_use == 0
    assert s.hits + s.misses == 2400
    assert s.hits > s.misses  # blocks were reused


def test_pool_gauges(queue: cl.CommandQueue, metric_points) -> None:  # type: ignore[no-untyped-def]
    pool = BufferPool(queue)
    t = pool.allocate((4096,), "float32")
    (point,) = metric_points("netcl.pool.bytes_in_use")
    assert point.value >= pool.stats.bytes_in_use > 0
    pool.release(t)
