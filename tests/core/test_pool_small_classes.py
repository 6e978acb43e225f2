"""The smallest size classes (found by the mutation run: a request of 0 or 1 byte was never
made). OpenCL refuses 0-byte buffers, so both take a 1-byte block, and a 1-byte block is backed
by reading its only byte."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from netcl.core.memory import BufferPool


def test_zero_and_one_byte_requests_take_one_byte_blocks(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    assert [pool.block_bytes(n) for n in (0, 1, 2, 3)] == [1, 1, 2, 3]
    empty = pool.allocate((0,), np.uint8)
    one = pool.allocate((1,), np.uint8)
    assert empty.buffer.size == 1 and one.buffer.size == 1
    mark, back = np.array([7], np.uint8), np.zeros(1, np.uint8)
    cl.enqueue_copy(queue, one.buffer, mark)
    cl.enqueue_copy(queue, back, one.buffer)
    assert back[0] == 7
    assert pool.stats.bytes_in_use == 2 and pool.stats.misses == 2
    pool.release(empty)
    pool.release(one)


def test_making_a_pool_warns_nothing(queue: cl.CommandQueue) -> None:
    # pyopencl warns about the deferred allocator the pool backs itself (a user would see it)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool = BufferPool(queue)
    pool.release(pool.allocate((16,), np.uint8))


def test_size_classes_are_at_most_one_64th_larger_and_no_finer(queue: cl.CommandQueue) -> None:
    # pyopencl's classes with 6 leading bits: just past a power of two a block is ~1/64 larger
    # (finer classes would mean more classes, fewer reuses; graph plans count on these sizes)
    pool = BufferPool(queue)
    for n in (2**20 + 1, 4097, 1000, 100_000):
        size = pool.block_bytes(n)
        assert n <= size <= n + n // 64, (n, size)
    assert [pool.block_bytes(n) for n in (2**20 + 1, 1000, 4097, 100_000)] == [
        1064959,
        1007,
        4159,
        100351,
    ]
