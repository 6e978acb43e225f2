"""A capture moves only memory it saw born. A buffer that existed at begin() keeps its memory and
its contents whatever the captured code does to it (drops it, releases it to its pool, replaces
it), so every replay computes what the code computed, with other allocations and writes between
the replays. Each case runs with both of the arena's rules: regions of one arena (CPU devices)
and the GPU's slots of one size, forced here on PoCL."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.tools as cltools
import pytest

from netcl.core import contract
from netcl.core.memory import BufferPool
from netcl.runtime.capture import KernelCapture, _memory, capture_step

N = 1 << 14
NBYTES = 4 * N


@pytest.fixture(params=["regions", "slots"])
def rule(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "slots":  # what a GPU does: buffers of one size share slots
        monkeypatch.setattr(_memory, "_may_overlap", lambda ctx: False)
    return str(request.param)


def _host(seed: float) -> np.ndarray[Any, Any]:
    return np.linspace(-seed, seed, N, dtype=np.float32)


TABLE = _host(5.0) ** 2  # contents written before begin(): an input of every replay


def _churn(queue: cl.CommandQueue, pools: tuple[Any, ...] = ()) -> list[Any]:
    """Other code between replays: new buffers, pool blocks and arrays, written with garbage
    (returned: the caller keeps them alive while the replay runs, then writes them again)."""
    taken: list[Any] = [cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES) for _ in range(4)]
    for pool in pools:
        if isinstance(pool, BufferPool):
            taken += [pool.allocate(N, np.float32).buffer for _ in range(4)]
        else:
            taken += [pool.allocate(NBYTES) for _ in range(4)]
    for t in taken:
        cl.enqueue_fill_buffer(queue, t, np.float32(np.nan), 0, NBYTES)
    return taken


def _replays_match(
    queue: cl.CommandQueue, cap: KernelCapture, x: cla.Array, out: Any, pools: tuple[Any, ...] = ()
) -> None:
    """Replays for two inputs compute x + TABLE (what the captured code computed)."""
    got = np.empty(N, np.float32)
    for seed in (2.0, 3.5):
        x.set(_host(seed))
        taken = _churn(queue, pools)
        cap.replay()
        for t in taken:  # written again while the replay may still run
            cl.enqueue_fill_buffer(queue, t, np.float32(-9.0), 0, NBYTES)
        cl.enqueue_copy(queue, got, out if isinstance(out, cl.MemoryObjectHolder) else out.data)
        np.testing.assert_array_equal(got, _host(seed) + TABLE)
        del taken
        gc.collect()  # the churn's pool blocks back in their pools before the next replay


@pytest.mark.parametrize("holder", ["local", "cache", "attribute"])
def test_a_table_written_before_begin_and_dropped_inside_keeps_its_contents(
    queue: cl.CommandQueue, rule: str, holder: str
) -> None:
    """A lookup table read by a captured kernel, then dropped by the code: a local going out of
    scope, a cache entry evicted, an attribute replaced."""
    x = cla.to_device(queue, _host(1.0))
    cache = {"table": cla.to_device(queue, TABLE)}
    model = SimpleNamespace(table=cla.to_device(queue, TABLE))
    table = cla.to_device(queue, TABLE)
    cap = KernelCapture()
    with cap:
        if holder == "local":
            out = x + table
            del table
        elif holder == "cache":
            out = x + cache.pop("table")
        else:
            out = x + model.table
            model.table = None
        gc.collect()
    assert cap.memory is not None and cap.memory.internal == 0  # nothing born, nothing moved
    _replays_match(queue, cap, x, out)


@pytest.mark.parametrize("kind", ["BufferPool", "pyopencl MemoryPool"])
def test_a_pool_block_filled_before_begin_and_released_inside_keeps_its_contents(
    queue: cl.CommandQueue, kernels: Any, rule: str, kind: str
) -> None:
    """A pool block allocated and filled before begin(), read in the capture and released to
    its pool inside it: the pool never hands it out again while the capture lives."""
    pool: Any = BufferPool(queue) if kind == "BufferPool" else None
    if pool is None:
        pool = cltools.MemoryPool(cltools.ImmediateAllocator(queue))
        block: Any = pool.allocate(NBYTES)
    else:
        tensor = pool.allocate(N, np.float32)
        block = tensor.buffer
    cl.enqueue_copy(queue, block, TABLE)
    x = cla.to_device(queue, _host(1.0))
    out = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    cap = KernelCapture()
    with cap:
        kernels.add(queue, (N,), None, out, x.data, block)
        if kind == "BufferPool":
            pool.release(tensor)
        del block
    assert cap.memory is not None and cap.memory.internal == 0
    _replays_match(queue, cap, x, out, (pool,))


def test_an_array_made_before_begin_and_replaced_inside_keeps_its_contents(
    queue: cl.CommandQueue, rule: str
) -> None:
    """A model that replaces its state array by a new one each call (``self.table = new``):
    the old array is an input of every replay; the new one, born and kept, is an output."""

    class Model:
        def __init__(self) -> None:
            self.table = cla.to_device(queue, TABLE)

        def __call__(self, x: cla.Array) -> cla.Array:
            out = x + self.table
            self.table = self.table * 1.0 + 0.0  # temporaries, then the new state
            return out

    x = cla.to_device(queue, _host(1.0))
    model = Model()
    cap = KernelCapture()
    with cap:
        out = model(x)
    assert cap.memory is not None and cap.memory.internal == 1  # the temporary between
    _replays_match(queue, cap, x, out)
    np.testing.assert_array_equal(model.table.get(), TABLE)


def test_a_sub_buffer_of_a_buffer_from_before_begin_keeps_its_parent_s_contents(
    queue: cl.CommandQueue, rule: str
) -> None:
    parent = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 2 * NBYTES)
    cl.enqueue_copy(queue, parent, TABLE, dst_offset=NBYTES)
    x = cla.to_device(queue, _host(1.0))
    cap = KernelCapture()
    with cap:
        view = cla.Array(queue, N, np.float32, data=parent.get_sub_region(NBYTES, NBYTES))
        out = x + view
        del parent, view
    _replays_match(queue, cap, x, out)


@pytest.mark.parametrize("kind", ["BufferPool", "pyopencl MemoryPool"])
def test_a_block_a_pool_hands_out_inside_is_the_capture_s_and_a_live_one_stays(
    queue: cl.CommandQueue, kernels: Any, rule: str, kind: str
) -> None:
    """A block a pool hands out during the recording is the recorded code's allocation, made
    now or held since before begin() (its contents are undefined): it may move. A block the
    application held at begin() stays, with what it holds."""
    pool: Any = BufferPool(queue) if kind == "BufferPool" else None
    if pool is None:
        pool = cltools.MemoryPool(cltools.ImmediateAllocator(queue))
        allocate, release = (lambda: pool.allocate(NBYTES)), (lambda block: None)
    else:
        live = {}

        def allocate() -> Any:
            t = pool.allocate(N, np.float32)
            live[contract.mem_ptr(t.buffer)] = t
            return t.buffer

        def release(block: Any) -> None:
            pool.release(live.pop(contract.mem_ptr(block)))

    for held in [allocate() for _ in range(2)]:  # two blocks the pool holds at begin()
        release(held)
    del held
    table = allocate()  # the application's, live at begin()
    cl.enqueue_copy(queue, table, TABLE)
    x = cla.to_device(queue, _host(1.0))
    out = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    cap = KernelCapture()
    with cap:
        temps = [allocate() for _ in range(3)]  # two held before, one made now
        kernels.add(queue, (N,), None, temps[0], x.data, table)
        kernels.scale_shift(queue, (N,), None, temps[1], temps[0], 1.0, 0)
        kernels.scale_shift(queue, (N,), None, temps[2], temps[1], 1.0, 0)
        kernels.scale_shift(queue, (N,), None, out, temps[2], 1.0, 0)
        for block in [table, *temps]:
            release(block)
        del table, temps, block
    mem = cap.memory
    assert mem is not None and mem.internal == 3  # the temporaries, not the table
    _replays_match(queue, cap, x, out, (pool,))


def _table_step(queue: cl.CommandQueue, pool: BufferPool) -> Any:
    """A step whose temporaries come from ``pool`` and that reads a table written before."""
    table = cla.to_device(queue, np.tile(TABLE, 2))

    def step(x: cla.Array) -> cla.Array:
        t = pool.allocate(x.shape, np.float32)
        scratch = cla.Array(queue, x.shape, np.float32, data=t.buffer)
        scratch[:] = x + table[: x.size]
        out = scratch * 1.0
        pool.release(t)
        return out

    return step


@pytest.mark.parametrize("max_captures", [8, 1])
def test_a_steps_keys_from_one_pool_and_a_key_captured_again_replay_exactly(
    queue: cl.CommandQueue, rule: str, max_captures: int
) -> None:
    """Two keys of one step take their temporaries from one pool: the second key's blocks are
    those the first one's capture gave back (held before its begin()). With one capture at a
    time, each key is evicted and captured again."""
    pool = BufferPool(queue)
    step = capture_step(_table_step(queue, pool), max_captures=max_captures)
    xs = [cla.to_device(queue, _host(1.0)), cla.to_device(queue, _host(1.0)[: N // 2])]
    for round_ in range(4):
        for x in xs:
            x.set(_host(round_ + 1.0)[: x.size])
            _churn(queue, (pool,))
            out = step(x).get()
            np.testing.assert_array_equal(out, _host(round_ + 1.0)[: x.size] + TABLE[: x.size])
    assert step.stats.captures >= 2


def test_an_object_held_by_one_local_alone_reads_as_alone() -> None:
    """What end() relies on to call a buffer unreachable: an object whose only reference is
    handed over reads _ALONE; one more reference anywhere reads more (on this Python)."""
    assert _memory._refs([object()]) == _memory._ALONE
    other = object()
    holders = [other]
    assert _memory._refs([other]) > _memory._ALONE
    assert _memory._refs(holders) > _memory._ALONE  # `other` still holds it


def test_a_born_buffer_a_sub_buffer_is_carved_from_stays_with_it(
    queue: cl.CommandQueue, kernels: Any, rule: str
) -> None:
    """A buffer born and dropped in the capture, used by a kernel directly and through a
    sub-buffer: both name the same memory, so the parent stays where the sub-buffer is."""
    x = cla.to_device(queue, _host(1.0))
    out = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    cap = KernelCapture()
    with cap:
        parent = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 2 * NBYTES)
        kernels.add(queue, (N,), None, parent, x.data, x.data)  # parent[:N] = 2x
        view = parent.get_sub_region(0, NBYTES)
        kernels.scale_shift(queue, (N,), None, out, view, 0.5, 0)  # out = x, through the view
        del parent, view
    got = np.empty(N, np.float32)
    for seed in (2.0, 3.5):
        x.set(_host(seed))
        taken = _churn(queue)
        cap.replay()
        cl.enqueue_copy(queue, got, out)
        np.testing.assert_array_equal(got, _host(seed))
        del taken


def _out_of_order(ctx: cl.Context) -> cl.CommandQueue:
    try:
        return cl.CommandQueue(
            ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
        )
    except cl.Error as exc:  # pragma: no cover - a device without out-of-order queues
        pytest.skip(f"the device has no out-of-order queues: {exc}")


def _sequential_temporaries(queues: list[cl.CommandQueue], kernels: Any, x: Any, out: Any) -> None:
    """Four temporaries, each dead before the next is born: on one in-order queue two regions
    (or slots) serve them all."""
    for k in range(4):
        queue = queues[k % len(queues)]
        t = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
        kernels.scale_shift(queue, (N,), None, t, x, 2.0, 0)
        kernels.add(queue, (N,), None, out, t, x)
        del t


@pytest.mark.parametrize("queues", ["one in-order", "out-of-order", "two"])
def test_temporaries_only_events_order_keep_memory_of_their_own(
    queue: cl.CommandQueue, kernels: Any, rule: str, queues: str
) -> None:
    """Lifetimes prove that buffers never overlap in time only on one in-order queue: on an
    out-of-order queue or across queues each moved buffer keeps memory of its own."""
    ctx = queue.context
    used = {
        "one in-order": [queue],
        "out-of-order": [_out_of_order(ctx)],
        "two": [queue, cl.CommandQueue(ctx)],
    }[queues]
    x = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, NBYTES)
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, NBYTES)
    cap = KernelCapture()
    with cap:
        _sequential_temporaries(used, kernels, x, out)
    mem = cap.memory
    assert mem is not None and mem.internal == 4 and mem.internal_bytes == 4 * NBYTES
    if queues == "one in-order":
        assert mem.arena_bytes < 4 * NBYTES
    else:
        assert mem.arena_bytes >= 4 * NBYTES


def test_a_step_on_an_out_of_order_queue_gives_each_key_memory_of_its_own(
    queue: cl.CommandQueue, kernels: Any, rule: str, metric_points: Any
) -> None:
    """A step's keys share one arena (or slots) only on an in-order queue, where their replays
    never overlap: on an out-of-order queue nothing orders one key's replay after another's."""

    def arena_gauge() -> float:
        return sum(p.value for p in metric_points("netcl.capture.arena_bytes"))

    ooo = _out_of_order(queue.context)

    def fn(x: cla.Array, out: cla.Array) -> None:
        _sequential_temporaries([ooo], kernels, x.data, out.data)

    step = capture_step(fn)
    shapes = [(N,), (N // 2, 2)]  # two keys, the same bytes
    args = [(cla.zeros(ooo, s, np.float32), cla.zeros(ooo, s, np.float32)) for s in shapes]
    before = arena_gauge()
    for _ in range(2):  # normal run, capture
        for x, out in args:
            step(x, out)
    ooo.finish()
    assert arena_gauge() - before >= 2 * 4 * NBYTES  # two keys, four regions each


def test_after_a_raw_handle_is_reached_nothing_moves(
    queue: cl.CommandQueue, kernels: Any, rule: str
) -> None:
    """Code that reached a raw handle (a native library's work the capture cannot see) may use
    what the capture saw born: end(allow_native=True) keeps every buffer where it is."""
    x = cla.to_device(queue, _host(1.0))
    out = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    cap = KernelCapture()
    cap.begin()
    t = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    assert t.int_ptr  # what a native library is handed
    kernels.scale_shift(queue, (N,), None, t, x.data, 2.0, 0)
    kernels.add(queue, (N,), None, out, t, x.data)
    del t
    cap.end(allow_native=True)
    assert cap.memory is not None and cap.memory.internal == 0


def test_while_recording_pyopencl_buffer_still_answers_as_the_class(
    queue: cl.CommandQueue,
) -> None:
    """``pyopencl.Buffer`` notes births while recording; to code that asks, it is the class."""
    real = cl.Buffer
    with KernelCapture():
        assert cl.Buffer is not real  # the stand-in
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
        assert type(buf) is real and isinstance(buf, cl.Buffer)
        assert issubclass(real, cl.Buffer) and not issubclass(int, cl.Buffer)
        assert cl.Buffer.get_sub_region is real.get_sub_region
        assert cl.Buffer.__name__ == "Buffer"

        class Mine(cl.Buffer):  # a subclass made while recording: of the class itself
            __slots__ = ()

        assert Mine.__mro__[1] is real
        assert isinstance(Mine(queue.context, cl.mem_flags.READ_WRITE, 64), cl.Buffer)
    assert cl.Buffer is real  # put back at end()
