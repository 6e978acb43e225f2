"""Memory mistakes named, not silent: a graph intermediate kept past its run raises on use, and
checked mode (guard bytes, poisoned freed blocks) names the op that wrote out of bounds. Real
kernels on the default device; the overruns run in a subprocess, where a broken guard could
crash or hang the device instead of failing the test."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool, MemoryCheckError, guard_bytes
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor

INC = "__kernel void inc(__global const float *a, __global float *o) "
INC += "{ int i = get_global_id(0); o[i] = a[i] + 1; }"


# o[i] = a[i % na] + 1: an increment that reads only its input's elements, whatever the sizes
INC_MOD = "__kernel void inc_mod(__global const float *a, uint na, __global float *o) "
INC_MOD += "{ int i = get_global_id(0); o[i] = a[i % na] + 1; }"


@pytest.fixture(scope="module")
def inc_kernel(ctx: cl.Context) -> cl.Kernel:
    return cl.Kernel(cl.Program(ctx, INC).build(), "inc")


@pytest.fixture(scope="module")
def inc_mod(ctx: cl.Context) -> cl.Kernel:
    return cl.Kernel(cl.Program(ctx, INC_MOD).build(), "inc_mod")


def _chain(
    queue: cl.CommandQueue, inc: cl.Kernel, sizes: list[int], kept: dict[str, Tensor]
) -> Graph:
    """A chain of increments n0 -> n1 -> ... whose fns keep their ``out`` in ``kept``."""

    def op(name: str) -> Callable[[list[Tensor], Tensor], None]:
        def fn(inputs: list[Tensor], out: Tensor) -> None:
            a = inputs[0]
            inc(out.queue, (out.size,), None, a.buffer, np.uint32(a.size), out.buffer)
            kept[name] = out  # the debugging habit: keep the output to look at it later

        return fn

    g = Graph()
    cur: Any = Tensor.from_numpy(np.zeros(max(sizes), np.float32), queue)
    for i, n in enumerate(sizes):
        cur = g.add_op(f"n{i}", op(f"n{i}"), [cur], (n,), np.float32)
    return g


def test_kept_intermediate_raises_after_the_run(queue: cl.CommandQueue, inc_kernel: Any) -> None:
    """The issue's graph a -> b -> c: a's output, kept, read after the run raises naming a, the
    graph and what to do (before, it read 3, c's value, where a wrote 1)."""
    kept: dict[str, Tensor] = {}
    x = Tensor.from_numpy(np.zeros(1024, np.float32), queue)
    g = Graph()

    def inc(name: str) -> Callable[[list[Tensor], Tensor], None]:
        def fn(inputs: list[Tensor], out: Tensor) -> None:
            inc_kernel(out.queue, (out.size,), None, inputs[0].buffer, out.buffer)
            kept[name] = out

        return fn

    ref = g.add_op("a", inc("a"), [x], (1024,), np.float32)
    ref = g.add_op("b", inc("b"), [ref], (1024,), np.float32)
    g.add_op("c", inc("c"), [ref], (1024,), np.float32)
    pool = BufferPool(queue)
    ex = GraphExecutor(pool)
    for _ in range(3):  # the executor reuses the Tensor objects: each run ends them again
        out = ex.run(g)
        assert (out.to_numpy() == 3).all()  # the output asked for is unaffected
        for use in (lambda t: t.to_numpy(), lambda t: t.buffer, lambda t: t.as_array()):
            with pytest.raises(
                RuntimeError,
                match=r"is intermediate 'a' of Graph\(3 ops: a, b, "
                r"c\): its run ended .* request it as an output \(run\(graph, "
                r"outputs=\[\.\.\., 'a'\]\)\) or copy it inside the op",
            ):
                use(kept["a"])
        with pytest.raises(ValueError, match="is intermediate 'a'"):
            pool.release(kept["a"])
        pool.release(out)
    a, c = ex.run(g, outputs=["a", "c"])  # requested: a is an output, and stays live
    assert kept["a"] is a and (a.to_numpy() == 1).all()
    with pytest.raises(RuntimeError, match="intermediate 'b'"):
        kept["b"].to_numpy()
    pool.release_all([a, c])


def test_values_of_a_failed_run_raise_when_used(queue: cl.CommandQueue, inc_kernel: Any) -> None:
    """A run whose third op raises: the values the first two ops made, kept by their fns, are
    gone with the run: the intermediate's use names it, the graph and what to do; the output
    block went back to the pool."""
    kept: dict[str, Tensor] = {}
    x = Tensor.from_numpy(np.zeros(1024, np.float32), queue)

    def inc(name: str) -> Callable[[list[Tensor], Tensor], None]:
        def fn(inputs: list[Tensor], out: Tensor) -> None:
            inc_kernel(out.queue, (out.size,), None, inputs[0].buffer, out.buffer)
            kept[name] = out

        return fn

    def boom(inputs: list[Tensor], out: Tensor) -> None:
        raise ZeroDivisionError("no")

    g = Graph()
    ref = g.add_op("a", inc("a"), [x], (1024,), np.float32)
    ref = g.add_op("b", inc("b"), [ref], (1024,), np.float32)
    g.add_op("c", boom, [ref], (1024,), np.float32)
    pool = BufferPool(queue)
    ex = GraphExecutor(pool)
    with pytest.raises(RuntimeError, match=r"op 'c' raised ZeroDivisionError: no"):
        ex.run(g, outputs=["b", "c"])
    assert pool.stats.bytes_in_use == 0
    with pytest.raises(RuntimeError) as used:
        kept["a"].to_numpy()
    assert str(used.value).endswith(
        "is intermediate 'a' of Graph(3 ops: a, b, c): its run ended and its memory now holds "
        "other values; request it as an output (run(graph, outputs=[..., 'a'])) or copy it "
        "inside the op"
    )
    with pytest.raises(RuntimeError) as used:
        kept["b"].to_numpy()
    assert str(used.value).endswith(
        " was released to its BufferPool; a released tensor cannot be used"
    )


@pytest.mark.parametrize("outputs", [None, ["n7", "n2"], ["n0", "n5"]])
@pytest.mark.parametrize(
    "sizes",
    [
        [256] * 8,
        [1024, 3000, 256, 1024, 5000, 64, 1024, 700],
        [8000, 4000, 2000, 1000, 500, 250, 125, 64],
    ],
)
def test_every_intermediate_ends_in_every_layout(
    queue: cl.CommandQueue, inc_mod: Any, sizes: list[int], outputs: list[str] | None
) -> None:
    """Views of an arena, values in an output's block and blocks of their own (pool Tensors):
    every intermediate ends with the run, every output stays live."""
    kept: dict[str, Tensor] = {}
    g = _chain(queue, inc_mod, sizes, kept)
    pool = BufferPool(queue)
    ex = GraphExecutor(pool)
    result = ex.run(g, outputs)
    plan = ex.plan(g, outputs)
    results = result if isinstance(result, list) else [result]
    for name in plan.order:
        if name in plan.outputs:
            assert kept[name] is results[plan.outputs.index(name)]
            assert kept[name].to_numpy()[0] == int(name[1:]) + 1
        else:
            with pytest.raises(RuntimeError, match=f"is intermediate '{name}'"):
                kept[name].to_numpy()
    pool.release_all(results)


@pytest.mark.parametrize("sizes", [[256] * 3, [1024, 3000, 256], [8000, 4000, 2000]])
def test_failed_run_ends_its_intermediates(
    queue: cl.CommandQueue, inc_mod: Any, sizes: list[int]
) -> None:
    """A run that fails at its last op, which reads n1: n0 ended before, n1 and n2 are held
    when it fails; each, a block's owner or a view in it, names itself when used."""
    kept: dict[str, Tensor] = {}
    g = _chain(queue, inc_mod, sizes, kept)

    def boom(inputs: list[Tensor], out: Tensor) -> None:
        raise ZeroDivisionError("boom")

    g.add_op("boom", boom, [g.ops[-1].inputs[0]], (256,), np.float32)
    pool = BufferPool(queue)
    with pytest.raises(RuntimeError, match="op 'boom' raised ZeroDivisionError"):
        GraphExecutor(pool).run(g)
    for name in ("n0", "n1", "n2"):
        with pytest.raises(RuntimeError, match=f"intermediate '{name}'"):
            kept[name].to_numpy()
    assert pool.stats.bytes_in_use == 0


def _run_child(src: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``src`` in a fresh interpreter: a guard that failed could crash or hang the device."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(src)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


OVERRUN = f"""
    import numpy as np, pyopencl as cl
    from netcl.core.device import default_queue
    from netcl.core.memory import BufferPool, MemoryCheckError
    from netcl.core.tensor import Tensor
    from netcl.runtime.graph import Graph, GraphExecutor

    queue = default_queue()
    inc = cl.Kernel(cl.Program(queue.context, {INC!r}).build(), "inc")
    ran = []

    def op(scale):
        def fn(inputs, out):
            ran.append(len(ran))
            inc(out.queue, (scale * out.size,), None, inputs[0].buffer, out.buffer)
        return fn

    x = Tensor.from_numpy(np.zeros(2048, np.float32), queue)
    g = Graph()
    ref = g.add_op("a", op(1), [x], (1024,), np.float32)
    ref = g.add_op("b", op(1), [ref], (1024,), np.float32)
    ref = g.add_op("c", op(2), [ref], (1024,), np.float32)  # twice its output's size
    g.add_op("d", op(1), [ref], (1024,), np.float32)
    pool = BufferPool(queue)  # checked mode from NETCL_CHECK_MEMORY
    assert pool.check_memory
    try:
        GraphExecutor(pool).run(g)
    except MemoryCheckError as exc:
        print(exc)
        print("ops run:", len(ran))
        print("pool in use:", pool.stats.bytes_in_use)
"""


@pytest.mark.timeout(90)
def test_checked_mode_names_the_op_that_overran() -> None:
    """The issue's example: a kernel writing 2x its output's size into a 1,024-element
    intermediate hung PoCL or crashed the process; in checked mode its guard takes the writes
    and the run stops right after op c, naming it, the tensor, its size and the bytes."""
    child = _run_child(OVERRUN, NETCL_CHECK_MEMORY="1")
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert lines[0].startswith(
        "GraphExecutor.run: op 'c' wrote 4096 bytes past the end of its intermediate 'c' "
        "(shape (1024,), float32, 4096 bytes) of Graph(4 ops: a, b, c, ...)"
    ), child.stdout
    assert lines[1:] == ["ops run: 3", "pool in use: 0"]  # d never ran; every block went back


UNDERRUN = f"""
    import numpy as np, pyopencl as cl
    from netcl.core.device import default_queue
    from netcl.core.memory import BufferPool, MemoryCheckError
    from netcl.core.tensor import Tensor
    from netcl.runtime.graph import Graph, GraphExecutor

    queue = default_queue()
    src = {INC!r}.replace("o[i] =", "o[i - 4] =")  # writes 16 bytes before its output
    inc = cl.Kernel(cl.Program(queue.context, src).build(), "inc")

    def fn(inputs, out):
        inc(out.queue, (out.size,), None, inputs[0].buffer, out.buffer)

    x = Tensor.from_numpy(np.zeros(5000, np.float32), queue)
    g = Graph()
    ref = x
    for i, n in enumerate([1024, 3000, 256, 1024, 5000, 64, 1024, 700]):
        ref = g.add_op(f"n{{i}}", fn, [ref], (n,), np.float32)
    try:  # n0 is a view of a block (one_block): a guard before it too
        GraphExecutor(BufferPool(queue, check_memory=True)).run(g)
    except MemoryCheckError as exc:
        print(str(exc).split(" (")[0])
"""


@pytest.mark.timeout(90)
def test_checked_mode_names_a_write_before_the_start() -> None:
    child = _run_child(UNDERRUN)
    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == [
        "GraphExecutor.run: op 'n0' wrote 16 bytes before the start of its intermediate 'n0'"
    ], child.stdout


def test_checked_mode_names_a_write_before_a_view_in_process(
    queue: cl.CommandQueue, inc_mod: Any
) -> None:
    """The write before the start above, in this process: only n0 writes out of bounds, and n0
    is a view in the middle of its block (checked first), so even a guard left out could not
    send the write outside the block."""
    src = INC.replace("o[i] =", "o[i - 4] =")  # writes 16 bytes before its output
    under = cl.Kernel(cl.Program(queue.context, src).build(), "inc")

    def first(inputs: list[Tensor], out: Tensor) -> None:
        under(out.queue, (out.size,), None, inputs[0].buffer, out.buffer)

    def rest(inputs: list[Tensor], out: Tensor) -> None:
        a = inputs[0]
        inc_mod(out.queue, (out.size,), None, a.buffer, np.uint32(a.size), out.buffer)

    ref: Any = Tensor.from_numpy(np.zeros(5000, np.float32), queue)
    g = Graph()
    for i, n in enumerate([1024, 3000, 256, 1024, 5000, 64, 1024, 700]):
        ref = g.add_op(f"n{i}", rest if i else first, [ref], (n,), np.float32)
    pool = BufferPool(queue, check_memory=True)
    ex = GraphExecutor(pool)
    assert ex.plan(g).lifetimes["n0"].offset >= 64, ex.plan(g).describe()
    with pytest.raises(MemoryCheckError) as info:
        ex.run(g)
    assert str(info.value).startswith(
        "GraphExecutor.run: op 'n0' wrote 16 bytes before the start of its intermediate 'n0' "
        "(shape (1024,), float32, 4096 bytes) of Graph(8 ops: n0, n1, n2, ...)"
    ), str(info.value)
    assert pool.stats.bytes_in_use == 0


def test_checked_mode_runs_clean_graphs_as_plain_mode(queue: cl.CommandQueue, inc_mod: Any) -> None:
    """No false alarm, the same results; the plan's figures count the guards."""
    sizes = [1024, 3000, 256, 1024, 5000, 64, 1024, 700]
    plain = GraphExecutor(BufferPool(queue, check_memory=False))
    checked = GraphExecutor(BufferPool(queue, check_memory=True))
    assert checked.pool.check_memory and not plain.pool.check_memory
    for outputs in (None, ["n7", "n3"], ["n1", "n4", "n6"]):
        g = _chain(queue, inc_mod, sizes, {})
        for _ in range(2):
            got = [ex.run(g, outputs) for ex in (plain, checked)]
            a, b = ([r] if isinstance(r, Tensor) else r for r in got)
            assert [t.to_numpy().tolist() for t in a] == [t.to_numpy().tolist() for t in b]
            plain.pool.release_all(a)
            checked.pool.release_all(b)
        assert checked.plan(g, outputs).lower_bound > plain.plan(g, outputs).lower_bound


def test_freed_blocks_read_as_poison(queue: cl.CommandQueue, inc_kernel: Any, inc_mod: Any) -> None:
    """A read of freed memory (a raw buffer of an intermediate kept past the run) shows NaN."""
    pool = BufferPool(queue, check_memory=True)
    host = np.zeros(256, np.float32)
    raws: list[Any] = []

    def keep_input(inputs: list[Tensor], out: Tensor) -> None:
        raws.append(inputs[0].buffer)
        inc_kernel(out.queue, (out.size,), None, inputs[0].buffer, out.buffer)

    g = _chain(queue, inc_mod, [256] * 4, {})
    g.add_op("last", keep_input, [g.ops[-1].inputs[0]], (256,), np.float32)
    pool.release(GraphExecutor(pool).run(g))
    cl.enqueue_copy(queue, host, raws[0])  # n2's output: an intermediate, freed with its block
    assert np.isnan(host).all()


def test_checked_mode_gives_a_view_its_bytes_and_the_guard_after_them(
    queue: cl.CommandQueue,
) -> None:
    """In checked mode a value that is a view inside a block sees a buffer of its bytes and its
    guard after them (aligned): a kernel sized by the buffer writes into its own guard, never
    past it into the next value's guard."""
    sizes = [1024, 3000, 256, 1024, 5000, 64, 1024, 700]
    seen: dict[str, int] = {}

    def op(name: str) -> Callable[[list[Tensor], Tensor], None]:
        def fn(inputs: list[Tensor], out: Tensor) -> None:
            seen[name] = out.buffer.size

        return fn

    g = Graph()
    ref: Any = Tensor.from_numpy(np.zeros(8, np.float32), queue)
    for i, n in enumerate(sizes):
        ref = g.add_op(f"n{i}", op(f"n{i}"), [ref], (n,), np.float32)
    ex = GraphExecutor(BufferPool(queue, check_memory=True))
    ex.pool.release(ex.run(g))
    plan, unit = ex.plan(g), ex.alignment
    views = [n for n, lt in plan.lifetimes.items() if plan.blocks[lt.block].owner != n]
    assert views, plan.describe()
    for name in views:
        nbytes = 4 * sizes[int(name[1:])]
        assert seen[name] == -(-(nbytes + guard_bytes(nbytes)) // unit) * unit, (name, seen)


def test_a_failed_run_ends_the_intermediates_that_own_their_blocks(
    queue: cl.CommandQueue,
) -> None:
    """A block per tensor: n0 and n1 each own a block, both held when the last op (reading
    them) fails; used afterwards, each names itself, as a view in a block would."""
    kept: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[[list[Tensor], Tensor], None]:
        def fn(inputs: list[Tensor], out: Tensor) -> None:
            kept[name] = out

        return fn

    def boom(inputs: list[Tensor], out: Tensor) -> None:
        raise ZeroDivisionError("boom")

    g = Graph()
    a = g.add_op("n0", keep("n0"), [], (1024,), np.float32)
    b = g.add_op("n1", keep("n1"), [a], (1024,), np.float32)
    g.add_op("boom", boom, [a, b], (2048,), np.float32)
    pool = BufferPool(queue)
    ex = GraphExecutor(pool)
    plan = ex.plan(g)
    if not plan.strategy.startswith("block_per_tensor"):
        pytest.skip(f"{plan.strategy} on this device: the intermediates are views")
    with pytest.raises(RuntimeError, match="op 'boom' raised ZeroDivisionError"):
        ex.run(g)
    for name in ("n0", "n1"):
        with pytest.raises(RuntimeError, match=f"is intermediate '{name}' of Graph"):
            kept[name].to_numpy()
    assert pool.stats.bytes_in_use == 0
