"""What an OpenCL driver does with a failed command and with queues freed under a polling thread,
with pyopencl alone (issue #60: the suite crashed on NVIDIA there; is it netcl or the driver?).

``python tests/core/driver_cases.py`` runs every case in a process of its own (a crash ends only
that case) and prints each one's last lines and exit status; ``... driver_cases.py CASE`` runs
one. Not collected by pytest (no ``test_`` prefix): the netcl-level tests are in
test_profiling.py, and the findings are in docs/guides/core.md (Device time on a GPU).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pyopencl as cl

SOURCE = """__kernel void busy(__global float *a, const int n) {
    float x = a[get_global_id(0)];
    for (int i = 0; i < n; i++) x = x * 0.999f + 0.001f;
    a[get_global_id(0)] = x;
}"""
PROFILING = cl.command_queue_properties.PROFILING_ENABLE
KEPT: list[cl.Buffer] = []  # a kernel's argument does not hold its buffer
CASES: dict[str, Callable[[], None]] = {}


def say(*what: object) -> None:
    print(*what, flush=True)


def case(f: Callable[[], None]) -> Callable[[], None]:
    CASES[f.__name__] = f
    return f


def setup() -> tuple[cl.Context, cl.CommandQueue, cl.Kernel]:
    ctx = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(ctx, properties=PROFILING)
    kernel = cl.Kernel(cl.Program(ctx, SOURCE).build(), "busy")
    KEPT.append(cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096))
    kernel.set_args(KEPT[-1], np.int32(100))
    return ctx, queue, kernel


def fail(ctx: cl.Context, queue: cl.CommandQueue, kernel: cl.Kernel) -> tuple[cl.Event, cl.Event]:
    """A kernel, then one that waits for a user event set to an error status (it fails); returns
    both once both have ended."""
    gate = cl.UserEvent(ctx)
    first = cl.enqueue_nd_range_kernel(queue, kernel, (4096,), None)
    failed = cl.enqueue_nd_range_kernel(queue, kernel, (4096,), None, wait_for=[gate])
    gate.set_status(-5)
    say("user event set to -5")
    deadline = time.monotonic() + 10
    while max(first.command_execution_status, failed.command_execution_status) > 0:
        assert time.monotonic() < deadline, "the commands never ended"
        time.sleep(0.005)
    statuses = first.command_execution_status, failed.command_execution_status
    say("statuses: first, failed", statuses)
    return first, failed


@case
def failed_status() -> None:
    fail(*setup())


@case
def failed_then_finish() -> None:
    ctx, queue, kernel = setup()
    fail(ctx, queue, kernel)
    try:
        queue.finish()
        say("finish returned")
    except cl.Error as exc:
        say("finish raised", exc)


@case
def failed_profiling_info() -> None:
    _, failed = fail(*setup())
    say("reading START of the failed command")
    try:
        say("START", failed.get_profiling_info(cl.profiling_info.START))
    except cl.Error as exc:
        say("raised", exc)


@case
def first_profiling_info() -> None:
    first, _ = fail(*setup())
    say("the command before it: END", first.get_profiling_info(cl.profiling_info.END))


@case
def failed_type_and_queue() -> None:
    _, failed = fail(*setup())
    say("type", failed.get_info(cl.event_info.COMMAND_TYPE))
    say("queue", failed.get_info(cl.event_info.COMMAND_QUEUE))


@case
def queue_after_failure() -> None:
    ctx, queue, kernel = setup()
    fail(ctx, queue, kernel)
    later = cl.enqueue_nd_range_kernel(queue, kernel, (4096,), None)
    try:
        later.wait()
        say("a later kernel on that queue:", later.command_execution_status)
    except cl.Error as exc:
        say("a later kernel on that queue raised", exc)
    other = cl.CommandQueue(ctx, properties=PROFILING)
    event = cl.enqueue_nd_range_kernel(other, kernel, (4096,), None)
    event.wait()
    say("another queue's kernel:", event.get_profiling_info(cl.profiling_info.END))


@case
def failed_then_freed() -> None:
    ctx, queue, kernel = setup()
    first, failed = fail(ctx, queue, kernel)
    del first, failed
    gc.collect()
    say("events freed")
    del queue
    gc.collect()
    say("queue freed")


@case
def event_queue_after_free() -> None:
    """The queue of an event whose queue was freed (what profiling._device asked, given no
    queue)."""
    _, queue, kernel = setup()
    event = cl.enqueue_nd_range_kernel(queue, kernel, (4096,), None)
    event.wait()
    del queue
    gc.collect()
    say("queue freed; asking its event for it")
    again = event.get_info(cl.event_info.COMMAND_QUEUE)
    say("its device", again.device.name)


@case
def poll_while_freeing() -> None:
    """A thread reads the status of events whose queues the main thread frees."""
    ctx, _, kernel = setup()
    events: list[cl.Event] = []
    stop = threading.Event()

    def poll() -> None:
        n = 0
        while not stop.is_set():
            for event in list(events):
                event.get_info(cl.event_info.COMMAND_EXECUTION_STATUS)
                n += 1
        say("status reads", n)

    thread = threading.Thread(target=poll)
    thread.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:
        queue = cl.CommandQueue(ctx, properties=PROFILING)
        events.append(cl.enqueue_nd_range_kernel(queue, kernel, (4096,), None))
        del queue
        del events[:-20]
        gc.collect()
    stop.set()
    thread.join()


@case
def calibrate_while_freeing() -> None:
    """A thread makes, uses and frees profiling queues (a clock calibration) while the main
    thread does the same with kernels."""
    ctx, _, kernel = setup()
    stop = threading.Event()

    def calibrate() -> None:
        n = 0
        while not stop.is_set():
            queue = cl.CommandQueue(ctx, ctx.devices[0], properties=PROFILING)
            marker = cl.enqueue_marker(queue)
            marker.wait()
            marker.get_profiling_info(cl.profiling_info.END)
            queue.finish()
            del queue, marker
            n += 1
        say("calibrations", n)

    thread = threading.Thread(target=calibrate)
    thread.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:
        queue = cl.CommandQueue(ctx, properties=PROFILING)
        cl.enqueue_nd_range_kernel(queue, kernel, (4096,), None).wait()
        del queue
        gc.collect()
    stop.set()
    thread.join()


def main() -> None:
    if len(sys.argv) > 1:
        CASES[sys.argv[1]]()
        say("END ok")
        return
    for name in CASES:
        run = subprocess.run(
            [sys.executable, "-X", "faulthandler", __file__, name],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = (run.stdout + run.stderr).strip().splitlines()
        print(f"--- {name}: exit status {run.returncode}", *lines[-14:], sep="\n  ", flush=True)


if __name__ == "__main__":
    main()
