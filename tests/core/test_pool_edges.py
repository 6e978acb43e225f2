"""BufferPool at its edges: bad limits, the device's largest allocation, statistics that stay
true (a model of the pool checked against random sequences), and a failing OpenTelemetry SDK."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from netcl.core.memory import BufferPool, PoolStats
from netcl.core.tensor import Tensor


@pytest.mark.parametrize(
    "value", ["inf%", "1e400%", "nan", "nan%", "-1", "-5%", "101%", "1e400", "1e9", "lots", "%"]
)
def test_every_bad_limit_is_a_value_error_naming_the_value(
    queue: cl.CommandQueue, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("NETCL_POOL_LIMIT", value)
    with pytest.raises(
        ValueError,
        match=f"NETCL_POOL_LIMIT='{value}': expected a number of "
        "bytes .* or a percentage of the device's global memory from 0% to 100%",
    ):
        BufferPool(queue)


@pytest.mark.parametrize(
    ("value", "share"), [("0", 0), ("100%", 1), ("0.5%", 0.005), (" 25% ", 0.25)]
)
def test_good_limits(
    queue: cl.CommandQueue, monkeypatch: pytest.MonkeyPatch, value: str, share: float
) -> None:
    monkeypatch.setenv("NETCL_POOL_LIMIT", value)
    assert BufferPool(queue).limit == int(queue.device.global_mem_size * share)


def test_size_classes_never_pass_the_device_maximum(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    top = queue.device.max_mem_alloc_size
    for n in (top - 2**20, top - 4096, top - 1, top):
        assert n <= pool.block_bytes(n) <= top, n
    assert pool.block_bytes(top + 1) == top + 1  # refused at allocation, not rounded


def test_a_request_of_the_device_maximum_succeeds(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    top = queue.device.max_mem_alloc_size
    t = pool.allocate((top,), np.uint8)
    assert t.buffer.size == top
    mark = np.arange(1, 17, dtype=np.uint8)
    back = np.zeros_like(mark)
    for offset in (0, top - mark.size):  # both ends of the block are usable
        cl.enqueue_copy(queue, t.buffer, mark, dst_offset=offset)
        cl.enqueue_copy(queue, back, t.buffer, src_offset=offset)
        np.testing.assert_array_equal(back, mark)
    assert pool.stats == PoolStats(top, top, 0, 1, 0, 1)
    ptr = t.buffer.int_ptr
    pool.release(t)
    again = pool.allocate((top,), np.uint8)  # the held block is handed out again
    assert again.buffer.int_ptr == ptr
    assert pool.stats == PoolStats(top, top, 0, 1, 1, 1)
    del again  # dropped unreleased: its block is freed with it
    gc.collect()
    assert pool.stats == PoolStats(0, top, 0, 0, 1, 1)
    small = pool.allocate((64,), np.uint8)  # the estimate of bytes in use caught up
    assert pool.stats.bytes_in_use == pool.block_bytes(64)
    pool.release(small)


def test_a_held_block_of_the_device_maximum_serves_any_shape_of_its_size(
    queue: cl.CommandQueue,
) -> None:
    pool = BufferPool(queue)
    top = queue.device.max_mem_alloc_size
    t = pool.allocate((top,), np.uint8)
    ptr = t.buffer.int_ptr
    pool.release(t)
    again = pool.allocate((top // 4,), np.float32)  # another shape, the same bytes
    assert again.buffer.int_ptr == ptr and pool.stats.hits == 1
    pool.release(again)
    pool.free_held()


def test_statistics_stay_true_after_an_allocation_the_limit_refuses(
    queue: cl.CommandQueue,
) -> None:
    probe = BufferPool(queue)
    block = probe.block_bytes(4096)
    pool = BufferPool(queue, limit=2 * block)
    a, b = pool.allocate((1024,), "float32"), pool.allocate((1024,), "float32")
    pool.release(b)
    with pytest.raises(MemoryError, match="pool limit"):
        pool.allocate((2048,), "float32")
    s = pool.stats
    assert s == PoolStats(block, 2 * block, 0, 1, 0, 2), s  # the refused request counts nowhere
    c = pool.allocate((1024,), "float32")  # a new block again: the held one was freed
    assert (pool.stats.hits, pool.stats.misses) == (0, 3)
    pool.release_all([a, c])
    pool.release(pool.allocate((1024,), "float32"))
    assert (pool.stats.hits, pool.stats.misses) == (1, 3)


# -- a model of the pool, checked against random sequences of operations ----------------------
_SIZES = (1, 100, 1024, 1000, 4000, 8192)  # floats; 1000 and 1024 share a size class
_op = st.one_of(
    st.tuples(st.just("allocate"), st.sampled_from(_SIZES)),
    st.tuples(st.sampled_from(["release", "drop"]), st.integers(0, 7)),
    st.tuples(st.sampled_from(["free_held", "reset_peak"]), st.just(0)),
)


class _Model:
    """What the statistics must say: block bytes out, held per size class, hits and misses."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self.live: list[tuple[Tensor, int]] = []
        self.held: dict[int, int] = {}
        self.in_use = self.peak = self.hits = self.misses = 0

    def apply(self, op: str, arg: int) -> None:
        if op == "allocate":
            nbytes = self.pool.block_bytes(arg * 4)
            if self.held.get(nbytes):
                self.held[nbytes] -= 1
                self.hits += 1
            else:
                self.misses += 1
            self.live.append((self.pool.allocate((arg,), "float32"), nbytes))
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
        elif op in ("release", "drop") and self.live:
            t, nbytes = self.live.pop(arg % len(self.live))
            if op == "release":
                self.pool.release(t)
            del t  # a dropped tensor gives its block back when it goes
            self.held[nbytes] = self.held.get(nbytes, 0) + 1
            self.in_use -= nbytes
        elif op == "free_held":
            self.pool.free_held()
            self.held.clear()
        elif op == "reset_peak":
            self.pool.reset_peak()
            self.peak = self.in_use

    def expected(self) -> PoolStats:
        held = sum(n * k for n, k in self.held.items())
        return PoolStats(self.in_use, self.peak, held, len(self.live), self.hits, self.misses)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_op, max_size=40))
