"""BufferPool's checked mode on real kernels: a guard after every block, checked at release,
and released blocks poisoned (the graph's and the capture's checks: tests/graph,
tests/capture)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool, Guard, MemoryCheckError, guard_byte, guard_bytes

INC = "__kernel void inc(__global const float *a, __global float *o) "
INC += "{ int i = get_global_id(0); o[i] = a[i] + 1; }"


def test_pool_names_an_overrun_at_release(queue: cl.CommandQueue) -> None:
    inc = cl.Kernel(cl.Program(queue.context, INC).build(), "inc")
    pool = BufferPool(queue, check_memory=True)
    x = pool.allocate((2048,), np.float32)
    y = pool.allocate((1000,), np.float32)
    inc(queue, (1500,), None, x.buffer, y.buffer)  # 500 floats past y's end: in its guard
    with pytest.raises(
        MemoryCheckError,
        match=r"a kernel wrote 2000 bytes past the end of "
        r"Tensor\(shape=\(1000,\), dtype=float32, nbytes=4000\) \(found as it "
        r"went back to BufferPool",
    ):
        pool.release(y)
    pool.release(x)  # the release was done: nothing in use
    assert pool.stats.bytes_in_use == 0 and pool.stats.live_tensors == 0


def test_released_blocks_read_as_poison(queue: cl.CommandQueue) -> None:
    """A read of freed memory (a raw buffer kept past its tensor's release) shows NaN."""
    host = np.zeros(256, np.float32)
    for checked in (True, False):
        pool = BufferPool(queue, check_memory=checked)
        t = pool.allocate((256,), np.float32)
        t.write(np.ones(256, np.float32))
        raw = t.buffer  # kept behind the Tensor's back
        pool.release(t)
        cl.enqueue_copy(queue, host, raw)
        assert np.isnan(host).all() if checked else (host == 1).all()


def test_the_setting(monkeypatch: pytest.MonkeyPatch, queue: cl.CommandQueue) -> None:
    monkeypatch.setenv("NETCL_CHECK_MEMORY", "on")
    assert BufferPool(queue).check_memory
    assert not BufferPool(queue, check_memory=False).check_memory
    monkeypatch.setenv("NETCL_CHECK_MEMORY", "sometimes")
    with pytest.raises(
        ValueError, match="NETCL_CHECK_MEMORY='sometimes': expected 1 to turn checked mode on"
    ):
        BufferPool(queue)
    monkeypatch.delenv("NETCL_CHECK_MEMORY")
    assert not BufferPool(queue).check_memory


def test_a_checked_pool_keeps_its_name_and_limit(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue, check_memory=True, limit=1 << 20, name="guarded")
    assert (pool.check_memory, pool.name, pool.limit) == (True, "guarded", 1 << 20)
    with pytest.raises(MemoryError):
        pool.allocate((1 << 19,), np.float32)  # 2 MiB, over the 1 MiB limit


def test_each_blocks_guard_holds_its_own_byte(queue: cl.CommandQueue) -> None:
    """The guard after each block holds 0xB0 to 0xBF, the next block's the next byte (17 blocks:
    the 17th starts over), as many bytes again plus 4 KiB, right after the tensor's bytes."""
    assert [guard_byte(turn) for turn in range(18)] == [*range(0xB0, 0xC0), 0xB0, 0xB1]
    assert (guard_bytes(0), guard_bytes(100)) == (4096, 4196)
    pool = BufferPool(queue, check_memory=True)
    tensors = [pool.allocate((4,), np.float32) for _ in range(17)]
    for turn, t in enumerate(tensors):
        host = np.zeros(16 + guard_bytes(16), np.uint8)
        cl.enqueue_copy(queue, host, t.buffer)
        assert (host[16:] == 0xB0 + turn % 16).all(), turn
    pool.release_all(tensors)


PUT = "__kernel void put(__global uchar *b, const int from) { b[from + get_global_id(0)] = 7; }"


def _guarded(queue: cl.CommandQueue) -> tuple[cl.Buffer, Guard, cl.Kernel]:
    """A 512-byte block holding 256 bytes at 64 with guards of 64 bytes before and 128 after
    (0xB3, as a graph executor lays out an intermediate), and a kernel writing 7s from a byte
    offset."""
    block = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 512)
    cl.enqueue_fill_buffer(queue, block, np.uint8(0), 0, 512)
    guard = Guard(64, 256, 64, 128, 0xB3)
    guard.fill(queue, block)
    return block, guard, cl.Kernel(cl.Program(queue.context, PUT).build(), "put")


def _put(queue: cl.CommandQueue, put: cl.Kernel, block: cl.Buffer, start: int, n: int) -> None:
    put(queue, (n,), None, block, np.int32(start))


_WHAT = "its intermediate 'n0'"
_TAIL = (
    "of its intermediate 'n0' (checked mode's guards: 128 bytes after it, 64 before it): a "
    "kernel's global size or indexing is wrong; fix it, or give the tensor the size the "
    "kernel writes"
)


def test_a_guard_says_how_far_past_each_side_a_kernel_wrote(queue: cl.CommandQueue) -> None:
    """A guard on both sides of a block's bytes passes writes within them and names the
    farthest byte written out of bounds on each side, after the end first, in one message."""
    block, guard, put = _guarded(queue)
    _put(queue, put, block, 64, 256)  # every byte of its own, none more
    guard.check(queue, block, "op 'n0'", _WHAT)
    _put(queue, put, block, 64 - 16, 256 + 16 + 8)  # 16 bytes before, 8 past the end
    with pytest.raises(MemoryCheckError) as info:
        guard.check(queue, block, "op 'n0'", _WHAT)
    assert str(info.value) == (
        f"op 'n0' wrote 8 bytes past the end and 16 bytes before the start {_TAIL}"
    )


@pytest.mark.parametrize(
    ("start", "n", "said"),
    [
        (64 + 256, 5, "5 bytes past the end"),
        (64 + 256 + 127, 1, "128 bytes past the end"),
        (0, 3, "64 bytes before the start"),
        (63, 1, "1 bytes before the start"),
    ],
)
def test_a_guard_names_one_side_only_when_only_it_was_written(
    start: int, n: int, said: str, ctx: cl.Context
) -> None:
    """A write out of one side only names that side, as far as its farthest byte; checked the
    same on an out-of-order queue (after everything enqueued before)."""
    ooo = cl.CommandQueue(ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    block, guard, put = _guarded(ooo)
    _put(ooo, put, block, start, n)
    with pytest.raises(MemoryCheckError) as info:
        guard.check(ooo, block, "op 'n0'", _WHAT)
    assert str(info.value) == f"op 'n0' wrote {said} {_TAIL}"


def test_an_empty_tensor_is_all_guard(queue: cl.CommandQueue) -> None:
    """A tensor of no elements has no byte of its own: one byte written at its start is caught."""
    pool = BufferPool(queue, check_memory=True)
    empty = pool.allocate((0,), np.float32)
    cl.enqueue_copy(queue, empty.buffer, np.ones(1, np.uint8))
    with pytest.raises(
        MemoryCheckError,
        match=r"a kernel wrote 1 bytes past the end of "
        r"Tensor\(shape=\(0,\), dtype=float32, nbytes=0\)",
    ):
        pool.release(empty)
    assert pool.stats.bytes_in_use == 0
