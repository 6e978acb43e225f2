"""A host-side wait inside a capture (``Array.finish()``, ``Event.wait()``,
``cl.wait_for_events``) orders the commands issued after it; a replay, which waits on nothing
on the host, keeps that order with device-side dependencies (and flushes the waited queue)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

from netcl.runtime.capture import KernelCapture, _program

N = 1000
COMPLETE = cl.command_execution_status.COMPLETE


def _array_finish(b: cla.Array) -> None:
    b.finish()  # cl.wait_for_events(b.events), then forgets them


def _event_wait(b: cla.Array) -> None:
    events = list(b.events)
    del b.events[:]
    for event in events:
        event.wait()


def _wait_for_events_tuple(b: cla.Array) -> None:
    events = tuple(b.events)
    del b.events[:]
    cl._cl.wait_for_events(events)  # pyopencl's other name for it


HOST_WAITS = [_array_finish, _event_wait, _wait_for_events_tuple]


def _queues(ctx: cl.Context, out_of_order: bool) -> tuple[cl.CommandQueue, cl.CommandQueue]:
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE if out_of_order else 0
    try:
        return cl.CommandQueue(ctx), cl.CommandQueue(ctx, properties=props)
    except cl.Error as exc:  # pragma: no cover - device without out-of-order queues
        pytest.skip(f"the device has no out-of-order queues: {exc}")


def _replay_while_held(cap: KernelCapture, q: cl.CommandQueue, q2: cl.CommandQueue) -> None:
    """Replay with ``q`` held behind a user event: a command of ``q2`` that does not wait for
    ``q``'s replayed commands runs meanwhile (and reads what the previous run left)."""
    gate = cl.UserEvent(q.context)
    cl.enqueue_marker(q, wait_for=[gate])
    done = cap.replay()
    assert done is not None
    q2.flush()
    time.sleep(0.3)  # time for q2 to run whatever does not wait for q
    assert done.command_execution_status != COMPLETE
    gate.set_status(COMPLETE)
    done.wait()


@pytest.mark.parametrize("out_of_order", [False, True], ids=["in_order", "out_of_order"])
@pytest.mark.parametrize("host_wait", HOST_WAITS, ids=[w.__name__[1:] for w in HOST_WAITS])
def test_commands_after_a_host_wait_wait_for_the_waited_commands(
    ctx: cl.Context, host_wait: Callable[[cla.Array], None], out_of_order: bool
) -> None:
    q, q2 = _queues(ctx, out_of_order)
    a = cla.to_device(q, np.ones(N, np.float32))
    with KernelCapture() as cap:
        b = a * 2  # on q
        host_wait(b)  # b's events are gone: c's launch names no wait
        c = b.with_queue(q2) + 1  # on q2
        d = c * 3  # on q2 after c (an out-of-order q2 orders it through c's event)
    q2.finish()
    np.testing.assert_allclose(d.get(), 9.0)
    for value in (5.0, 7.0):
        a.set(np.full(N, value, np.float32))
        _replay_while_held(cap, q, q2)
        np.testing.assert_allclose(c.get(), value * 2 + 1)
        np.testing.assert_allclose(d.get(), (value * 2 + 1) * 3)


@pytest.mark.parametrize("out_of_order", [False, True], ids=["in_order", "out_of_order"])
def test_every_host_wait_orders_the_commands_after_it(ctx: cl.Context, out_of_order: bool) -> None:
    """Two host waits, each for another queue's work, each followed by commands of q2: the
    second wait's commands wait for its work too, though q2 took an order from the first, and
    on an out-of-order q2 each of them does (q3 held in the replay: f and g must not run before
    e)."""
    q, q2 = _queues(ctx, out_of_order)
    q3 = cl.CommandQueue(ctx)
    a = cla.to_device(q, np.ones(N, np.float32))
    with KernelCapture() as cap:
        b = a * 2  # on q
        b.finish()
        c = b.with_queue(q2) + 1  # on q2, after the first wait
        e = a.with_queue(q3) * 4  # on q3
        e.finish()
        f = e.with_queue(q2) + 1  # on q2, after the second wait
        g = e.with_queue(q2) * 3  # and another, not after f on an out-of-order q2
    q2.finish()
    for value in (5.0, 7.0):
        a.set(np.full(N, value, np.float32))
        _replay_while_held(cap, q3, q2)
        np.testing.assert_allclose(c.get(), value * 2 + 1)
        np.testing.assert_allclose(f.get(), value * 4 + 1)
        np.testing.assert_allclose(g.get(), value * 12)


def test_a_host_wait_on_an_event_from_before_begin_adds_no_dependency(ctx: cl.Context) -> None:
    q, q2 = _queues(ctx, False)
    a = cla.to_device(q, np.ones(N, np.float32))
    earlier = a * 2
    with KernelCapture() as cap:
        earlier.finish()  # waits for a command the capture did not record
        c = a.with_queue(q2) + 1
        d = a * 3
    assert cap.num_launches == 2
    a.set(np.full(N, 4.0, np.float32))
    done = cap.replay()
    assert done is not None
    done.wait()
    np.testing.assert_allclose(c.get(), 5.0)
    np.testing.assert_allclose(d.get(), 12.0)


