"""ExecutionPlan.queue / after: plans ordered on the device (async mode), host fallback, failures
of a plan others follow, cycles, and the ordering telemetry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

COMPLETE = cl.command_execution_status.COMPLETE
N = 4096


def _read(ctx: cl.Context, buf: cl.Buffer, n: int = N) -> npt.NDArray[np.uint32]:
    """Read ``buf`` on a queue of its own: nothing else is queued there, so the read runs at
    once even while other queues hold commands back."""
    out = np.empty(n, dtype=np.uint32)
    cl.enqueue_copy(cl.CommandQueue(ctx), out, buf)  # blocking
    return out


def _host_waits(metric_points: Callable[[str], list[Any]]) -> int:
    return sum(p.value for p in metric_points("netcl.scheduler.host_waits"))


def _ordering(spans: InMemorySpanExporter) -> dict[str, str]:
    return {
        str(s.attributes["netcl.plan.description"]): str(s.attributes["netcl.plan.ordering"])
        for s in spans.get_finished_spans()
        if s.name == "netcl.scheduler.plan" and s.attributes is not None
    }


def test_a_plan_after_another_is_ordered_on_the_device_without_a_host_wait(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
    release_later: Callable[..., threading.Timer],
) -> None:
    # A's producer is held back by a user event; B, on another queue, comes after A. If the
    # scheduler waited on the host, run(wait=False) could only return once the timer (a safety
    # net, 20 s) opened the gate.
    src, dst = uint_buffer(N, fill=7), uint_buffer(N, fill=3)
    waits_before = _host_waits(metric_points)
    plan_a = ExecutionPlan(description="A produce", queue=queue)
    plan_a.ops.append(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate])
    )
    plan_b = ExecutionPlan(description="B consume", queue=queue_b, after=plan_a)
    plan_b.ops.append(lambda: kernels.consume(queue_b, (N,), None, src, dst))
    sched = Scheduler(async_mode=True)
    sched.submit(plan_a)
    sched.submit(plan_b)
    safety_net = release_later(gate, 20.0)

    produced, consumed = sched.run(wait=False)

    assert gate.command_execution_status != COMPLETE  # returned while A is still held back
    assert produced.command_execution_status != COMPLETE
    assert consumed.command_execution_status != COMPLETE  # B waits on the device
    np.testing.assert_array_equal(_read(ctx, dst), np.full(N, 3, dtype=np.uint32))  # B not run
    assert _ordering(spans) == {"A produce": "none", "B consume": "device"}
    assert _host_waits(metric_points) == waits_before

    safety_net.cancel()
    gate.set_status(COMPLETE)
    consumed.wait()
    np.testing.assert_array_equal(_read(ctx, dst), expected_consumed(N, 10))  # saw A's writes


def test_without_a_queue_the_plan_waits_on_the_host_and_says_so(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
    release_later: Callable[..., threading.Timer],
) -> None:
    src, dst = uint_buffer(N), uint_buffer(N)
    waits_before = _host_waits(metric_points)
    b_called_with_gate: list[int] = []

    def consume() -> cl.Event:
        b_called_with_gate.append(gate.command_execution_status)
        return kernels.consume(queue_b, (N,), None, src, dst)

    plan_a = ExecutionPlan(description="A produce")
    plan_a.ops.append(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate])
    )
    sched = Scheduler(async_mode=True)
    sched.submit(plan_a)
    sched.submit(consume, plan=ExecutionPlan(description="B consume", after=[plan_a]))
    sched.submit(lambda: None, plan=ExecutionPlan(description="C free"))
    release_later(gate, 0.2)

    events = sched.run(wait=False)

    assert b_called_with_gate == [COMPLETE]  # the host waited for A before issuing B
    cl.wait_for_events(events)
    np.testing.assert_array_equal(_read(ctx, dst), expected_consumed(N, 10))
    assert _ordering(spans) == {"A produce": "none", "B consume": "host", "C free": "none"}
    assert _host_waits(metric_points) - waits_before == 1


def test_sync_mode_plans_say_host_ordering(
    queue: cl.CommandQueue,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    waits_before = _host_waits(metric_points)
    sched = Scheduler()
    for name in ("p0", "p1", "no events", "p3", "p4"):
        op = (lambda: None) if name == "no events" else (lambda: cl.enqueue_marker(queue))
        sched.submit(op, plan=ExecutionPlan(description=name))
    sched.run()
    # a plan after one without events had nothing to wait for
    assert _ordering(spans) == {
        "p0": "none",
        "p1": "host",
        "no events": "host",
        "p3": "none",
        "p4": "host",
    }
    assert _host_waits(metric_points) - waits_before == 3  # not the final wait


def test_plans_the_host_waited_for_are_not_waited_for_again(
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    """Once the host has waited for plans' events (to order a plan without a queue after them),
    later plans that come after any of the same plans, in this run or the next, have nothing left
    to wait for: one host wait, not one per follower."""
    waits_before = _host_waits(metric_points)
    one = ExecutionPlan([lambda: cl.enqueue_marker(queue)], "one", queue=queue)
    two = ExecutionPlan([lambda: cl.enqueue_marker(queue_b)], "two", queue=queue_b)
    sched = Scheduler(async_mode=True)
    sched.submit(one)
    sched.submit(two)
    sched.submit(ExecutionPlan([lambda: None], "after both", after=[one, two]))
    sched.submit(ExecutionPlan([lambda: None], "after one", after=one))
    sched.submit(ExecutionPlan([lambda: None], "after two", after=two))
    sched.run(wait=False)
    assert _ordering(spans) == {
        "one": "none",
        "two": "none",
        "after both": "host",
        "after one": "none",
        "after two": "none",
    }
    spans.clear()
    sched.submit(ExecutionPlan([lambda: None], "next run, no queue", after=one))
    sched.submit(ExecutionPlan([lambda: None], "next run, a queue", queue=queue, after=two))
    sched.run()
    assert _ordering(spans) == {"next run, no queue": "none", "next run, a queue": "none"}
    assert _host_waits(metric_points) - waits_before == 1


def test_an_after_reassigned_since_construction_is_followed(
    queue: cl.CommandQueue, queue_b: cl.CommandQueue, spans: InMemorySpanExporter
) -> None:
    """``plan.after`` set after construction to a plan, a list of plans or None (not normalised
    to a tuple) orders the plan as the same value given to the constructor would."""
    first = ExecutionPlan([lambda: cl.enqueue_marker(queue)], "first", queue=queue)
    by_plan = ExecutionPlan([lambda: cl.enqueue_marker(queue_b)], "plan", queue=queue_b)
    by_plan.after = first
    by_list = ExecutionPlan([lambda: cl.enqueue_marker(queue_b)], "list", queue=queue_b)
    by_list.after = [first]
    by_none = ExecutionPlan([lambda: cl.enqueue_marker(queue_b)], "none", queue=queue_b)
    by_none.after = None
    sched = Scheduler(async_mode=True)
    for plan in (first, by_plan, by_list, by_none):
        sched.submit(plan)
    events = sched.run()
    assert [e.command_execution_status for e in events] == [COMPLETE] * 4
    assert _ordering(spans) == {"first": "none", "plan": "device", "list": "device", "none": "none"}


def test_a_chain_of_plans_on_three_queues_runs_in_order(
    ctx: cl.Context, queue: cl.CommandQueue, queue_b: cl.CommandQueue, kernels: Any
) -> None:
    # copy in (queue), compute (queue_b), copy out (queue_c), per chunk, each plan after the
    # previous one: ExecutionPlan(queue=..., after=prev), with prev None for the first.
    queue_c = cl.CommandQueue(ctx)
    chunks = 4
    host_in = [np.arange(N, dtype=np.float32) + c for c in range(chunks)]
    host_out = [np.zeros(N, dtype=np.float32) for _ in range(chunks)]
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, N * 4) for _ in range(chunks)]
    sched = Scheduler(async_mode=True)
    for c in range(chunks):
        prev = None
        for q, op in (
            (queue, lambda c=c: cl.enqueue_copy(queue, bufs[c], host_in[c], is_blocking=False)),
            (queue_b, lambda c=c: kernels.scale(queue_b, (N,), None, bufs[c], np.float32(2))),
            (
                queue_c,
                lambda c=c: cl.enqueue_copy(queue_c, host_out[c], bufs[c], is_blocking=False),
            ),
        ):
            prev = ExecutionPlan(ops=[op], queue=q, after=prev)
            sched.submit(prev)
    events = sched.run()
    assert len(events) == 3 * chunks
    for c in range(chunks):
        np.testing.assert_array_equal(host_out[c], host_in[c] * 2)


def test_after_a_plan_submitted_later_moves_the_plan_behind_it() -> None:
    calls: list[str] = []
    first = ExecutionPlan(description="first")
    late = ExecutionPlan(ops=[lambda: calls.append("late")], description="late", after=first)
    first.ops.append(lambda: calls.append("first"))
    other = ExecutionPlan(ops=[lambda: calls.append("other")], description="other")
    for async_mode in (False, True):
        calls.clear()
        sched = Scheduler(async_mode=async_mode)
        sched.submit(late)
        sched.submit(other)
        sched.submit(first)
        sched.run()
        assert calls == ["other", "first", "late"]


def test_after_a_plan_outside_the_run_is_taken_as_finished(queue: cl.CommandQueue) -> None:
    done = ExecutionPlan(description="ran in an earlier run")
    sched = Scheduler(async_mode=True)
    calls: list[int] = []
    sched.submit(lambda: calls.append(1), plan=ExecutionPlan(queue=queue, after=done))
    assert sched.run() == [] and calls == [1]


@pytest.mark.parametrize("async_mode", [False, True])
def test_cycles_are_refused_naming_the_cycle_and_nothing_runs(async_mode: bool) -> None:
    calls: list[str] = []
    a = ExecutionPlan(ops=[lambda: calls.append("a")], description="a")
    b = ExecutionPlan(ops=[lambda: calls.append("b")], description="b", after=a)
    c = ExecutionPlan(ops=[lambda: calls.append("c")], description="c", after=b)
    free = ExecutionPlan(ops=[lambda: calls.append("free")], description="free")
    a.after = (c,)
    sched = Scheduler(async_mode=async_mode)
    for p in (free, a, b, c):
        sched.submit(p)
    with pytest.raises(
        ValueError,
        match=r"form a cycle: plan 1 'a' -> plan 2 'b' -> plan 3 'c' -> plan 1 'a' .*"
        r"nothing was run and the plans stay scheduled",
    ):
        sched.run()
    assert calls == [] and sched.plans == (free, a, b, c)

    a.after = ()  # fixed: the same scheduler runs them
    sched.run()
    assert calls == ["free", "a", "b", "c"]


def test_a_plan_after_itself_is_a_cycle() -> None:
    loop = ExecutionPlan(description="loop")
    loop.after = loop
    sched = Scheduler()
    sched.submit(loop)
    with pytest.raises(ValueError, match=r"cycle: plan 0 'loop' -> plan 0 'loop'"):
        sched.run()


def test_bad_queue_and_after_are_refused(queue: cl.CommandQueue) -> None:
    with pytest.raises(TypeError, match=r"ExecutionPlan 'x': queue must be a pyopencl.Command"):
        ExecutionPlan(description="x", queue="q")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"'y': after must hold ExecutionPlans, got 3 \(int\)"):
        ExecutionPlan(description="y", after=[ExecutionPlan(), 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"'z': after must be an ExecutionPlan or a sequence"):
        ExecutionPlan(description="z", after=5)  # type: ignore[arg-type]
    plan = ExecutionPlan(description="later", queue=queue)
    plan.after = "oops"  # type: ignore[assignment]
    sched = Scheduler(async_mode=True)
    sched.submit(plan)
    with pytest.raises(TypeError, match=r"'later': after must be"):
        sched.run()
    assert sched.plans == (plan,)  # refused before anything was taken


def test_after_is_normalised_and_kept_out_of_equality_and_repr() -> None:
    a = ExecutionPlan(description="a")
    b = ExecutionPlan(description="b", after=a)
    assert b.after == (a,)
    assert ExecutionPlan(after=None).after == ()
    assert ExecutionPlan(after=[a, b]).after == (a, b)
    assert b == ExecutionPlan(description="b")
    assert "after" not in repr(b)


# --- failures in a plan others follow --------------------------------------------------------


@pytest.mark.parametrize("with_queue", [True, False])
def test_a_plan_already_failed_is_never_built_upon(
    with_queue: bool,
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    uint_buffer: Callable[..., cl.Buffer],
    spans: InMemorySpanExporter,
) -> None:
    failed = cl.UserEvent(ctx)
    failed.set_status(-14)
    src, dst = uint_buffer(N), uint_buffer(N, fill=3)
    b_calls: list[int] = []

    def consume() -> cl.Event:
        b_calls.append(1)
        return kernels.consume(queue_b, (N,), None, src, dst)

    upload = ExecutionPlan(description="upload", queue=queue)
    upload.ops.append(lambda: kernels.produce(queue, (N,), None, src, np.int32(1)))
    upload.ops.append(failed)
    compute = ExecutionPlan(
        ops=[consume], description="compute", queue=queue_b if with_queue else None, after=upload
    )
    sched = Scheduler(async_mode=True)
    sched.submit(upload)
    sched.submit(compute)

    with pytest.raises(Scheduler.Error) as info:
        sched.run()

    err = info.value
    assert err.plan is upload and err.op is failed and err.event is failed and err.op_index == 1
    assert err.unrun_plans == [compute] and b_calls == []
    assert "op 1 (pyopencl.UserEvent(USER)) of plan 0 'upload'" in str(err)
    assert "1 later plan(s) not run: plan 1 'compute'" in str(err)
    np.testing.assert_array_equal(_read(ctx, dst), np.full(N, 3, dtype=np.uint32))
    plan_spans = [s for s in spans.get_finished_spans() if s.name == "netcl.scheduler.plan"]
    assert plan_spans[-1].status.status_code is StatusCode.ERROR
    assert plan_spans[-1].attributes is not None
    error_type = plan_spans[-1].attributes["error.type"]
    assert error_type == "netcl.runtime.scheduler._errors.SchedulerError"


def test_a_plan_failing_on_the_device_holds_back_its_followers(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    uint_buffer: Callable[..., cl.Buffer],
) -> None:
    # A's kernel waits on a user event that fails after both plans were issued: B's commands,
    # behind a barrier on the device, fail with it instead of running on A's missing output;
    # the final wait does not hang, names A's op and returns B as not run. (Not the gate
    # fixture: PoCL aborts when a failed user event is set again.)
    gate = cl.UserEvent(ctx)
    src, dst = uint_buffer(N), uint_buffer(N, fill=3)
    produce = ExecutionPlan(description="produce", queue=queue)
    produce.ops.append(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate])
    )
    consume = ExecutionPlan(description="consume", queue=queue_b, after=produce)
    consume.ops.append(lambda: kernels.consume(queue_b, (N,), None, src, dst))
    # the last plan fails the user event: after both plans above were issued, whatever the load
    unrelated = ExecutionPlan(description="unrelated", ops=[lambda: gate.set_status(-5)])
    sched = Scheduler(async_mode=True)
    for p in (produce, consume, unrelated):
        sched.submit(p)

    with pytest.raises(Scheduler.Error) as info:
        sched.run()

    err = info.value
    assert err.plan is produce and err.op_index == 0
    assert err.unrun_plans == [consume]
    assert "of plan 0 'produce' returned an event (pyopencl.Event(NDRANGE_KERNEL)) that" in str(err)
    assert "1 later plan(s) not run: plan 1 'consume'" in str(err)
    produced, consumed = err.events
    assert produced.command_execution_status < 0 and consumed.command_execution_status < 0
    np.testing.assert_array_equal(_read(ctx, dst), np.full(N, 3, dtype=np.uint32))


class _HostTask:
    """An event-like object that is not an OpenCL event (no wait list can hold it)."""

    def __init__(self) -> None:
        self.waited = False

    def wait(self) -> None:
        self.waited = True


def test_events_a_barrier_cannot_take_fall_back_to_a_host_wait(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    host_task = _HostTask()
    other_ctx = cl.Context(ctx.devices)
    foreign = cl.enqueue_marker(cl.CommandQueue(other_ctx))  # another context: barrier refuses
    waits_before = _host_waits(metric_points)
    seen: list[bool] = []
    sched = Scheduler(async_mode=True)
    host_plan = sched.submit(lambda: host_task, plan=ExecutionPlan(description="host task"))
    foreign_plan = sched.submit(lambda: foreign, plan=ExecutionPlan(description="foreign"))
    sched.submit(
        lambda: seen.append(host_task.waited),
        plan=ExecutionPlan(description="after host", queue=queue, after=host_plan),
    )
    sched.submit(
        lambda: None,
        plan=ExecutionPlan(description="after foreign", queue=queue, after=foreign_plan),
    )
    sched.run()
    assert seen == [True]  # waited for on the host before the plan's ops ran
    assert _ordering(spans) == {
        "host task": "none",
        "foreign": "none",
        "after host": "host",
        "after foreign": "host",
    }
    assert _host_waits(metric_points) - waits_before == 2


def test_following_an_earlier_run_through_its_events(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], npt.NDArray[np.uint32]],
    spans: InMemorySpanExporter,
) -> None:
    # after= orders plans within a run; to follow a run(wait=False) still in flight, its events
    # become a plan of the next run, and that plan goes in after=.
    src, dst = uint_buffer(N), uint_buffer(N, fill=3)
    sched = Scheduler(async_mode=True)
    sched.submit(lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate]))
    first_run = sched.run(wait=False)

    earlier = ExecutionPlan(ops=list(first_run), description="first run")
    consume = ExecutionPlan(description="consume", queue=queue_b, after=earlier)
    consume.ops.append(lambda: kernels.consume(queue_b, (N,), None, src, dst))
    sched.submit(earlier)
    sched.submit(consume)
    (_, consumed) = sched.run(wait=False)

    assert consumed.command_execution_status != COMPLETE
    np.testing.assert_array_equal(_read(ctx, dst), np.full(N, 3, dtype=np.uint32))
    assert _ordering(spans)["consume"] == "device"
    gate.set_status(COMPLETE)
    consumed.wait()
    np.testing.assert_array_equal(_read(ctx, dst), expected_consumed(N, 10))


# --- what was waited for already is not waited for again -------------------------------------


def test_sync_mode_does_not_wait_again_for_a_plan_it_waited_for(
    queue: cl.CommandQueue,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    # sync mode waited for A before the next plan: B, after A behind a plan without events, has
    # nothing left to wait for (no second host wait, ordering "none")
    waits_before = _host_waits(metric_points)
    sched = Scheduler()
    a = sched.submit(lambda: cl.enqueue_marker(queue), plan=ExecutionPlan(description="A"))
    sched.submit(lambda: None, plan=ExecutionPlan(description="C no events"))
    calls: list[str] = []
    sched.submit(lambda: calls.append("B"), plan=ExecutionPlan(description="B", after=a))
    sched.run()
    assert calls == ["B"]
    assert _ordering(spans) == {"A": "none", "C no events": "host", "B": "none"}
    assert _host_waits(metric_points) - waits_before == 1


def test_a_plan_after_one_of_a_waited_run_is_not_ordered_again(
    queue: cl.CommandQueue,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    # run(wait=True) waited for A's events: a plan of the next run after A needs no barrier
    sched = Scheduler(async_mode=True)
    a = ExecutionPlan(ops=[lambda: cl.enqueue_marker(queue)], description="A", queue=queue)
    sched.submit(a)
    (marker,) = sched.run(wait=True)
    assert marker.command_execution_status == COMPLETE
    waits_before = _host_waits(metric_points)
    calls: list[str] = []
    sched.submit(
        ExecutionPlan(ops=[lambda: calls.append("B")], description="B", queue=queue, after=a)
    )
    assert sched.run() == [] and calls == ["B"]
    assert _ordering(spans)["B"] == "none"
    assert _host_waits(metric_points) == waits_before


def test_a_plan_after_several_waits_for_each_of_them(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    gate: cl.UserEvent,
    uint_buffer: Callable[..., cl.Buffer],
    spans: InMemorySpanExporter,
    release_later: Callable[..., threading.Timer],
) -> None:
    # C (no queue) comes after A, held back by the gate, and B, done at once: the host waits for
    # both before C's op runs, not only for the last plan named
    src = uint_buffer(N)
    produced: list[cl.Event] = []
    seen: list[int] = []

    def produce() -> cl.Event:
        produced.append(kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate]))
        return produced[-1]

    a = ExecutionPlan(ops=[produce], description="A")
    b = ExecutionPlan(ops=[lambda: cl.enqueue_marker(queue_b)], description="B")
    c = ExecutionPlan(
        ops=[lambda: seen.append(produced[0].command_execution_status)],
        description="C",
        after=[a, b],
    )
    sched = Scheduler(async_mode=True)
    for p in (a, b, c):
        sched.submit(p)
    release_later(gate, 0.2)
    sched.run()
    assert seen == [COMPLETE]
    assert _ordering(spans)["C"] == "host"
