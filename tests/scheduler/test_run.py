"""Scheduler.run with real copies and kernels on two queues of one context."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pytest

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

COMPLETE = cl.command_execution_status.COMPLETE
N = 4096
ITERS = 4000  # ~10-20 ms of producer work on a 2-core PoCL device: unordered consumers lose


def test_spec_example_copies_and_kernels_on_two_queues(
    ctx: cl.Context, queue: cl.CommandQueue, queue_b: cl.CommandQueue, kernels: object
) -> None:
    host = np.arange(N, dtype=np.float32)
    out = np.zeros(N, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, host.nbytes)
    sched = Scheduler(async_mode=False)
    plan_a = ExecutionPlan(description="h2d copy")
    plan_b = ExecutionPlan(description="compute")
    plan_c = ExecutionPlan(description="d2h copy")
    sched.submit(lambda: cl.enqueue_copy(queue, buf, host, is_blocking=False), plan=plan_a)
    sched.submit(lambda: kernels.scale(queue_b, (N,), None, buf, np.float32(3)), plan=plan_b)
    sched.submit(lambda: cl.enqueue_copy(queue_b, out, buf, is_blocking=False), plan=plan_c)

    events = sched.run(wait=True)

    assert len(events) == 3
    assert all(isinstance(e, cl.Event) for e in events)
    assert all(e.command_execution_status == COMPLETE for e in events)
    np.testing.assert_array_equal(out, host * 3)
    assert sched.plans == ()


def test_sync_mode_orders_plans_across_queues_slow_producer(
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: object,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
) -> None:
    src, dst = uint_buffer(N), uint_buffer(N)
    sched = Scheduler()
    for _ in range(2):  # twice: the first run also pays the kernels' first-launch cost
        out = np.zeros(N, dtype=np.uint32)
        sched.submit(lambda: kernels.produce(queue, (N,), None, src, np.int32(ITERS)))
        sched.submit(lambda: kernels.consume(queue_b, (N,), None, src, dst))
        sched.submit(lambda o=out: cl.enqueue_copy(queue_b, o, dst, is_blocking=False))
        sched.run()
        np.testing.assert_array_equal(out, expected_consumed(N, ITERS))


def test_sync_mode_consumer_waits_for_a_held_back_producer(
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: object,
    gate: cl.UserEvent,
    release_later: Callable[..., object],
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
) -> None:
    # The producer cannot start before the gate opens (0.3 s from now): a consumer issued before
    # that would read zeros for sure, so a correct result proves the ordering.
    src, dst = uint_buffer(N), uint_buffer(N)
    out = np.zeros(N, dtype=np.uint32)
    consumer_called_at: list[float] = []

    def consumer() -> cl.Event:
        consumer_called_at.append(time.monotonic())
        return kernels.consume(queue_b, (N,), None, src, dst)

    sched = Scheduler()
    sched.submit(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate]),
        plan=ExecutionPlan(description="producer on A"),
    )
    consume = sched.submit(consumer, plan=ExecutionPlan(description="consumer on B"))
    sched.submit(lambda: cl.enqueue_copy(queue_b, out, dst, is_blocking=False), plan=consume)
    opened_at = time.monotonic() + 0.3
    release_later(gate, 0.3)

    events = sched.run()

    assert consumer_called_at[0] >= opened_at - 0.01
    assert all(e.command_execution_status == COMPLETE for e in events)
    np.testing.assert_array_equal(out, expected_consumed(N, 10))


def test_async_mode_issues_plans_back_to_back(
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: object,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
) -> None:
    # The control for the test above: with no wait between plans, the consumer on B runs while
    # the producer on A is still held back, and reads the old contents.
    src, dst = uint_buffer(N, fill=7), uint_buffer(N)
    out = np.zeros(N, dtype=np.uint32)
    sched = Scheduler(async_mode=True)
    sched.submit(lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate]))
    sched.submit(lambda: kernels.consume(queue_b, (N,), None, src, dst))
    sched.submit(lambda: cl.enqueue_copy(queue_b, out, dst, is_blocking=False))

    producer, consumer, copy = sched.run(wait=False)

    copy.wait()
    assert consumer.command_execution_status == COMPLETE
    assert producer.command_execution_status != COMPLETE  # still held back by the gate
    np.testing.assert_array_equal(out, np.full(N, 7 ^ 0x5A5A5A5A, dtype=np.uint32))
    gate.set_status(COMPLETE)
    producer.wait()


def test_async_mode_waits_once_at_the_end(
    queue: cl.CommandQueue,
    kernels: object,
    gate: cl.UserEvent,
    release_later: Callable[..., object],
    uint_buffer: Callable[..., cl.Buffer],
) -> None:
    src = uint_buffer(N)
    produced: list[cl.Event] = []
    status_seen_by_plan_1: list[int] = []

    def producer() -> cl.Event:
        produced.append(kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate]))
        return produced[0]

    sched = Scheduler(async_mode=True)
    sched.submit(producer)
    # plan 1 starts while plan 0's kernel is still held back: no wait between plans
    sched.submit(lambda: status_seen_by_plan_1.append(produced[0].command_execution_status))
    release_later(gate, 0.2)

    events = sched.run(wait=True)

    assert status_seen_by_plan_1[0] != COMPLETE
    assert events == produced
    assert events[0].command_execution_status == COMPLETE  # run waited at the end


def test_sync_mode_without_wait_still_orders_plans_but_not_the_last(
    queue: cl.CommandQueue,
    kernels: object,
    ctx: cl.Context,
    release_later: Callable[..., object],
    uint_buffer: Callable[..., cl.Buffer],
) -> None:
    src = uint_buffer(N)
    first_gate, last_gate = cl.UserEvent(ctx), cl.UserEvent(ctx)
    produced: list[cl.Event] = []
    status_seen_by_plan_1: list[int] = []

    def producer() -> cl.Event:
        produced.append(
            kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[first_gate])
        )
        return produced[0]

    sched = Scheduler()
    sched.submit(producer)
    sched.submit(lambda: status_seen_by_plan_1.append(produced[0].command_execution_status))
    sched.submit(last_gate)  # the last plan: an event nobody completes until after run returns
    release_later(first_gate, 0.2)

    events = sched.run(wait=False)

    assert status_seen_by_plan_1 == [COMPLETE]  # plan 0 was waited for before plan 1
    assert events == [produced[0], last_gate]
    assert last_gate.command_execution_status != COMPLETE  # the last plan was not waited for
    last_gate.set_status(COMPLETE)


def test_wait_false_returns_events_still_running(
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: object,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
) -> None:
    src, dst = uint_buffer(N), uint_buffer(N)
    out = np.zeros(N, dtype=np.uint32)
    sched = Scheduler(async_mode=True)
    plan = sched.submit(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate])
    )
    sched.submit(lambda: kernels.consume(queue, (N,), None, src, dst), plan=plan)
    sched.submit(lambda: cl.enqueue_copy(queue, out, dst, is_blocking=False), plan=plan)

    started = time.monotonic()
    events = sched.run(wait=False)

    assert time.monotonic() - started < 5
    assert len(events) == 3
    assert all(e.command_execution_status != COMPLETE for e in events)
    gate.set_status(COMPLETE)
    cl.wait_for_events(events)
    np.testing.assert_array_equal(out, expected_consumed(N, 10))


def test_events_submitted_directly_are_waited_for(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    kernels: object,
    release_later: Callable[..., object],
    uint_buffer: Callable[..., cl.Buffer],
) -> None:
    src = uint_buffer(N)
    held = cl.UserEvent(ctx)
    kernel_event = kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[held])
    after: list[int] = []
    sched = Scheduler()
    plan = sched.submit(kernel_event, plan=ExecutionPlan(description="events"))
    sched.submit(held, plan=plan)
    sched.submit(lambda: after.append(kernel_event.command_execution_status))
    release_later(held, 0.2)

    events = sched.run()

    assert events == [kernel_event, held]
    assert after == [COMPLETE]
    assert plan.ops == [kernel_event, held]  # run leaves plans as they are


def test_a_callable_may_return_several_events(
    queue: cl.CommandQueue, queue_b: cl.CommandQueue, kernels: object, ctx: cl.Context
) -> None:
    a = np.ones(N, dtype=np.float32)
    b = np.full(N, 2, dtype=np.float32)
    buf_a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
    buf_b = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=b)
    sched = Scheduler()
    sched.submit(
        lambda: (
            kernels.scale(queue, (N,), None, buf_a, np.float32(5)),
            None,
            kernels.scale(queue_b, (N,), None, buf_b, np.float32(5)),
        )
    )
    sched.submit(lambda: [cl.enqueue_copy(queue_b, a, buf_a), cl.enqueue_copy(queue_b, b, buf_b)])

    events = sched.run()

    assert len(events) == 4
    np.testing.assert_array_equal(a, np.full(N, 5, dtype=np.float32))
    np.testing.assert_array_equal(b, np.full(N, 10, dtype=np.float32))


def test_fire_and_forget_callables_and_order_within_a_plan() -> None:
    calls: list[str] = []
    sched = Scheduler()
    p = sched.submit(lambda: calls.append("a0"), plan=ExecutionPlan(description="a"))
    sched.submit(lambda: calls.append("b0"))
    sched.submit(lambda: calls.append("a1"), plan=p)
    assert sched.run() == []
    assert calls == ["a0", "a1", "b0"]


def test_scheduler_is_reusable_after_run(queue: cl.CommandQueue, kernels: object) -> None:
    ctx = queue.context
    data = np.ones(N, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
    calls: list[int] = []
    sched = Scheduler()
    for k in range(3):
        sched.submit(lambda k=k: calls.append(k))
        sched.submit(lambda: kernels.scale(queue, (N,), None, buf, np.float32(2)))
        assert len(sched.run()) == 1
        assert sched.plans == ()
    assert calls == [0, 1, 2]  # each run ran only its own submissions
    assert sched.run() == []  # an empty run is fine
    cl.enqueue_copy(queue, data, buf)
    np.testing.assert_array_equal(data, np.full(N, 8, dtype=np.float32))


def test_a_plan_can_be_run_again(queue: cl.CommandQueue, kernels: object) -> None:
    ctx = queue.context
    data = np.ones(N, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
    plan = ExecutionPlan(
        ops=[lambda: kernels.scale(queue, (N,), None, buf, np.float32(3))], description="x3"
    )
    sched = Scheduler()
    for _ in range(2):
        sched.submit(plan)
        sched.run()
    cl.enqueue_copy(queue, data, buf)
    np.testing.assert_array_equal(data, np.full(N, 9, dtype=np.float32))


def test_submissions_made_during_a_run_go_to_the_next_run() -> None:
    calls: list[str] = []
    sched = Scheduler()

    def submit_more() -> None:
        sched.submit(lambda: calls.append("later"))

    sched.submit(submit_more)
    sched.submit(lambda: calls.append("now"))
    sched.run()
    assert calls == ["now"]
    assert len(sched.plans) == 1
    sched.run()
    assert calls == ["now", "later"]


@pytest.mark.parametrize("async_mode", [False, True])
def test_run_returns_events_in_op_order(
    async_mode: bool, queue: cl.CommandQueue, queue_b: cl.CommandQueue, kernels: object
) -> None:
    ctx = queue.context
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, N * 4) for _ in range(4)]
    issued: list[tuple[int, cl.Event]] = []

    def launch(i: int) -> cl.Event:
        q = queue if i % 2 else queue_b
        issued.append((i, kernels.scale(q, (N,), None, bufs[i], np.float32(1))))
        return issued[-1][1]

    sched = Scheduler(async_mode=async_mode)
    shared = ExecutionPlan()
    for i in range(4):  # plans: [op 0], shared [op 1, op 3], [op 2]
        sched.submit(lambda i=i: launch(i), plan=shared if i % 2 else None)
    events = sched.run()
    assert [i for i, _ in issued] == [0, 1, 3, 2]
    assert events == [e for _, e in issued]
    assert all(e.command_execution_status == COMPLETE for e in events)
