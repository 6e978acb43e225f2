"""A capture owns its memory: the buffers nothing outside it can reach at end() (temporaries the
code dropped, blocks released to a pool) live in an arena planned by their lifetimes, so the
capture holds about the peak memory of the code it replays, and no pool hands out memory a replay
still writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.clmath as clmath
import pyopencl.tools as cltools
import pytest

from netcl.core import contract
from netcl.core.memory import BufferPool
from netcl.runtime.capture import KernelCapture, _memory, _saved, capture_step, load_capture

N = 1 << 16
NBYTES = 4 * N


def chain(h: cla.Array, ops: int = 20) -> cla.Array:
    """pyopencl.array code as users write it: every operation allocates its result."""
    for _ in range(ops):
        h = clmath.tanh(h * 1.01 + 0.1)
    return h


def _host(seed: float) -> np.ndarray[Any, Any]:
    return np.linspace(-seed, seed, N, dtype=np.float32)


def test_dropped_temporaries_share_an_arena_and_replays_stay_exact(queue: cl.CommandQueue) -> None:
    x = cla.to_device(queue, _host(1.0))
    cap = KernelCapture()
    assert cap.memory is None
    cap.begin()
    out = chain(x)
    assert cap.end() == 60
    mem = cap.memory
    assert mem is not None
    # 59 temporaries of 256 KiB as recorded; at most two are ever alive on one in-order queue
    assert mem.internal == 59 and mem.internal_bytes == 59 * NBYTES
    assert mem.arena_bytes <= 2 * NBYTES
    assert mem.external == 2 and mem.external_bytes == 2 * NBYTES  # x and out: the caller's
    # buffers placed alike share one region: x, out and two regions (one replay kernel each)
    assert len(cap.buffers) <= 4
    for seed in (1.0, 2.5):
        x.set(_host(seed))
        want = chain(x).get()
        cap.replay()
        assert np.array_equal(out.get(), want)


def _twice_inc(queue: cl.CommandQueue) -> tuple[cl.Kernel, cl.Kernel]:
    """Kernels ``twice`` (o = 2a) and ``inc`` (o = a + 1)."""
    prg = cl.Program(
        queue.context,
        """
        __kernel void twice(__global float *o, __global const float *a) {
            int i = get_global_id(0); o[i] = 2.0f * a[i]; }
        __kernel void inc(__global float *o, __global const float *a) {
            int i = get_global_id(0); o[i] = a[i] + 1.0f; }""",
    ).build()
    return cl.Kernel(prg, "twice"), cl.Kernel(prg, "inc")


@pytest.mark.parametrize("kind", ["BufferPool", "pyopencl MemoryPool"])
def test_a_pool_never_hands_out_memory_a_replay_writes(queue: cl.CommandQueue, kind: str) -> None:
    """Blocks released to a pool during the capture: the pool hands them out again between
    replays (here: filled with garbage), and the replays must not care."""
    twice, inc = _twice_inc(queue)
    x = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    out = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    alloc, free = _pool(queue, kind)

    def step() -> None:
        for _ in range(3):
            t = alloc()
            twice(queue, (N,), None, t, x)
            inc(queue, (N,), None, out, t)  # out = 2x + 1, through a temporary
            free(t)

    cl.enqueue_copy(queue, x, _host(1.0))
    cap = KernelCapture()
    with cap:
        step()
    mem = cap.memory
    # one pool block reused thrice (BufferPool), or blocks held until end() (pyopencl's; the
    # last one the kernel objects still refer to stays the application's): one region
    assert mem is not None and mem.internal >= 1 and mem.arena_bytes < 2 * NBYTES
    host = np.empty(N, np.float32)
    for seed in (1.0, 3.0):
        cl.enqueue_copy(queue, x, _host(seed))
        taken = [alloc() for _ in range(4)]  # the pool's blocks, the released one among them
        for t in taken:
            cl.enqueue_fill_buffer(queue, t, np.float32(-7.0), 0, NBYTES)
        cap.replay()
        for t in taken:  # and written again while the replay may still run
            cl.enqueue_fill_buffer(queue, t, np.float32(-9.0), 0, NBYTES)
        cl.enqueue_copy(queue, host, out)
        assert np.array_equal(host, 2 * _host(seed) + 1)
        for t in taken:
            free(t)


def _pool(queue: cl.CommandQueue, kind: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """(allocate a block, give it back) through a netcl BufferPool or a pyopencl MemoryPool."""
    live: dict[int, Any] = {}
    if kind == "BufferPool":
        pool = BufferPool(queue)

        def alloc() -> Any:
            t = pool.allocate(N, np.float32)
            live[id(t.buffer)] = t
            return t.buffer

        return alloc, lambda buf: pool.release(live.pop(id(buf)))
    mem = cltools.MemoryPool(cltools.ImmediateAllocator(queue))

    def alloc_pooled() -> Any:
        block = mem.allocate(NBYTES)
        live[id(block)] = block
        return block

    return alloc_pooled, lambda block: live.pop(id(block)) and None  # back as it is dropped


def test_temporaries_of_one_launch_on_an_out_of_order_queue_get_regions_of_their_own(
    ctx: cl.Context,
) -> None:
    """Two temporaries one launch both uses (the only command of a capture on an out-of-order
    queue) are alive together: the arena gives each its own bytes, and the replay adds them."""
    try:
        ooo = cl.CommandQueue(
            ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
        )
    except cl.Error as exc:  # pragma: no cover - device without out-of-order queues
        pytest.skip(f"the device has no out-of-order queues: {exc}")
    prg = cl.Program(
        ctx,
        """__kernel void two(__global float *out, __global float *a,
                                               __global float *b) {
        int i = get_global_id(0);
        a[i] = 1.0f; b[i] = 2.0f;
        barrier(CLK_GLOBAL_MEM_FENCE);
        out[i] = a[i] + b[i];
    }""",
    ).build()
    n = 64
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * n)
    cap = KernelCapture()
    with cap:
        a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * n)
        b = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * n)
        prg.two(ooo, (n,), (n,), out, a, b).wait()  # a host wait: no command
        del a, b
    assert cap.memory is not None
    assert (cap.memory.internal, cap.memory.internal_bytes) == (2, 8 * n)
    assert cap.memory.arena_bytes >= 8 * n
    cl.enqueue_fill_buffer(ooo, out, np.float32(0), 0, 4 * n)
    ooo.finish()
    cap.replay()
    ooo.finish()
    host = np.empty(n, np.float32)
    cl.enqueue_copy(ooo, host, out)
    ooo.finish()
    np.testing.assert_allclose(host, 3.0)


def test_what_the_caller_still_holds_stays_where_it_is(queue: cl.CommandQueue) -> None:
    x = cla.to_device(queue, _host(1.0))
    kept: list[cla.Array] = []
    cap = KernelCapture()
    with cap:
        t = x * 3.0
        kept.append(t)  # a temporary the caller keeps: the replay must update it in place
        out = t + 1.0
    assert cap.memory is not None and cap.memory.internal == 0
    x.set(_host(2.0))
    cap.replay()
    assert np.array_equal(kept[0].get(), (x * 3.0).get())
    assert np.array_equal(out.get(), (x * 3.0 + 1.0).get())


def test_a_temporary_set_with_set_arg_moves_into_the_arena(queue: cl.CommandQueue) -> None:
    """Arguments set one by one (``Kernel.set_arg``, not a call's packed arguments) and a
    direct ``enqueue_nd_range_kernel``: the dropped temporary moves into the arena and the
    replays read and write it there."""
    twice, inc = _twice_inc(queue)
    x = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    out = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
    cl.enqueue_copy(queue, x, _host(1.0))
    cap = KernelCapture()
    with cap:
        t = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, NBYTES)
        moved = contract.mem_ptr(t)  # (not t.int_ptr: a raw handle read here is refused)
        twice.set_arg(0, t)
        twice.set_arg(1, x)
        cl.enqueue_nd_range_kernel(queue, twice, (N,), None)
        inc.set_arg(0, out)
        inc.set_arg(1, t)
        cl.enqueue_nd_range_kernel(queue, inc, (N,), None)
        del t
    assert cap.memory is not None and cap.memory.internal == 1
    assert cap.memory.internal_bytes == NBYTES
    used = {b.int_ptr for b in cap.buffers}
    assert moved not in used and {x.int_ptr, out.int_ptr} < used  # t's memory: the arena's
    got = np.empty(N, np.float32)
    for seed in (2.0, 3.5):
        cl.enqueue_copy(queue, x, _host(seed))
        cap.replay()
        cl.enqueue_copy(queue, got, out)
        np.testing.assert_array_equal(got, 2 * _host(seed) + 1)


def test_a_temporary_passed_to_transfers_by_keyword_moves_with_them(
    queue: cl.CommandQueue, kernels: Any
) -> None:
    """A dropped temporary that code passes to pyopencl's transfer primitives by keyword (as
    pyopencl names their parameters: ``_enqueue_copy_buffer(queue, src=x, dst=t, ...)``, then
    ``_enqueue_fill_buffer(queue, mem=t, ...)``) moves into the arena with the kernel that
    reads it: the replays copy, fill and read the same memory (which an earlier temporary of
    the same size used before), and the capture's buffers are x, out and the arena's."""
    ctx, rw = queue.context, cl.mem_flags.READ_WRITE
    x, out = cl.Buffer(ctx, rw, NBYTES), cl.Buffer(ctx, rw, NBYTES)
    cl.enqueue_copy(queue, x, _host(1.0))
    cap = KernelCapture()
    with cap:
        t2 = cl.Buffer(ctx, rw, NBYTES)
        moved = contract.mem_ptr(t2)  # (not t2.int_ptr: a raw handle read here is refused)
        t1 = cl.Buffer(ctx, rw, NBYTES)
        kernels.scale_shift(queue, (N,), None, t1, x, 3.0, 0)  # t1 = 3x, its region's first use
        kernels.add(queue, (N,), None, out, t1, x)
        del t1
        cl._cl._enqueue_copy_buffer(
            queue, src=x, dst=t2, byte_count=NBYTES, src_offset=0, dst_offset=0
        )
        cl._cl._enqueue_fill_buffer(
            queue, mem=t2, pattern=np.float32(7), offset=0, size=NBYTES // 2
        )
        kernels.add(queue, (N,), None, out, t2, x)  # out = x + 7, then 2x
        del t2
    assert cap.memory is not None and cap.memory.internal == 2
    used = {b.int_ptr for b in cap.buffers}
    assert moved not in used and {x.int_ptr, out.int_ptr} < used  # t2's memory: the arena's
    got = np.empty(N, np.float32)
    for seed in (2.0, 3.5):
        host = _host(seed)
        cl.enqueue_copy(queue, x, host)
        cap.replay()
        cl.enqueue_copy(queue, got, out)
        np.testing.assert_array_equal(got, np.where(np.arange(N) < N // 2, host + 7, 2 * host))


@pytest.mark.parametrize("between", ["copies", "finishes"])
def test_a_temporary_read_after_other_commands_keeps_its_region_until_then(
    queue: cl.CommandQueue, kernels: Any, between: str
) -> None:
    """t1 is written first (by a copy) and read last, after three copies or finishes; t2
    lives between: their lifetimes, counted in commands (copies and finishes count too),
    overlap, so t2 never takes t1's memory."""
    ctx = queue.context
    rw = cl.mem_flags.READ_WRITE
    x, e1, e2, e3, out = (cl.Buffer(ctx, rw, NBYTES) for _ in range(5))
    n = (N,)
    cap = KernelCapture()
    with cap:
        t1, t2 = cl.Buffer(ctx, rw, NBYTES), cl.Buffer(ctx, rw, NBYTES)
        cl.enqueue_copy(queue, t1, x)  # 0: t1 = x
        kernels.scale_shift(queue, n, None, e1, x, 1.0, 1)  # 1
        kernels.scale_shift(queue, n, None, e1, x, 1.0, 2)  # 2
        kernels.scale_shift(queue, n, None, t2, x, 3.0, 0)  # 3: t2 = 3x
        kernels.add(queue, n, None, e2, t2, x)  # 4: e2 = 4x, the last use of t2
        for _ in range(3):  # 5, 6, 7
            if between == "copies":
                cl.enqueue_copy(queue, e3, x)
            else:
                queue.finish()
        kernels.add(queue, n, None, out, t1, x)  # 8: out = 2x, the last use of t1
        del t1, t2
    assert cap.memory is not None and cap.memory.internal == 2
    assert cap.memory.arena_bytes == 2 * NBYTES
    got = np.empty(N, np.float32)
    for seed in (2.0, 3.5):
        cl.enqueue_copy(queue, x, _host(seed))
        cap.replay()
        cl.enqueue_copy(queue, got, out)
        np.testing.assert_array_equal(got, 2 * _host(seed))


