"""Plans that come ``after`` a plan of an earlier run: ordered on that plan's last events, so
resubmitting a failed run's ``unrun_plans`` (the error's own advice) is always correct."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

COMPLETE = cl.command_execution_status.COMPLETE
N = 4096


def _ordering(spans: InMemorySpanExporter) -> dict[str, str]:
    return {
        str(s.attributes["netcl.plan.description"]): str(s.attributes["netcl.plan.ordering"])
        for s in spans.get_finished_spans()
        if s.name == "netcl.scheduler.plan" and s.attributes is not None
    }


def _read(ctx: cl.Context, buf: cl.Buffer) -> npt.NDArray[np.uint32]:
    out = np.empty(N, dtype=np.uint32)
    cl.enqueue_copy(cl.CommandQueue(ctx), out, buf)  # a queue of its own: runs at once
    return out


def _bad_input() -> None:
    raise ValueError("bad input")


def test_unrun_plans_resubmitted_after_an_error_still_follow_the_failed_run(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
    spans: InMemorySpanExporter,
) -> None:
    # 'produce' is held back on the device; 'check' comes after it and raises; 'read' comes
    # after 'check' and copies what 'produce' writes. Resubmitting the error's unrun_plans
    # ('read') must not let the copy run before 'produce' has written: it orders, through
    # 'check' (which left no events), on 'produce's kernel.
    queue_c = cl.CommandQueue(ctx)
    src = uint_buffer(N)
    out = np.zeros(N, dtype=np.uint32)
    produce = ExecutionPlan(description="produce", queue=queue)
    produce.ops.append(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate])
    )
    check = ExecutionPlan(ops=[_bad_input], description="check", queue=queue_b, after=produce)
    read = ExecutionPlan(description="read", queue=queue_c, after=check)
    read.ops.append(lambda: cl.enqueue_copy(queue_c, out, src, is_blocking=False))
    sched = Scheduler(async_mode=True)
    for p in (produce, check, read):
        sched.submit(p)
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    assert info.value.plan is check and info.value.unrun_plans == [read]

    for p in info.value.unrun_plans:
        sched.submit(p)
    (copied,) = sched.run(wait=False)

    assert copied.command_execution_status != COMPLETE  # waits on the device for 'produce'
    assert _ordering(spans)["read"] == "device"
    gate.set_status(COMPLETE)
    copied.wait()
    produced = expected_consumed(N, 10) ^ np.uint32(0x5A5A5A5A)
    np.testing.assert_array_equal(out, produced)


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_plan_after_a_plan_of_an_earlier_run_still_in_flight_waits_for_it(
    async_mode: bool,
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
    spans: InMemorySpanExporter,
    release_later: Callable[..., Any],
) -> None:
    src, dst = uint_buffer(N), uint_buffer(N, fill=3)
    produce = ExecutionPlan(description="produce", queue=queue)
    produce.ops.append(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate])
    )
    sched = Scheduler(async_mode=async_mode)
    sched.submit(produce)
    sched.run(wait=False)  # 'produce' is still held back when the next run starts
    gate_seen: list[int] = []

    def consume() -> cl.Event:
        gate_seen.append(gate.command_execution_status)
        return kernels.consume(queue_b, (N,), None, src, dst)

    sched.submit(ExecutionPlan(ops=[consume], description="consume", queue=queue_b, after=produce))
    if async_mode:  # ordered on the device: the run returns while 'produce' is held back
        (consumed,) = sched.run(wait=False)
        assert consumed.command_execution_status != COMPLETE
        np.testing.assert_array_equal(_read(ctx, dst), np.full(N, 3, dtype=np.uint32))
        gate.set_status(COMPLETE)
        consumed.wait()
    else:  # sync mode: the host waits for it before 'consume' is issued
        release_later(gate, 0.2)
        sched.run()
        assert gate_seen == [COMPLETE]
    assert _ordering(spans)["consume"] == ("device" if async_mode else "host")
    np.testing.assert_array_equal(_read(ctx, dst), expected_consumed(N, 10))


def test_a_plan_after_a_failed_plan_of_an_earlier_run_is_not_issued(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    uint_buffer: Callable[..., cl.Buffer],
) -> None:
    failing = cl.UserEvent(ctx)  # not the gate fixture: PoCL aborts when a failed one is set again
    src = uint_buffer(N)
    produce = ExecutionPlan(description="produce", queue=queue)
    produce.ops.append(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(1), wait_for=[failing])
    )
    sched = Scheduler(async_mode=True)
    sched.submit(produce)
    (produced,) = sched.run(wait=False)
    failing.set_status(-5)
    deadline = time.monotonic() + 10
    while produced.command_execution_status >= 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    calls: list[int] = []
    consume = ExecutionPlan(
        ops=[lambda: calls.append(1)], description="consume", queue=queue_b, after=produce
    )
    sched.submit(consume)

    with pytest.raises(Scheduler.Error) as info:
        sched.run()

    err = info.value
    assert err.plan is produce and err.plan_index == -1 and err.op_index == 0
    assert err.event is produced and err.unrun_plans == [consume] and calls == []
    assert "op 0 (" in str(err) and "of plan 'produce' of an earlier run returned an event" in str(
        err
    )
    assert "1 later plan(s) not run: plan 0 'consume'" in str(err)
    assert sched.plans == ()


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_plan_keeps_its_last_events_only_as_long_as_it_lives(
    async_mode: bool, queue: cl.CommandQueue
) -> None:
    # what a plan keeps of its last run refers to nothing that refers back to the plan: a plan
    # (with its events) is freed by reference counting as soon as nothing names it, the
    # scheduler holds nothing of a finished run
    gc.disable()
    try:
        sched = Scheduler(async_mode=async_mode)
        first = ExecutionPlan(ops=[lambda: cl.enqueue_marker(queue)], queue=queue)
        second = ExecutionPlan(ops=[lambda: cl.enqueue_marker(queue)], queue=queue, after=first)
        sched.submit(first)
        sched.submit(second)
        sched.run(wait=False)
        first_ref, second_ref = weakref.ref(first), weakref.ref(second)
        del first
        assert first_ref() is not None  # 'second' names it in after=: kept for a later follower
        del second
        assert first_ref() is None and second_ref() is None
    finally:
        gc.enable()
    queue.finish()


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_run_writes_nothing_onto_the_plans(
    async_mode: bool, queue: cl.CommandQueue, queue_b: cl.CommandQueue
) -> None:
    # what a run keeps of a plan (its last events, for later plans) is the scheduler's own: the
    # plan objects keep exactly their fields, through a run, a failed run and a resubmission
    def fields(plan: ExecutionPlan) -> set[str]:
        return set(vars(plan))

    sched = Scheduler(async_mode=async_mode)
    first = sched.submit(lambda: cl.enqueue_marker(queue))
    second = ExecutionPlan(ops=[lambda: cl.enqueue_marker(queue_b)], queue=queue_b, after=first)
    failing = ExecutionPlan(ops=[_bad_input], queue=queue, after=second)
    for p in (second, failing):
        sched.submit(p)
    with pytest.raises(Scheduler.Error):
        sched.run()
    sched.submit(failing)
    failing.ops[0] = lambda: None
    sched.run()
    for p in (first, second, failing):
        assert fields(p) == {"ops", "description", "queue", "after"}


def test_a_plan_whose_last_run_left_nothing_orders_nothing(
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    gate: cl.UserEvent,
    spans: InMemorySpanExporter,
) -> None:
    # 'produce' first returns an event held back by the gate; run again, its op returns None:
    # a plan after it follows its last run, which left nothing to wait for (not the held event)
    results: list[cl.Event | None] = [cl.enqueue_marker(queue, wait_for=[gate]), None]
    produce = ExecutionPlan(ops=[lambda: results.pop(0)], description="produce", queue=queue)
    sched = Scheduler(async_mode=True)
    sched.submit(produce)
    sched.run(wait=False)
    sched.submit(produce)
    sched.run(wait=False)
    follow = ExecutionPlan(ops=[lambda: None], description="follow", queue=queue_b, after=produce)
    sched.submit(follow)
    assert sched.run() == []
    assert _ordering(spans)["follow"] == "none"


def test_a_plan_follows_a_plan_another_scheduler_ran(
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    gate: cl.UserEvent,
    spans: InMemorySpanExporter,
) -> None:
    # a plan's last events are the plan's, whichever scheduler ran it
    produce = ExecutionPlan(
        ops=[lambda: cl.enqueue_marker(queue, wait_for=[gate])],
        description="produce",
        queue=queue,
    )
    first = Scheduler(async_mode=True)
    first.submit(produce)
    (held,) = first.run(wait=False)
    second = Scheduler(async_mode=True)
    second.submit(
        ExecutionPlan(
            ops=[lambda: cl.enqueue_marker(queue_b)],
            description="follow",
            queue=queue_b,
            after=produce,
        )
    )
    (followed,) = second.run(wait=False)
    assert _ordering(spans)["follow"] == "device"
    assert followed.command_execution_status != COMPLETE  # held back with 'produce'
    gate.set_status(COMPLETE)
    followed.wait()
    assert held.command_execution_status == COMPLETE
