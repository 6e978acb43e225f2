"""Checked mode in a scheduler run in this process (the overrun itself runs in a subprocess in
test_checked.py): ops that stay inside their blocks run to the end, each checked as it ends."""

from __future__ import annotations

import functools

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool, MemoryCheckError
from netcl.runtime.scheduler import ExecutionPlan, Scheduler

FILL = "__kernel void fill(__global float *o) { o[get_global_id(0)] = 1; }"


def test_a_checked_run_within_bounds_runs_every_op(queue: cl.CommandQueue) -> None:
    fill = cl.Kernel(cl.Program(queue.context, FILL).build(), "fill")
    pool = BufferPool(queue, check_memory=True)
    x = pool.allocate((1024,), np.float32)
    ran: list[str] = []

    def fill_x() -> cl.Event:
        return fill(queue, (1024,), None, x.buffer)

    for async_mode in (False, True):
        s = Scheduler(async_mode=async_mode)
        s.submit(ExecutionPlan([fill_x, lambda: ran.append("after")], "clean", queue=queue))
        s.run(wait=True)
    assert ran == ["after", "after"]
    np.testing.assert_array_equal(x.to_numpy(), np.ones(1024, np.float32))
    pool.release(x)


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_checked_run_stops_at_the_op_whose_event_failed(
    async_mode: bool, ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    """In checked mode the host waits for each op's events as the op ends: an op whose kernel
    failed stops the run right there, before the next op of its plan, which stays unrun."""
    fill = cl.Kernel(cl.Program(ctx, FILL).build(), "fill")
    pool = BufferPool(queue, check_memory=True)
    x = pool.allocate((1024,), np.float32)
    upstream = cl.UserEvent(ctx)
    launched: list[cl.Event] = []
    ran: list[str] = []

    def failing() -> cl.Event:
        launched.append(fill(queue, (1024,), None, x.buffer, wait_for=[upstream]))
        upstream.set_status(-5)  # what the kernel waits for failed: so does the kernel
        return launched[-1]

    s = Scheduler(async_mode=async_mode)
    plan = s.submit(ExecutionPlan([failing, lambda: ran.append("next op")], "fails", queue=queue))
    later = s.submit(lambda: ran.append("later plan"))
    with pytest.raises(Scheduler.Error) as info:
        s.run(wait=True)
    err = info.value
    assert ran == []
    assert (err.plan, err.op_index, err.op, err.event) == (plan, 0, failing, launched[0])
    assert err.unrun_plans == [later]
    assert str(err).startswith(
        "Scheduler.run: op 0 (test_a_checked_run_stops_at_the_op_whose_event_failed.<locals>."
        "failing (test_checked_in_process.py:"
    )
    assert ") of plan 0 'fails' returned an event (pyopencl.Event(NDRANGE_KERNEL)) that failed" in (
        str(err)
    )
    pool.release(x)
    del info, err  # the error's traceback holds this frame: checked mode would outlive the test


def fill_y_twice_over(fill: cl.Kernel, queue: cl.CommandQueue, y: cl.Buffer) -> None:
    """An op's body whose kernel runs twice y's size: it writes into y's guard (no event)."""
    fill(queue, (2048,), None, y)


LINE = fill_y_twice_over.__code__.co_firstlineno


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_checked_run_names_the_op_and_the_plan_that_wrote_out_of_bounds(
    async_mode: bool, queue: cl.CommandQueue
) -> None:
    """The MemoryCheckError of an op that overran a checked block names the op (its index, its
    function) and its plan (its run index and description), in full; the plans not completed
    stay scheduled, and nothing after the op ran."""
    fill = cl.Kernel(cl.Program(queue.context, FILL).build(), "fill")
    pool = BufferPool(queue, check_memory=True)
    x, y = pool.allocate((1024,), np.float32), pool.allocate((1024,), np.float32)
    ran: list[str] = []
    overrun = functools.partial(fill_y_twice_over, fill, queue, y.buffer)
    s = Scheduler(async_mode=async_mode)
    clean = s.submit(
        ExecutionPlan([lambda: fill(queue, (1024,), None, x.buffer)], "clean", queue=queue)
    )
    bad = s.submit(
        ExecutionPlan(
            [lambda: ran.append("op 0"), overrun, lambda: ran.append("op 2")],
            "overrun",
            queue=queue,
        )
    )
    after = s.submit(lambda: ran.append("after"))
    with pytest.raises(MemoryCheckError) as info:
        s.run()
    assert str(info.value) == (
        "Scheduler.run: op 1 (functools.partial(fill_y_twice_over (test_checked_in_process.py:"
        f"{LINE}))) of plan 1 'overrun' wrote 4096 bytes past the end of Tensor(shape=(1024,), "
        "dtype=float32, nbytes=4096) (checked mode's guards: 8192 bytes after it, 0 before it): "
        "a kernel's global size or indexing is wrong; fix it, or give the tensor the size the "
        "kernel writes"
    )
    assert ran == ["op 0"]
    # sync mode completed 'clean'; async mode waited for none of its events, so it stays
    assert s.plans == ((bad, after) if not async_mode else (clean, bad, after))
    pool.release(x)
    pool.release(y)  # its guard was filled again when the check named it
    del info  # the error's traceback holds this frame: checked mode would outlive the test
