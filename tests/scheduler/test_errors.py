"""A failed run: an op that raises, a bad return value, a failed event; unrun plans carried."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

COMPLETE = cl.command_execution_status.COMPLETE
N = 1024


def boom() -> None:
    raise ValueError("bad input shape")


@pytest.mark.parametrize("async_mode", [False, True])
def test_op_that_raises_stops_the_run_and_carries_unrun_plans(
    async_mode: bool, queue: cl.CommandQueue, kernels: object
) -> None:
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, N * 4)
    calls: list[str] = []
    sched = Scheduler(async_mode=async_mode)
    first = sched.submit(
        lambda: kernels.scale(queue, (N,), None, buf, np.float32(1)),
        plan=ExecutionPlan(description="h2d copy"),
    )
    failing = ExecutionPlan(description="compute")
    sched.submit(lambda: calls.append("compute 0"), plan=failing)
    sched.submit(boom, plan=failing)
    sched.submit(lambda: calls.append("compute 2"), plan=failing)
    later_a = sched.submit(lambda: calls.append("d2h"), plan=ExecutionPlan(description="d2h"))
    later_b = sched.submit(lambda: calls.append("unlabelled"))

    with pytest.raises(Scheduler.Error) as info:
        sched.run()

    err = info.value
    assert isinstance(err, RuntimeError)
    assert calls == ["compute 0"]  # stopped at the failing op: nothing after it ran
    assert err.plan is failing and err.plan_index == 1
    assert err.op is boom and err.op_index == 1
    assert err.event is None
    assert err.unrun_plans == [later_a, later_b]
    assert err.unrun_plans[0] is later_a and err.unrun_plans[1] is later_b
    assert isinstance(err.__cause__, ValueError)
    assert len(err.events) == 1 and err.events[0] is not None  # the first plan's kernel
    msg = str(err)
    assert "op 1 (boom (test_errors.py:" in msg
    assert "of plan 1 'compute'" in msg
    assert "raised ValueError: bad input shape" in msg
    assert "2 later plan(s) not run: plan 2 'd2h', plan 3 (no description)" in msg
    assert first.ops and sched.plans == ()  # the scheduler is empty and reusable

    # the carried plans can be resubmitted and run
    for p in err.unrun_plans:
        sched.submit(p)
    sched.run()
    assert calls == ["compute 0", "d2h", "unlabelled"]
    cl.wait_for_events(err.events)


def test_error_in_the_last_plan_says_nothing_was_left() -> None:
    sched = Scheduler()
    sched.submit(print)
    sched.submit(boom, plan=ExecutionPlan(description="last"))
    with pytest.raises(Scheduler.Error, match=r"plan 1 'last' raised .*; no plan was left unrun"):
        sched.run()


def test_many_unrun_plans_are_summarised() -> None:
    sched = Scheduler()
    sched.submit(boom)
    for _ in range(8):
        sched.submit(print)
    with pytest.raises(Scheduler.Error, match=r"8 later plan\(s\) not run: plan 1 .*\(3 more\)"):
        sched.run()


@pytest.mark.parametrize(
    ("result", "shown"), [(42, r"42 \(int\)"), ([1], r"\[1\] \(list\)"), ("ev", r"'ev' \(str\)")]
)
def test_op_returning_a_non_event_is_an_error(result: object, shown: str) -> None:
    sched = Scheduler()
    plan = sched.submit(lambda: result, plan=ExecutionPlan(description="bad return"))
    with pytest.raises(Scheduler.Error, match=rf"plan 0 'bad return' returned {shown}; ") as info:
        sched.run()
    assert info.value.plan is plan and info.value.op is plan.ops[0]


def test_an_op_put_in_plan_ops_by_hand_is_checked_at_run() -> None:
    plan = ExecutionPlan(ops=[print, 7], description="hand made")  # type: ignore[list-item]
    sched = Scheduler()
    sched.submit(plan)
    with pytest.raises(
        Scheduler.Error,
        match=r"op 1 \(7\) of plan 0 'hand made' is neither callable nor an event-like object",
    ) as info:
        sched.run()
    assert info.value.op == 7 and info.value.op_index == 1


def test_a_failed_event_submitted_directly(ctx: cl.Context) -> None:
    failed = cl.UserEvent(ctx)
    failed.set_status(-5)
    calls: list[str] = []
    sched = Scheduler()
    plan = sched.submit(failed, plan=ExecutionPlan(description="upload"))
    after = sched.submit(lambda: calls.append("after"))
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    err = info.value
    assert err.plan is plan and err.event is failed and err.op is failed
    assert err.unrun_plans == [after] and calls == []
    msg = str(err)
    assert "op 0 (pyopencl.UserEvent(USER)) of plan 0 'upload'" in msg
    assert "(an event submitted as op) failed (command status -5)" in msg


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_kernel_whose_event_fails(
    async_mode: bool,
    ctx: cl.Context,
    queue: cl.CommandQueue,
    kernels: object,
    release_later: Callable[..., object],
) -> None:
    # A real command that fails: a kernel waiting on a user event that is set to an error.
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, N * 4)
    upstream = cl.UserEvent(ctx)
    launched: list[cl.Event] = []

    def launch() -> cl.Event:
        launched.append(kernels.scale(queue, (N,), None, buf, np.float32(2), wait_for=[upstream]))
        return launched[-1]

    calls: list[str] = []
    sched = Scheduler(async_mode=async_mode)
    plan = sched.submit(launch, plan=ExecutionPlan(description="compute"))
    last = sched.submit(lambda: calls.append("next"), plan=ExecutionPlan(description="next"))
    release_later(upstream, 0.1, -1)

    with pytest.raises(Scheduler.Error) as info:
        sched.run()

    err = info.value
    assert err.plan is plan and err.op is launch and err.event is launched[0]
    assert launched[0].command_execution_status < 0
    assert "op 0 (test_a_kernel_whose_event_fails.<locals>.launch" in str(err)
    assert "returned an event (pyopencl.Event(NDRANGE_KERNEL)) that failed" in str(err)
    if async_mode:  # every plan was issued before the single wait
        assert calls == ["next"] and err.unrun_plans == []
    else:
        assert calls == [] and err.unrun_plans == [last]


def test_a_failed_event_is_found_among_good_ones(ctx: cl.Context, queue: cl.CommandQueue) -> None:
    good = [cl.enqueue_marker(queue) for _ in range(3)]
    bad = cl.UserEvent(ctx)
    bad.set_status(-2)
    sched = Scheduler(async_mode=True)
    sched.submit(lambda: good[0])
    sched.submit(lambda: [good[1], bad, good[2]], plan=ExecutionPlan(description="mixed"))
    with pytest.raises(Scheduler.Error, match=r"of plan 1 'mixed' returned an event") as info:
        sched.run()
    assert info.value.event is bad and info.value.plan_index == 1


class HostEvent:
    """An event-like object that is not an OpenCL event: a host task with wait()."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.waited = False

    def wait(self) -> None:
        self.waited = True
        if self.fail:
            raise OSError("host transfer failed")


