"""Checked mode in captured replays: a kernel that writes past a checked pool block is named by
its recorded command. The overrun runs in a subprocess (a guard that failed could crash the
process or hang the device instead of failing the test), and in this process too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool, MemoryCheckError
from netcl.runtime.capture import KernelCapture

SCRIPT = """
    import numpy as np, pyopencl as cl
    from netcl.core.device import default_queue
    from netcl.core.memory import BufferPool, MemoryCheckError
    from netcl.runtime.capture import KernelCapture

    queue = default_queue()
    src = "__kernel void inc(__global const float *a, __global float *o) "
    src += "{ int i = get_global_id(0); o[i] = a[i] + 1; }"
    inc = cl.Kernel(cl.Program(queue.context, src).build(), "inc")
    pool = BufferPool(queue, check_memory=True)
    x, y, z = (pool.allocate((1024,), np.float32) for _ in range(3))
    x.write(np.zeros(1024, np.float32))

    clean = KernelCapture()
    with clean:
        inc(queue, (1024,), None, x.buffer, y.buffer)
        inc(queue, (1024,), None, y.buffer, x.buffer)
    clean.replay()
    clean.replay_with_new_buffers({y.buffer.int_ptr: z})  # a checked block put in: clean too
    print("clean replays:", x.to_numpy()[0])

    cap = KernelCapture()
    with cap:  # the recording runs the overrun too: the guard takes it
        inc(queue, (1024,), None, x.buffer, y.buffer)
        inc(queue, (1024,), None, y.buffer, z.buffer)
        inc(queue, (2048,), None, z.buffer, x.buffer)  # twice x's size
        inc(queue, (1024,), None, x.buffer, y.buffer)
    for replay in (cap.replay, lambda: cap.replay_with_new_buffers({y.buffer.int_ptr: z})):
        try:
            replay()
        except MemoryCheckError as exc:
            print(exc)
"""


@pytest.mark.timeout(90)
def test_replay_names_the_recorded_command_that_overran() -> None:
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert lines[0] == "clean replays: 6.0", child.stdout
    expected = (
        "KernelCapture.replay: recorded command 2 (kernel 'inc') wrote 4096 bytes past the end "
        "of Tensor(shape=(1024,), dtype=float32, nbytes=4096) (checked mode's guards: 8192 "
        "bytes after it, 0 before it)"
    )
    assert len(lines) == 3 and all(line.startswith(expected) for line in lines[1:]), lines


def test_the_same_in_this_process(queue: cl.CommandQueue, spans: Any) -> None:
    # The overrun stays inside the guard bytes (4096 of 8192), which the pool allocated with
    # the block: safe here, and the mutation run sees only tests in its own process.
    src = (
        "__kernel void inc(__global const float *a, __global float *o) "
        "{ int i = get_global_id(0); o[i] = a[i] + 1; }"
    )
    inc = cl.Kernel(cl.Program(queue.context, src).build(), "inc")
    pool = BufferPool(queue, check_memory=True)
    x, y, z = (pool.allocate((1024,), np.float32) for _ in range(3))
    x.write(np.zeros(1024, np.float32))
    clean = KernelCapture()
    with clean:
        inc(queue, (1024,), None, x.buffer, y.buffer)
        inc(queue, (1024,), None, y.buffer, x.buffer)
    clean.replay()
    clean.replay_with_new_buffers({y.buffer.int_ptr: z})
    assert x.to_numpy()[0] == 6.0
    cap = KernelCapture()
    with cap:
        inc(queue, (1024,), None, x.buffer, y.buffer)
        inc(queue, (1024,), None, y.buffer, z.buffer)
        inc(queue, (2048,), None, z.buffer, x.buffer)
        inc(queue, (1024,), None, x.buffer, y.buffer)
    expected = (
        "KernelCapture.replay: recorded command 2 (kernel 'inc') wrote 4096 bytes past "
        "the end of Tensor(shape=(1024,), dtype=float32, nbytes=4096)"
    )
    for replay in (cap.replay, lambda: cap.replay_with_new_buffers({y.buffer.int_ptr: z})):
        with pytest.raises(MemoryCheckError) as info:
            replay()
        assert str(info.value).startswith(expected)
    replays = [x for x in spans.get_finished_spans() if x.name == "netcl.capture.replay"]
    assert [x.status.status_code.name for x in replays] == ["UNSET", "UNSET", "ERROR", "ERROR"]
    with pytest.raises(MemoryCheckError, match="found as it went back to BufferPool"):
        pool.release(x)  # its guard is still damaged
    pool.release_all([y, z])


def test_an_overrun_on_an_out_of_order_queue_names_its_command(
    ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    """On an out-of-order queue (a scheduled replay) the command checked after each one is that
    one: an overrun by the last command is named as the last."""
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    try:
        ooo = cl.CommandQueue(ctx, properties=props)
    except cl.Error as exc:  # pragma: no cover - device without out-of-order queues
        pytest.skip(f"the device has no out-of-order queues: {exc}")
    src = (
        "__kernel void inc(__global const float *a, __global float *o) "
        "{ int i = get_global_id(0); o[i] = a[i] + 1; }"
    )
    inc = cl.Kernel(cl.Program(ctx, src).build(), "inc")
    pool = BufferPool(queue, check_memory=True)
    x, y = (pool.allocate((1024,), np.float32) for _ in range(2))
    x.write(np.zeros(1024, np.float32))
    cap = KernelCapture()
    with cap:
        first = inc(ooo, (1024,), None, x.buffer, y.buffer)
        inc(ooo, (2048,), None, y.buffer, x.buffer, wait_for=[first])  # twice x's size
    ooo.finish()
    with pytest.raises(MemoryCheckError) as info:
        cap.replay()
    assert str(info.value).startswith(
        "KernelCapture.replay: recorded command 1 (kernel 'inc') wrote 4096 bytes past the end "
        "of Tensor(shape=(1024,), dtype=float32, nbytes=4096)"
    )
    with pytest.raises(MemoryCheckError, match="found as it went back to BufferPool"):
        pool.release(x)  # its guard is still damaged
    pool.release(y)
