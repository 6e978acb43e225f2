"""A capture spanning two OpenCL contexts (two real contexts on the one device): commands of
one context keep device-side ordering, ordering the recording had across contexts is kept on the
host, and the replay runs as a whole (it used to raise ``INVALID_CONTEXT`` after the first
context's work had run)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

from netcl.runtime.capture import KernelCapture

N = 4096
COMPLETE = cl.command_execution_status.COMPLETE


@pytest.fixture
def ctx2(ctx: cl.Context) -> cl.Context:
    return cl.Context(ctx.devices)


def _replay_in_thread(cap: KernelCapture) -> tuple[threading.Thread, list[Any]]:
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(cap.replay()), daemon=True)
    thread.start()
    return thread, done


def _gate(queue: cl.CommandQueue) -> cl.UserEvent:
    """Hold ``queue`` behind a user event until it is set complete."""
    gate = cl.UserEvent(queue.context)
    cl.enqueue_marker(queue, wait_for=[gate])
    return gate


def test_data_passed_across_contexts_through_the_host_replays_in_order(
    queue: cl.CommandQueue, ctx2: cl.Context
) -> None:
    q2 = cl.CommandQueue(ctx2)
    a = cla.to_device(queue, np.arange(N, dtype=np.float32))
    b2 = cla.zeros(q2, N, np.float32)
    host = np.empty(N, np.float32)
    with KernelCapture() as cap:
        y = a * 2  # context 1
        read = cl.enqueue_copy(queue, host, y.data, wait_for=y.events, is_blocking=False)
        read.wait()  # the host orders what follows after the read
        cl.enqueue_copy(q2, b2.data, host, is_blocking=False)  # context 2 reads `host`
        z2 = b2 + 1  # context 2
        w = y * 10  # context 1 again
    plan = cap._program.plan  # type: ignore[union-attr]
    assert plan is not None
    write = next(
        i
        for i, op in enumerate(cap._program.ops)  # type: ignore[union-attr]
        if getattr(op, "entry", None) and op.entry.operation == "write_buffer"
    )
    assert plan.issues[write].host == ((write - 1,),)  # after the read, waited on the host
    for scale in (3.0, -5.0, 7.5):
        new = np.arange(N, dtype=np.float32) * scale
        a.set(new)
        done: Any = cap.replay()
        done.wait()
        np.testing.assert_allclose(host, new * 2)
        np.testing.assert_allclose(z2.get(), new * 2 + 1)
        np.testing.assert_allclose(w.get(), new * 20)


def test_a_host_wait_across_contexts_is_a_host_wait_in_the_replay(
    queue: cl.CommandQueue, ctx2: cl.Context
) -> None:
    """With context 1 held, the replay stops before context 2's command that the recording
    issued after a host wait on context 1 (kernels only: no host buffer whose event pyopencl
    would wait for when it is dropped)."""
    q2 = cl.CommandQueue(ctx2)
    a = cla.to_device(queue, np.ones(N, np.float32))
    b2 = cla.to_device(q2, np.ones(N, np.float32))
    with KernelCapture() as cap:
        y = a * 2  # context 1
        y.finish()  # a host wait: what follows comes after y
        z2 = b2 + 1  # context 2
        w = a * 3  # context 1: the last command (the returned marker goes there)
    gate = _gate(queue)
    try:
        thread, done = _replay_in_thread(cap)
        thread.join(0.3)
        assert thread.is_alive() and not done  # waiting on the host for y
    finally:
        gate.set_status(COMPLETE)
    thread.join(30)
    done[0].wait()
    np.testing.assert_allclose(y.get(), 2.0)
    np.testing.assert_allclose(z2.get(queue=q2), 2.0)
    np.testing.assert_allclose(w.get(), 3.0)


def test_independent_work_of_two_contexts_is_all_done_when_the_event_is(
    queue: cl.CommandQueue, ctx2: cl.Context
) -> None:
    """The returned event stands for the last command's context; the replay waits on the host
    for the other context's last commands before it returns."""
    q2 = cl.CommandQueue(ctx2)
    a2 = cla.to_device(q2, np.ones(N, np.float32))
    a = cla.to_device(queue, np.ones(N, np.float32))
    with KernelCapture() as cap:
        for _ in range(4):
            a2 += 1  # context 2, never ordered against context 1
        a += 1  # context 1: the last command
    a2.set(np.zeros(N, np.float32))
    a.set(np.zeros(N, np.float32))
    q2.finish()
    queue.finish()
    gate = _gate(q2)
    try:
        thread, done = _replay_in_thread(cap)
        thread.join(0.3)
        assert thread.is_alive() and not done  # waiting for context 2's last command
    finally:
        gate.set_status(COMPLETE)
    thread.join(30)
    done[0].wait()
    assert (a2.get(queue=q2) == 4).all()
    assert (a.get() == 1).all()


def test_one_contexts_queues_keep_device_side_ordering(
    queue: cl.CommandQueue, ctx2: cl.Context
) -> None:
    q1b = cl.CommandQueue(queue.context)
    q2 = cl.CommandQueue(ctx2)
    a = cla.to_device(queue, np.ones(N, np.float32))
    other = cla.to_device(q2, np.ones(N, np.float32))
    with KernelCapture() as cap:
        b = a * 2  # queue
        c = b.with_queue(q1b) + 1  # q1b, waits for b's event: same context
        other2 = other * 3  # context 2
    plan = cap._program.plan  # type: ignore[union-attr]
    assert plan is not None
    c_issue = plan.issues[1]
    assert c_issue.deps == (0,) and c_issue.host == ()  # a device-side wait
    a.set(np.full(N, 4.0, np.float32))
    done: Any = cap.replay()
    done.wait()
    np.testing.assert_allclose(c.get(), 9.0)
    np.testing.assert_allclose(other2.get(queue=q2), 3.0)


def test_a_struct_dtype_discovered_inside_the_capture(queue: cl.CommandQueue) -> None:
    """pyopencl's ``match_dtype_to_c_struct`` runs a kernel in a context of its own: a capture
    around it spans two contexts (how pyopencl's own test suite met the bug)."""
    from pyopencl.tools import get_or_register_dtype, match_dtype_to_c_struct

    dtype = np.dtype([("lo", np.int32), ("hi", np.int32), ("pad", np.int32)])
    with KernelCapture() as cap:
        dtype, _ = match_dtype_to_c_struct(queue.device, "netcl_test_triple", dtype)
        dtype = get_or_register_dtype("netcl_test_triple", dtype)
        z = cla.zeros(queue, 1000, dtype)
        got = z.get()
    assert cap.num_launches >= 1 and cap._program.plan is not None  # type: ignore[union-attr]
    assert np.array_equal(got, np.zeros(1000, dtype))
    z.fill(np.ones((), dtype))
    for _ in range(2):
        done: Any = cap.replay()
        done.wait()
        assert np.array_equal(z.get(), np.zeros(1000, dtype))
