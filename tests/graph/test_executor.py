"""GraphExecutor on real kernels: results against numpy, ownership, errors, plans, memory."""

from __future__ import annotations

import dataclasses
import gc
from itertools import pairwise
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor, TensorRef


def test_spec_example(queue: cl.CommandQueue, pool: BufferPool, kernels: Any) -> None:
    x = np.array([1.0, -2.0, 3.0, -4.0], np.float32)
    y = np.array([0.5, 0.5, -5.0, 1.0], np.float32)
    tensor_x, tensor_y = Tensor.from_numpy(x, queue), Tensor.from_numpy(y, queue)
    graph = Graph()
    ref_a = graph.add_op("add", kernels.add, [tensor_x, tensor_y], shape=(4,), dtype="float32")
    assert isinstance(ref_a, TensorRef)
    graph.add_op("relu", kernels.relu, [ref_a], shape=(4,), dtype="float32")
    executor = GraphExecutor(pool)
    result = executor.run(graph)
    assert isinstance(result, Tensor) and result.shape == (4,) and result.dtype == np.float32
    np.testing.assert_array_equal(result.to_numpy(), np.maximum(x + y, 0))
    # the caller owns the result; the intermediate's block went back to the pool
    assert pool.owns(result)
    assert pool.stats.bytes_in_use == executor.plan(graph).output_block_bytes
    pool.release(result)
    assert pool.stats.bytes_in_use == 0
    # external inputs are untouched and still usable
    np.testing.assert_array_equal(tensor_x.to_numpy(), x)


def _mlp(
    queue: cl.CommandQueue, kernels: Any, rng: np.random.Generator, sizes: list[int], batch: int
) -> tuple[Graph, np.ndarray, list[str]]:
    """GEMM + bias + ReLU layers and a softmax head; returns the graph and the numpy result."""
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    g = Graph()
    cur: Tensor | TensorRef = Tensor.from_numpy(x, queue)
    ref = x
    names = []
    for i, (k, n) in enumerate(pairwise(sizes)):
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        lin = g.add_op(
            f"fc{i}",
            kernels.gemm_bias,
            [cur, Tensor.from_numpy(w, queue), Tensor.from_numpy(b, queue)],
            (batch, n),
            np.float32,
        )
        ref = ref @ w + b
        names.append(lin.name)
        if i < len(sizes) - 2:
            cur = g.add_op(f"relu{i}", kernels.relu, [lin], (batch, n), np.float32)
            ref = np.maximum(ref, 0)
            names.append(cur.name)
        else:
            g.add_op("softmax", kernels.softmax, [lin], (batch, n), np.float32)
            e = np.exp(ref - ref.max(axis=1, keepdims=True))
            ref = e / e.sum(axis=1, keepdims=True)
            names.append("softmax")
    return g, ref, names


def test_mlp_matches_numpy_and_reuses_memory(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    rng = np.random.default_rng(0)
    g, ref, names = _mlp(queue, kernels, rng, [64, 128, 256, 128, 10], batch=32)
    ex = GraphExecutor(pool)
    out = ex.run(g)
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-4, atol=1e-6)
    plan = ex.plan(g)
    assert plan.order == tuple(names)
    assert plan.outputs == ("softmax",)
    assert plan.peak_bytes == plan.lower_bound < plan.no_reuse_bytes
    assert pool.stats.peak_bytes == plan.pool_peak_bytes
    assert plan.pool_device_bytes <= pool.block_bytes(plan.lower_bound)
    # every intermediate died right after its one reader
    for name in names[:-1]:
        lt = plan.lifetimes[name]
        assert lt.last_use == lt.step + 1 and not lt.is_output
    assert plan.lifetimes["softmax"].is_output
    pool.release(out)
    assert pool.stats.bytes_in_use == 0