def test_event_like_objects_are_waited_and_their_errors_named(queue: cl.CommandQueue) -> None:
    ok, bad = HostEvent(False), HostEvent(True)
    sched = Scheduler()
    sched.submit(ok)
    sched.submit(cl.enqueue_marker(queue))
    assert sched.run() and ok.waited
    sched.submit(bad, plan=ExecutionPlan(description="host io"))
    with pytest.raises(
        Scheduler.Error,
        match=r"of plan 0 'host io' \(an event submitted as op\) failed: wait\(\) "
        r"raised OSError: host transfer failed",
    ) as info:
        sched.run()
    assert isinstance(info.value.__cause__, OSError)


def test_mixed_host_and_opencl_events(ctx: cl.Context, queue: cl.CommandQueue) -> None:
    host = HostEvent(False)
    marker = cl.enqueue_marker(queue)
    failed = cl.UserEvent(ctx)
    failed.set_status(-3)
    sched = Scheduler()
    sched.submit(lambda: [host, marker], plan=ExecutionPlan(description="mixed ok"))
    assert sched.run() == [host, marker] and host.waited

    sched.submit(lambda: (HostEvent(False), failed), plan=ExecutionPlan(description="mixed bad"))
    with pytest.raises(Scheduler.Error, match=r"plan 0 'mixed bad' returned an event") as info:
        sched.run()
    assert info.value.event is failed


def test_events_of_two_contexts_are_waited_each(ctx: cl.Context, queue: cl.CommandQueue) -> None:
    # Some drivers (PoCL) refuse clWaitForEvents on events of different contexts, others
    # (NVIDIA) accept them: either way the scheduler waits them all, and a refused batch is not
    # mistaken for a failed event.
    other_ctx = cl.Context(ctx.devices)
    other_queue = cl.CommandQueue(other_ctx)
    events = [cl.enqueue_marker(queue), cl.enqueue_marker(other_queue)]
    sched = Scheduler()
    sched.submit(lambda: events)
    assert sched.run() == events
    assert all(e.command_execution_status == COMPLETE for e in events)