def test_a_sub_buffer_and_its_parent_stay_where_they_are(queue: cl.CommandQueue) -> None:
    x = cla.to_device(queue, _host(1.0))
    cap = KernelCapture()
    with cap:
        parent = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 2 * NBYTES)
        view = cla.Array(queue, N, np.float32, data=parent.get_sub_region(0, NBYTES))
        view[:] = x * 2.0  # a copy into the sub-buffer
        out = view + 1.0
        del parent, view
    assert cap.memory is not None
    x.set(_host(3.0))
    cap.replay()
    assert np.array_equal(out.get(), (x * 2.0 + 1.0).get())


def test_a_steps_keys_share_one_arena_as_large_as_the_largest(
    queue: cl.CommandQueue, metric_points: Callable[[str], list[Any]]
) -> None:
    if not all(d.type & cl.device_type.CPU for d in queue.context.devices):
        pytest.skip("on a GPU keys of different sizes hold slots each (the guide says why)")

    def arena_gauge() -> float:
        return sum(p.value for p in metric_points("netcl.capture.arena_bytes"))

    before = arena_gauge()
    step = capture_step(chain)
    sizes = (N // 8, N // 4, N // 2, N)  # four guard keys, the largest last: the arena grows
    xs = [cla.to_device(queue, np.linspace(-1, 1, n, dtype=np.float32)) for n in sizes]
    for _ in range(3):  # normal run, capture, replays
        outs = [step(x) for x in xs]
    for x, out in zip(xs, outs, strict=True):
        assert np.array_equal(out.get(), chain(x).get())
    assert arena_gauge() - before <= 2 * NBYTES  # the largest key's plan, not four
    del step, outs


@pytest.mark.parametrize("slots", [False, True])
def test_a_steps_captures_on_two_queues_keep_an_arena_each(
    queue: cl.CommandQueue,
    metric_points: Callable[[str], list[Any]],
    monkeypatch: pytest.MonkeyPatch,
    slots: bool,
) -> None:
    """Captures on two queues may run at the same time: they never share one arena (or, where
    regions may not partly overlap, as on a GPU, forced here with ``slots``, one slot)."""
    if slots:
        monkeypatch.setattr(_memory, "_may_overlap", lambda ctx: False)
    elif not all(d.type & cl.device_type.CPU for d in queue.context.devices):
        pytest.skip("on a GPU captures hold slots, not an arena (the guide says why)")

    def arena_gauge() -> float:
        return sum(p.value for p in metric_points("netcl.capture.arena_bytes"))

    other = cl.CommandQueue(queue.context)
    xs = [cla.to_device(queue, _host(1.0)), cla.to_device(other, _host(2.0))]
    step = capture_step(chain)
    grown = []
    for x in xs:
        before = arena_gauge()
        for _ in range(3):  # normal run, capture, replay
            out = step(x)
        grown.append(arena_gauge() - before)
        assert np.array_equal(out.get(), chain(x).get())
    assert grown[0] > 0 and grown[1] == grown[0], grown  # the second queue's arena: its own
    del step, out


def test_a_saved_capture_keeps_no_arena_contents(queue: cl.CommandQueue, tmp_path: Any) -> None:
    x = cla.to_device(queue, _host(1.0))
    cap = KernelCapture()
    with cap:
        out = chain(x)
    assert cap.memory is not None and cap.memory.arena_bytes >= NBYTES
    size = cap.save(tmp_path / "chain.ncap")
    # x and out (their contents kept), two program binaries (~150 KiB on PoCL) and commands; the
    # arena's contents would add 2 x 256 KiB more
    assert size < 3 * NBYTES, size
    # inspect counts device memory once: the arena's bytes, not again for each of its regions
    scratch = _saved.inspect(tmp_path / "chain.ncap")["buffers"]["scratch"]
    assert scratch["count"] > 1 and scratch["bytes"] == cap.memory.arena_bytes, scratch
    loaded = load_capture(tmp_path / "chain.ncap", queue)
    loaded.replay()
    cap.replay()
    queue.finish()
    assert np.array_equal(out.get(), chain(x).get())


def test_where_regions_may_not_partly_overlap_buffers_of_one_size_share_slots(
    queue: cl.CommandQueue,
    monkeypatch: pytest.MonkeyPatch,
    metric_points: Callable[[str], list[Any]],
) -> None:
    """NVIDIA's driver crashes releasing partly overlapping sub-buffers that kernels used: there
    the buffers of one size whose lifetimes follow each other share one buffer (a slot), and a
    step's keys share slots by size (forced here on PoCL)."""
    from netcl.runtime.capture import _memory

    monkeypatch.setattr(_memory, "_may_overlap", lambda ctx: False)
    x = cla.to_device(queue, _host(1.0))
    y = cla.to_device(queue, _host(3.0)[: N // 4])
    cap = KernelCapture()
    with cap:
        out_x, out_y = chain(x), chain(y, 10)
    mem = cap.memory
    assert mem is not None and mem.internal == 59 + 29
    assert mem.arena_bytes == 2 * NBYTES + 2 * NBYTES // 4  # two slots of each size
    theirs = {a.data.int_ptr for a in (x, y, out_x, out_y)}
    slots = [b for b in cap.buffers if b.int_ptr not in theirs]
    assert sorted(int(b.size) for b in slots) == [NBYTES // 4] * 2 + [NBYTES] * 2
    assert all(b.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) is None for b in slots)
    for seed in (1.0, 2.5):
        x.set(_host(seed))
        y.set(_host(seed + 1)[: N // 4])
        want = chain(x).get(), chain(y, 10).get()
        cap.replay()
        assert np.array_equal(out_x.get(), want[0]) and np.array_equal(out_y.get(), want[1])

    before = sum(p.value for p in metric_points("netcl.capture.arena_bytes"))
    step = capture_step(chain)
    for _ in range(3):  # four keys (the number of operations), one size
        outs = [step(x, ops) for ops in (20, 5, 10, 15)]
    for ops, out in zip((20, 5, 10, 15), outs, strict=True):
        assert np.array_equal(out.get(), chain(x, ops).get())
    assert sum(p.value for p in metric_points("netcl.capture.arena_bytes")) - before == (
        2 * NBYTES
    )  # two slots for all four keys
    del step, outs


def test_buffers_a_rectangle_or_image_copy_uses_stay_where_they_are(
    queue: cl.CommandQueue,
) -> None:
    """PoCL crashes copying a rectangle out of a sub-buffer, or an image into one (pyopencl's
    own test_enqueue_copy_rect_2d and test_enqueue_copy_array_2 under capture): what such a
    copy uses is not moved."""
    ctx = queue.context
    host = np.random.default_rng(42).integers(0, 256, (256, 128), dtype=np.uint8)
    out = np.zeros((512, 256), np.uint8)
    cap = KernelCapture()
    with cap:
        src = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 300 * 200)
        dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 300 * 400)
        plain = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 300 * 200)
        cl.enqueue_copy(
            queue,
            src,
            host,
            buffer_origin=(3, 7),
            host_origin=(13, 20),
            region=(96, 128),
            buffer_pitches=(200,),
            host_pitches=(128,),
        )
        cl.enqueue_copy(queue, plain, src)
        cl.enqueue_copy(
            queue,
            dst,
            plain,
            src_origin=(3, 7),
            dst_origin=(17, 31),
            region=(96, 128),
            src_pitches=(200,),
            dst_pitches=(400,),
        )
        cl.enqueue_copy(
            queue,
            out,
            dst,
            buffer_origin=(17, 31),
            host_origin=(19, 11),
            region=(96, 128),
            buffer_pitches=(400,),
            host_pitches=(256,),
        )
        image = cl.create_image(
            ctx,
            cl.mem_flags.READ_ONLY,
            cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT),
            shape=(16, 16),
        )
        from_image = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 16 * 16 * 16)
        cl.enqueue_copy(queue, from_image, image, offset=0, origin=(0, 0), region=(16, 16))
        del src, dst, plain, from_image
    assert cap.memory is not None
    assert (cap.memory.internal, cap.memory.external) == (0, 5)  # each read or written by one
    want = out.copy()
    out[:] = 0
    cap.replay()
    queue.finish()
    assert np.array_equal(out, want) and want.any()