def test_replay_flushes_a_queue_before_another_queue_waits_on_it(
    ctx: cl.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OpenCL lets a command wait on another queue's event only once that queue is flushed
    # (PoCL happens not to need it, so the flushes are observed, not their absence's hang)
    q, q2 = _queues(ctx, False)
    a = cla.to_device(q, np.ones(N, np.float32))
    with KernelCapture() as cap:
        b = a * 2  # on q
        c = b.with_queue(q2) + 1  # on q2, waits for b's event
        e = c.with_queue(q) - 1  # on q again, waits for c's event
        f = a * 5  # on q: the returned marker on q also waits for q2's commands
    flushed: list[int] = []
    real = _program._flush

    def spy(queue: cl.CommandQueue) -> None:
        flushed.append(queue.int_ptr)
        real(queue)

    monkeypatch.setattr(_program, "_flush", spy)
    a.set(np.full(N, 3.0, np.float32))
    done = cap.replay()
    assert done is not None
    assert flushed == [q.int_ptr, q2.int_ptr]  # before c's launch, before e's
    done.wait()
    np.testing.assert_allclose(c.get(), 7.0)
    np.testing.assert_allclose(e.get(), 6.0)
    np.testing.assert_allclose(f.get(), 15.0)


def test_host_waits_are_not_commands(queue: cl.CommandQueue) -> None:
    a = cla.to_device(queue, np.ones(N, np.float32))
    cap = KernelCapture()
    with cap:
        b = a + 1
        b.finish()
        assert len(cap.commands) == 1
    assert len(cap.commands) == cap.num_launches == 1
    done: Any = cap.replay()
    done.wait()
    np.testing.assert_allclose(b.get(), 2.0)


def test_a_capture_of_only_a_finish_on_an_out_of_order_queue_replays_nothing(
    ctx: cl.Context,
) -> None:
    """A finish is a command but makes no event: a capture holding only one, on an out-of-order
    queue (replayed by its own schedule), replays without error and returns no event."""
    _, q = _queues(ctx, True)
    with KernelCapture() as cap:
        q.finish()
    assert cap.commands == () and cap.num_launches == 0
    assert cap.replay() is None and cap.replay() is None
    assert cap.replay_count == 2


def test_an_interrupt_between_a_host_wait_and_its_record_discards_the_recording(
    queue: cl.CommandQueue,
) -> None:
    a = cla.to_device(queue, np.ones(N, np.float32))
    cap = KernelCapture()
    cap.begin()
    b = a + 1
    rec = cap._recording
    assert rec is not None
    recorded = rec.raw

    class Interrupted(list):  # type: ignore[type-arg]
        def append(self, item: Any) -> None:  # the wait happened; recording it is interrupted
            raise KeyboardInterrupt

    rec.raw = Interrupted(recorded)
    try:
        with pytest.raises(KeyboardInterrupt):
            b.finish()
    finally:
        rec.raw = recorded
    with pytest.raises(RuntimeError, match="may have missed a command"):
        cap.end()
    assert not cap.is_recording
    with pytest.raises(RuntimeError, match="nothing captured"):
        cap.replay()
    cap.begin()  # and the capture records again
    b.finish()
    c = a * 3
    assert cap.end() == 1
    a.set(np.full(N, 2.0, np.float32))
    done: Any = cap.replay()
    done.wait()
    np.testing.assert_allclose(c.get(), 6.0)


@pytest.mark.parametrize(
    "enqueue", [cl.enqueue_marker, cl.enqueue_barrier], ids=["marker", "barrier"]
)
def test_a_marker_or_barrier_on_another_queue_keeps_its_wait_list(
    ctx: cl.Context, enqueue: Callable[..., cl.Event]
) -> None:
    """``cl.enqueue_marker(q2, [event])`` / ``cl.enqueue_barrier(q2, [event])`` (pyopencl
    passes the wait list on positionally): in the replay too, the commands after it on q2
    wait for q's command."""
    q, q2 = _queues(ctx, False)
    a = cla.to_device(q, np.ones(N, np.float32))
    with KernelCapture() as cap:
        b = a * 2  # on q
        events = list(b.events)
        del b.events[:]  # c's launch names no wait: only the marker's wait list orders it
        enqueue(q2, events)
        c = b.with_queue(q2) + 1  # on q2
    q2.finish()
    np.testing.assert_allclose(c.get(), 3.0)
    for value in (5.0, 7.0):
        a.set(np.full(N, value, np.float32))
        _replay_while_held(cap, q, q2)
        np.testing.assert_allclose(c.get(), value * 2 + 1)


def test_a_direct_launch_on_another_queue_keeps_its_wait_list(ctx: cl.Context) -> None:
    """``cl.enqueue_nd_range_kernel(q2, ..., wait_for=[event])`` with the arguments set in the
    capture: in the replay too, the launch on q2 waits for q's command."""
    q, q2 = _queues(ctx, False)
    inc = cl.Kernel(
        cl.Program(
            ctx,
            "__kernel void inc(__global float *o, __global const float "
            "*a) { int i = get_global_id(0); o[i] = a[i] + 1.0f; }",
        ).build(),
        "inc",
    )
    a = cla.to_device(q, np.ones(N, np.float32))
    c = cla.empty(q2, N, np.float32)
    with KernelCapture() as cap:
        b = a * 2  # on q
        inc.set_args(c.data, b.data)
        cl.enqueue_nd_range_kernel(q2, inc, (N,), None, wait_for=list(b.events))
    q2.finish()
    np.testing.assert_allclose(c.get(), 3.0)
    for value in (5.0, 7.0):
        a.set(np.full(N, value, np.float32))
        _replay_while_held(cap, q, q2)
        np.testing.assert_allclose(c.get(), value * 2 + 1)
