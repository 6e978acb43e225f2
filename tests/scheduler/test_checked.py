"""Checked mode in scheduler runs: an op whose kernel writes past a checked pool block is named
with its plan as soon as it has run, and the plans not run stay scheduled. The overrun runs in a
subprocess: a guard that failed could crash the process or hang the device instead."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
    import numpy as np, pyopencl as cl
    from netcl.core.device import default_queue
    from netcl.core.memory import BufferPool, MemoryCheckError
    from netcl.runtime.scheduler import ExecutionPlan, Scheduler

    queue = default_queue()
    src = "__kernel void fill(__global float *o) { o[get_global_id(0)] = 1; }"
    fill = cl.Kernel(cl.Program(queue.context, src).build(), "fill")
    pool = BufferPool(queue, check_memory=True)
    x, y = pool.allocate((1024,), np.float32), pool.allocate((1024,), np.float32)

    def fill_x(): return fill(queue, (1024,), None, x.buffer)
    def fill_y_twice_over(): fill(queue, (2048,), None, y.buffer)  # twice y's size; no event
    def later(): print("later ran")

    for async_mode in (False, True):
        s = Scheduler(async_mode=async_mode)
        s.submit(ExecutionPlan([fill_x], "clean", queue=queue))
        s.submit(ExecutionPlan([fill_x, fill_y_twice_over, later], "overrun", queue=queue))
        s.submit(ExecutionPlan([later], "after"))
        try:
            s.run()
        except MemoryCheckError as exc:
            print(str(exc).split(" (checked")[0])
        print("still scheduled:", [p.description for p in s.plans])
"""


@pytest.mark.timeout(90)
def test_checked_mode_names_the_op_and_plan_that_overran() -> None:
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert child.returncode == 0, child.stderr
    named = (
        "Scheduler.run: op 1 (fill_y_twice_over (<string>:14)) of plan 1 'overrun' wrote 4096 "
        "bytes past the end of Tensor(shape=(1024,), dtype=float32, nbytes=4096)"
    )
    # the plans not completed, resumed by the next run() where they stopped (async mode: 'clean'
    # too, whose events nobody waited for; its op does not run again)
    assert child.stdout.splitlines() == [
        named,
        "still scheduled: ['overrun', 'after']",
        named,
        "still scheduled: ['clean', 'overrun', 'after']",
    ], child.stdout
