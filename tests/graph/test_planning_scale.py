"""Planning stays near O(n log n): chains and fans of thousands of ops, a placement with long
lifetimes and pinned values (the overlap index's long-life path), and a test that a return to
quadratic planning would fail (two sizes timed in one test, compared as a ratio)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netcl.core.memory import BufferPool
from netcl.core.packing import Interval, lower_bound, place
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor, TensorRef

from .conftest import overlapping


def _noop(inputs: list[Tensor], out: Tensor) -> None:
    pass


def chain(n: int) -> Graph:
    """``n`` ops, each reading the one before."""
    g = Graph()
    prev: list[Tensor | TensorRef] = []
    for i in range(n):
        prev = [g.add_op(f"n{i}", _noop, prev, (256,), np.float32)]
    return g


def fan(n: int) -> Graph:
    """One op read by ``n - 1`` others."""
    g = Graph()
    src = g.add_op("src", _noop, [], (256,), np.float32)
    for i in range(n - 1):
        g.add_op(f"n{i}", _noop, [src], (256,), np.float32)
    return g


def _plan_cpu_seconds(pool: BufferPool, graph: Graph) -> float:
    """CPU seconds of one planning (a new executor: no cached plan), the collector paused:
    process CPU time is what other jobs on a loaded machine disturb least."""
    ex = GraphExecutor(pool)
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        ex.plan(graph)
        return time.process_time() - t0
    finally:
        gc.enable()


@pytest.mark.parametrize("shape", [chain, fan], ids=["chain", "fan"])
def test_planning_time_grows_near_linearly(
    queue: cl.CommandQueue, shape: Callable[[int], Graph]
) -> None:
    """Four times the ops plans in about 4.5 times the time (n log n); quadratic planning took
    about 16 times (a 2,000-op chain took 1.4 s to plan, a 10,000-op one 30 s)."""
    pool = BufferPool(queue)
    small, large = shape(500), shape(2000)
    t_small = t_large = float("inf")
    for _ in range(3):  # interleaved, the fastest of each: load hits both sizes alike
        t_small = min(t_small, _plan_cpu_seconds(pool, small))
        t_large = min(t_large, _plan_cpu_seconds(pool, large))
    ratio = t_large / t_small
    assert ratio < 8, f"planning 2,000 ops took {ratio:.1f}x 500 ops ({t_large:.3f} s)"
    plan = GraphExecutor(pool).plan(large)
    assert plan.pool_device_bytes <= pool.block_bytes(plan.lower_bound)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.integers(0, 80), st.sampled_from([1, 2, 3, 8])),
        min_size=30,
        max_size=100,
    ),
    st.booleans(),
)
def test_placement_with_long_lifetimes_is_valid(
    raw: list[tuple[int, int, int]], pinned: bool
) -> None:
    """Lifetimes of up to 80 steps among up to 60 steps with a value starting (the overlap
    index lists a long life per span of such steps), with the first value pinned at 0 and a
    block edge no value may cross, or free."""
    items = [Interval(s, s + d, 128 * size) for s, d, size in raw]
    if pinned:
        edge = 128 * 8
        p = place(items, {0: 0}, [edge])
        assert p.offsets[0] == 0
        assert all(o >= edge or o + it.size <= edge for o, it in zip(p.offsets, items, strict=True))
    else:
        p = place(items)
    assert overlapping(items, p.offsets) == []
    assert lower_bound(items) <= p.arena_bytes
