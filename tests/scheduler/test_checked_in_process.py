"""Checked mode in a scheduler run in this process (the overrun itself runs in a subprocess in
test_checked.py): ops that stay inside their blocks run to the end, each checked as it ends."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from netcl.core.memory import BufferPool
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