def test_a_buffer_made_from_host_data_keeps_its_contents(queue: cl.CommandQueue) -> None:
    """A temporary created with COPY_HOST_PTR inside the capture holds data no recorded command
    wrote: moved, a replay would read whatever its region held."""
    prg = cl.Program(
        queue.context,
        """
        __kernel void inc(__global float *o, __global const float *a) {
            int i = get_global_id(0); o[i] = a[i] + 1.0f; }""",
    ).build()
    out = cla.empty(queue, N, np.float32)
    cap = KernelCapture()
    with cap:
        table = cl.Buffer(
            queue.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=_host(1.0)
        )
        prg.inc(queue, (N,), None, out.data, table)
        del table
        scratch = cla.empty(queue, N, np.float32)  # a temporary that does move, over the table
        scratch.fill(7.0)
        out += scratch
        del scratch
    assert cap.memory is not None and cap.memory.internal == 1
    cap.replay()
    assert np.array_equal(out.get(), _host(1.0) + 1.0 + 7.0)


def test_a_saved_arena_loads_as_buffers_of_their_own_on_a_gpu(
    queue: cl.CommandQueue, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file saved on a CPU device holds an arena whose regions partly overlap: loaded where
    that crashes the driver (NVIDIA's), each region is a buffer of its own. The file is made
    with the CPU's rule on any device (its regions are never used by a kernel here, which is
    what NVIDIA's driver cannot release), loaded with the GPU's rule."""
    cpu = all(d.type & cl.device_type.CPU for d in queue.context.devices)
    x = cla.to_device(queue, _host(1.0))
    monkeypatch.setattr(_memory, "_may_overlap", lambda ctx: True)
    cap = KernelCapture()
    with cap:
        out = chain(x)
    cap.save(tmp_path / "chain.ncap")
    del cap  # its regions go unused

    def subs(c: KernelCapture) -> int:
        return sum(b.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) is not None for b in c.buffers)

    if cpu:  # loaded with the CPU's rule, the regions are sub-buffers of one arena again
        assert subs(load_capture(tmp_path / "chain.ncap", queue)) == 2
    monkeypatch.setattr(_memory, "_may_overlap", lambda ctx: False)
    loaded = load_capture(tmp_path / "chain.ncap", queue)
    assert subs(loaded) == 0
    loaded.replay()
    queue.finish()
    host = np.empty(N, np.float32)
    found = []
    for b in loaded.buffers:  # the loaded capture's output is one of its own
        if int(b.size) == NBYTES:
            cl.enqueue_copy(queue, host, b)
            found.append(np.array_equal(host, out.get()))
    assert any(found)