# a new peak reached by hits alone (both blocks held), then a release
@example(
    ops=[
        ("allocate", 1024),
        ("release", 0),
        ("allocate", 4000),
        ("release", 0),
        ("allocate", 1024),
        ("allocate", 4000),
        ("release", 0),
    ]
)
# a dropped tensor lowers the bytes in use without the pool's knowing; then a hit
@example(
    ops=[
        ("allocate", 1024),
        ("allocate", 100),
        ("release", 1),
        ("drop", 0),
        ("allocate", 100),
        ("allocate", 1024),
        ("release", 0),
        ("reset_peak", 0),
        ("allocate", 100),
        ("release", 1),
    ]
)
def test_statistics_follow_a_model_of_the_pool(
    queue: cl.CommandQueue, ops: list[tuple[str, int]]
) -> None:
    model = _Model(BufferPool(queue))
    for op, arg in ops:
        model.apply(op, arg)
        assert model.pool.stats == model.expected(), (op, arg)


def test_allocate_and_release_under_a_failing_sdk(
    queue: cl.CommandQueue,
    hostile_sdk: Callable[[], None],
    metric_points: Callable[[str], list[Any]],
) -> None:
    """A span processor and a metric reader that raise: the pool's calls return what they
    would without them, its gauges are read (and fail inside the SDK only), and the healthy
    reader still sees the right figures."""
    pool = BufferPool(queue, name="hostile")
    host = np.arange(256, dtype=np.float32)
    a = pool.allocate((256,), "float32")
    a.write(host)
    hostile_sdk()  # the failing reader collects: the pool's gauges are observed
    np.testing.assert_array_equal(a.to_numpy(), host)
    pool.release(a)
    b = pool.allocate((256,), "float32")
    block = pool.block_bytes(1024)
    assert pool.stats == PoolStats(block, block, 0, 1, 1, 1)
    pool.free_held()
    hostile_sdk()
    (used,) = [
        p for p in metric_points("netcl.pool.used") if p.attributes["netcl.pool.id"] == "hostile"
    ]
    assert used.value == block
    pool.release(b)


def test_a_dropped_pool_is_freed_at_once(queue: cl.CommandQueue) -> None:
    """No reference cycle: the pool (and the device memory it holds) goes with its last
    reference, not at some later garbage collection."""
    pool = BufferPool(queue)
    pool.release(pool.allocate((1024,), "float32"))
    kept = pool.allocate((16,), "float32")
    ref = weakref.ref(pool)
    gc.disable()
    try:
        del pool
        assert ref() is None
    finally:
        gc.enable()
    kept.write(np.ones(16, np.float32))  # a live tensor of a dropped pool stays usable
    np.testing.assert_array_equal(kept.to_numpy(), np.ones(16, np.float32))
