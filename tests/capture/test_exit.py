"""A process that ends right after replays: their queues are finished before the interpreter
frees what the commands use (PoCL crashed at exit in about 1 run of a capture_step loop in 10)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from netcl.core import device
from netcl.runtime.capture import KernelCapture

SLOW = """__kernel void slow(__global float *a, int n) {
    float x = a[get_global_id(0)];
    for (int k = 0; k < n; ++k) x = x * 0.999f + 0.5f;
    a[get_global_id(0)] = x;
}"""


def test_the_exit_hook_finishes_the_queues_replays_left_running(ctx: cl.Context) -> None:
    queue = cl.CommandQueue(ctx)
    slow = cl.Kernel(cl.Program(ctx, SLOW).build(), "slow")
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)
    cl.enqueue_fill_buffer(queue, buf, np.float32(1.0), 0, 4 * 4096)
    slow.set_args(buf, np.int32(20000))
    cap = KernelCapture()
    with cap:
        cl.enqueue_nd_range_kernel(queue, slow, (4096,), None)
    queue.finish()
    last = [cap.replay() for _ in range(5)][-1]
    assert last is not None
    device._finish_all()  # what atexit runs
    assert last.command_execution_status == cl.command_execution_status.COMPLETE