def test_several_outputs_are_kept_and_owned(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    rng = np.random.default_rng(1)
    g, ref, _ = _mlp(queue, kernels, rng, [16, 32, 8], batch=4)
    ex = GraphExecutor(pool)
    hidden, logits, probs = ex.run(g, outputs=[TensorRef("relu0"), "fc1", "softmax"])
    h = hidden.to_numpy()
    assert h.shape == (4, 32) and (h >= 0).all()
    e = np.exp(logits.to_numpy() - logits.to_numpy().max(axis=1, keepdims=True))
    np.testing.assert_allclose(probs.to_numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(probs.to_numpy(), ref, rtol=1e-4, atol=1e-6)
    plan = ex.plan(g, ["relu0", "fc1", "softmax"])
    assert plan.lifetimes["relu0"].last_use == len(plan.order) - 1
    assert [lt.name for lt in plan.lifetimes.values() if lt.is_output] == [
        "relu0",
        "fc1",
        "softmax",
    ]
    # only the outputs stay in use; each is released on its own
    assert pool.stats.bytes_in_use == plan.output_block_bytes
    pool.release_all([hidden, logits, probs])
    assert pool.stats.bytes_in_use == 0


def test_fn_raising_half_way_leaves_pool_as_it_was(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    keep = pool.allocate((8,), np.float32)  # something of the caller's, in use throughout
    start = pool.stats.bytes_in_use
    x = Tensor.from_numpy(np.ones(256, np.float32), queue)
    calls: list[str] = []

    def boom(inputs: list[Tensor], out: Tensor) -> None:
        calls.append("boom")
        raise ZeroDivisionError("kernel argument out of range")

    g = Graph()
    a = g.add_op("a", kernels.relu, [x], (256,), np.float32)
    b = g.add_op("b", kernels.add, [a, x], (256,), np.float32)
    c = g.add_op("c", boom, [b], (256,), np.float32)
    g.add_op("d", kernels.relu, [c], (256,), np.float32)
    ex = GraphExecutor(pool)
    with pytest.raises(RuntimeError, match=r"op 'c' raised ZeroDivisionError: kernel arg") as info:
        ex.run(g, outputs=["b", "d"])  # 'b' was already allocated as an output when 'c' failed
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert calls == ["boom"]
    assert pool.stats.bytes_in_use == start
    assert pool.stats.live_tensors == 1 and pool.owns(keep)
    # the executor and the pool still work afterwards
    g2 = Graph()
    g2.add_op("a", kernels.relu, [x], (256,), np.float32)
    out = ex.run(g2)
    np.testing.assert_array_equal(out.to_numpy(), np.ones(256, np.float32))
    pool.release_all([out, keep])
    assert pool.stats.bytes_in_use == 0


def test_plan_is_cached_and_invalidated_on_change(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    x = Tensor.from_numpy(np.arange(64, dtype=np.float32) - 32, queue)
    g = Graph()
    a = g.add_op("a", kernels.relu, [x], (64,), np.float32)
    ex = GraphExecutor(pool)
    p1 = ex.plan(g)
    for _ in range(3):
        pool.release(ex.run(g))
    assert ex.plan(g) is p1
    assert ex.plan(g, ["a"]) is not p1 and ex.plan(g, ["a"]) is ex.plan(g, [a])
    g.add_op("b", kernels.add, [a, x], (64,), np.float32)
    p2 = ex.plan(g)
    assert p2 is not p1 and p2.order == ("a", "b")
    out = ex.run(g)
    expect = np.maximum(np.arange(64) - 32, 0) + np.arange(64) - 32
    np.testing.assert_array_equal(out.to_numpy(), expect.astype(np.float32))
    pool.release(out)
    # the cache does not keep graphs alive
    del g, a
    gc.collect()
    assert len(ex._runs) == 0


def test_forward_refs_run_in_dependency_order(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    x = Tensor.from_numpy(np.full(32, -1.0, np.float32), queue)
    g = Graph()
    # 'total' is added first but needs 'pos', added later
    g.add_op("total", kernels.add, [TensorRef("pos"), x], (32,), np.float32)
    g.add_op("pos", kernels.relu, [x], (32,), np.float32)
    ex = GraphExecutor(pool)
    assert ex.plan(g).order == ("pos", "total")
    out = ex.run(g)
    np.testing.assert_array_equal(out.to_numpy(), np.full(32, -1.0, np.float32))
    pool.release(out)


@pytest.mark.parametrize("sizes", [[1024] * 8, [256, 4096, 512, 8192, 64, 2048, 1000, 3]])
def test_chain_peak_reaches_lower_bound(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any, sizes: list[int]
) -> None:
    """A chain of ops of mixed sizes: the plan is exactly the lower bound, and the pool's
    in-use bytes grow by exactly the plan's pool figure."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(97).astype(np.float32)
    g = Graph()
    cur: Tensor | TensorRef = Tensor.from_numpy(x, queue)
    ref = x
    for i, n in enumerate(sizes):
        cur = g.add_op(f"n{i}", kernels.mix_fn(0.5), [cur], (n,), np.float32)
        idx = np.arange(n)
        ref = (np.float32(0.5) * ref[idx % ref.size] + ref[idx % ref.size]).astype(np.float32)
    ex = GraphExecutor(pool)
    out = ex.run(g)
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-5)
    plan = ex.plan(g)
    assert plan.peak_bytes == plan.lower_bound
    al = ex.alignment
    aligned = [-(-s * 4 // al) * al for s in sizes]
    assert plan.lower_bound == max(a + b for a, b in pairwise(aligned))
    assert plan.temp_lower_bound == max(a + b for a, b in pairwise(aligned[:-1]))
    assert plan.lower_bound_outputs_whole_run == plan.temp_lower_bound + aligned[-1]
    # the pool takes the lower bound, rounded up to its size class
    assert plan.pool_device_bytes <= pool.block_bytes(plan.lower_bound)
    assert plan.no_reuse_bytes == sum(aligned)
    assert pool.stats.peak_bytes == plan.pool_peak_bytes
    pool.release(out)


def test_repeated_runs_reuse_the_arena_block(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    x = Tensor.from_numpy(np.ones(4096, np.float32), queue)
    g = Graph()
    cur: Tensor | TensorRef = x
    for i in range(6):
        cur = g.add_op(f"n{i}", kernels.add, [cur, x], (4096,), np.float32)
    ex = GraphExecutor(pool)
    pool.release(ex.run(g))
    held = pool.stats.bytes_held
    misses = pool.stats.misses
    for _ in range(5):
        out = ex.run(g)
        np.testing.assert_array_equal(out.to_numpy(), np.full(4096, 7.0, np.float32))
        pool.release(out)
    assert pool.stats.misses == misses  # no new device allocations
    assert pool.stats.bytes_held == held


def test_a_graph_without_external_inputs(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    """Ops with no inputs (a fill) as the first ops of a graph with no external Tensor: the
    fill asked for as an output and the sum of two fills are computed and owned."""

    def fill(value: float) -> Any:
        def fn(inputs: list[Tensor], out: Tensor) -> None:
            assert inputs == []
            cl.enqueue_fill_buffer(out.queue, out.buffer, np.float32(value), 0, out.nbytes)

        return fn

    g = Graph()
    a = g.add_op("a", fill(2.0), [], (64,), np.float32)
    b = g.add_op("b", fill(3.0), [], (64,), np.float32)
    g.add_op("sum", kernels.add, [a, b], (64,), np.float32)
    ex = GraphExecutor(pool)
    for _ in range(2):
        first, total = ex.run(g, outputs=["a", "sum"])
        np.testing.assert_array_equal(first.to_numpy(), np.full(64, 2.0, np.float32))
        np.testing.assert_array_equal(total.to_numpy(), np.full(64, 5.0, np.float32))
        assert pool.owns(first) and pool.owns(total)
        pool.release_all([first, total])
    assert pool.stats.bytes_in_use == 0


def test_out_of_order_queue(ctx: cl.Context, kernels: Any) -> None:
    """Wide and deep reuse on an out-of-order queue: the barriers keep every result exact."""
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not ctx.devices[0].get_info(cl.device_info.QUEUE_PROPERTIES) & props:
        pytest.fail("the test device has no out-of-order queues")  # PoCL and NVIDIA both do
    q = cl.CommandQueue(ctx, properties=props)
    pool = BufferPool(q)
    n = 1 << 16
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    ts = [Tensor.from_numpy(v, q) for v in xs]
    g = Graph()
    ref: dict[str, np.ndarray] = {}
    prev: list[TensorRef] = []
    for i in range(24):
        ins: list[Tensor | TensorRef] = [prev[-1] if prev else ts[0], ts[i % 3]]
        if len(prev) >= 3:
            ins.append(prev[-3])
        r = g.add_op(f"n{i}", kernels.mix_fn(0.75), ins, (n,), np.float32)
        vals = [ref[x.name] if isinstance(x, TensorRef) else xs[ts.index(x)] for x in ins]
        ref[r.name] = np.float32(0.75) * vals[0] + vals[1]
        if len(vals) > 2:
            ref[r.name] = np.float32(0.75) * ref[r.name] + vals[2]
        prev.append(r)
    ex = GraphExecutor(pool)
    plan = ex.plan(g)
    assert plan.peak_bytes < plan.no_reuse_bytes / 4  # buffers really are reused
    for _ in range(2):
        out = ex.run(g)
        np.testing.assert_allclose(out.to_numpy(), ref["n23"], rtol=1e-4, atol=1e-3)
        pool.release(out)
    q.finish()


def test_chain_of_equal_ops_takes_two_blocks(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    """12 equal ops in a chain: two values are alive at once, so the pool takes two blocks (the
    release-at-refcount-zero figure), not an arena of two plus an output block."""
    x = Tensor.from_numpy(np.ones(1024, np.float32), queue)
    g = Graph()
    cur: Tensor | TensorRef = x
    for i in range(12):
        cur = g.add_op(f"c{i}", kernels.add, [cur, x], (1024,), np.float32)
    ex = GraphExecutor(pool)
    plan = ex.plan(g)
    assert plan.lower_bound == 2 * 4096
    assert plan.lower_bound_outputs_whole_run == 3 * 4096
    out = ex.run(g)
    np.testing.assert_array_equal(out.to_numpy(), np.full(1024, 13.0, np.float32))
    block = pool.block_bytes(4096)
    s = pool.stats
    assert s.peak_bytes == plan.pool_peak_bytes == 2 * block
    assert s.bytes_in_use + s.bytes_held == plan.pool_device_bytes == 2 * block
    pool.release(out)


def test_describe_names_the_strategy_and_why(queue: cl.CommandQueue, pool: BufferPool) -> None:
    def noop(inputs: list[Tensor], out: Tensor) -> None:
        pass

    g = Graph()
    a = g.add_op("a", noop, [], (64,), np.float32)
    g.add_op("b", noop, [a], (64,), np.float32)
    plan = GraphExecutor(pool).plan(g)
    text = plan.describe()
    assert f"strategy {plan.strategy}" in text
    assert plan.strategy in plan.candidates
    assert plan.candidates[plan.strategy] == plan.pool_device_bytes == min(plan.candidates.values())
    assert "why: least device memory for a run from an empty pool" in text
    assert f"lower bound {plan.lower_bound} B" in text
    for name in ("arena", "block_per_tensor", "one_block"):
        assert name in plan.strategy_reason or name == plan.strategy
    # the public report holds no run state
    assert not [f for f in dataclasses.fields(plan) if f.name.startswith("_")]


def test_op_that_cannot_be_allocated_is_named(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    keep = pool.allocate((8,), np.float32)
    before = pool.stats
    x = Tensor.from_numpy(np.ones(64, np.float32), queue)
    g = Graph()
    a = g.add_op("small", kernels.relu, [x], (64,), np.float32)
    g.add_op("huge", kernels.relu, [a], (2**40,), np.float32)
    g.add_op("after", kernels.relu, [TensorRef("huge")], (64,), np.float32)
    ex = GraphExecutor(pool)
    with pytest.raises(MemoryError, match=r"op '(small|huge)' needs a block of \d+ bytes") as info:
        ex.run(g, outputs=["huge", "after"])
    msg = str(info.value)
    assert "(the block of output 'huge') that cannot be allocated" in msg, msg  # it holds no other
    assert "cannot allocate" in msg and "bytes in use" in msg
    after = pool.stats
    assert (after.bytes_in_use, after.live_tensors) == (before.bytes_in_use, before.live_tensors)
    pool.release(keep)


def test_graph_beyond_the_pool_limit(queue: cl.CommandQueue, kernels: Any) -> None:
    pool = BufferPool(queue, limit=64 * 1024)
    keep = pool.allocate((1024,), np.float32)
    before = pool.stats
    x = Tensor.from_numpy(np.ones(4096, np.float32), queue)
    g = Graph()
    cur: Tensor | TensorRef = x
    for i in range(3):
        cur = g.add_op(f"big{i}", kernels.add, [cur, x] if i else [x, x], (8192,), np.float32)
    g.add_op("wide", kernels.relu, [cur], (16384,), np.float32)
    with pytest.raises(MemoryError, match=r"run: op '\w+' needs .*pool limit is 65536"):
        GraphExecutor(pool).run(g, outputs=["big0", "wide"])
    after = pool.stats
    assert (after.bytes_in_use, after.live_tensors) == (before.bytes_in_use, before.live_tensors)
    pool.release(keep)


def _views_graph(queue: cl.CommandQueue, kernels: Any) -> Graph:
    """Five ops of alternating sizes: run for outputs n1 and n4, its plan makes views on blocks."""
    x = Tensor.from_numpy(np.ones(4096, np.float32), queue)
    g = Graph()
    cur: Tensor | TensorRef = x
    for i in range(5):
        cur = g.add_op(f"n{i}", kernels.mix_fn(1.0), [cur, x], (4096 * (1 + i % 2),), np.float32)
    return g


def test_free_held_frees_the_last_blocks(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    """The executor's cached views retain their block's memory: free_held() drops them."""
    g = _views_graph(queue, kernels)
    ex = GraphExecutor(pool)
    pool.release(ex.run(g, outputs=["n1", "n4"])[0])
    (state,) = ex._runs[g].values()
    assert any(state.views)
    pool.free_held()
    assert not any(state.views)
    assert pool.stats.bytes_held == 0
    outs = ex.run(g, outputs=["n1", "n4"])  # and runs again with fresh blocks
    np.testing.assert_array_equal(outs[0].to_numpy(), np.full(8192, 3.0, np.float32))
    np.testing.assert_array_equal(outs[1].to_numpy(), np.full(4096, 6.0, np.float32))
    pool.release_all(outs)


def test_views_take_no_reference_from_their_pool_block(
    ctx: cl.Context, queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    """The views made on a pool block hold it as any sub-buffer holds its buffer: the block's
    OpenCL reference count is a plain buffer's with as many sub-buffers, plus the pool's own
    (one taken away would free the block under the pool)."""
    g = _views_graph(queue, kernels)
    ex = GraphExecutor(pool)
    outs = ex.run(g, outputs=["n1", "n4"])
    gc.collect()
    (state,) = ex._runs[g].values()
    count = cl.mem_info.REFERENCE_COUNT
    for k, cache in enumerate(state.views):
        for ptr, views in cache.items():
            plain = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 20)
            subs = [plain.get_sub_region(0, 256) for _ in views.tensors]
            block = cl.Buffer.from_int_ptr(ptr, retain=True)  # the pool's and this one's
            assert block.get_info(count) == plain.get_info(count) + 1, (k, len(subs))
    assert any(state.views)
    pool.release_all(outs)


def test_memory_error_raised_by_an_op_is_not_taken_for_a_block(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any
) -> None:
    # the op's own MemoryError (say, a host allocation) is named as what the op raised
    x = Tensor.from_numpy(np.ones(64, np.float32), queue)

    def hungry(inputs: list[Tensor], out: Tensor) -> None:
        raise MemoryError("host buffer of 2 TB")

    g = Graph()
    a = g.add_op("a", kernels.relu, [x], (64,), np.float32)
    g.add_op("hungry", hungry, [a], (64,), np.float32)
    with pytest.raises(RuntimeError) as info:
        GraphExecutor(pool).run(g)
    assert str(info.value) == (
        "GraphExecutor.run: op 'hungry' raised MemoryError: host buffer of 2 TB"
    )
    assert isinstance(info.value.__cause__, MemoryError)
    assert pool.stats.bytes_in_use == 0
