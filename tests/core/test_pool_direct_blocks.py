"""Blocks of the device's maximum size, made one by one outside pyopencl's pool (found by the
mutation run: only one such block at a time was ever tried). Two live at once are both
counted, and the pool limit counts them."""

from __future__ import annotations

import gc

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool


def test_two_blocks_of_the_device_maximum_are_both_counted(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    top = queue.device.max_mem_alloc_size
    a = pool.allocate((top,), np.uint8)
    b = pool.allocate((top,), np.uint8)
    assert pool.stats.bytes_in_use == 2 * top and pool.stats.live_tensors == 2
    del a, b  # dropped unreleased: each block is freed with its tensor
    gc.collect()
    assert pool.stats.bytes_in_use == 0 and pool.stats.live_tensors == 0


def test_the_pool_limit_counts_blocks_of_the_device_maximum(queue: cl.CommandQueue) -> None:
    top = queue.device.max_mem_alloc_size
    pool = BufferPool(queue, limit=top + (1 << 20))
    kept = pool.allocate((top,), np.uint8)
    with pytest.raises(MemoryError, match="pool limit"):
        pool.allocate((top,), np.uint8)
    assert pool.stats.live_tensors == 1
    pool.release(kept)
