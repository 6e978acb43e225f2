"""Failures reported to the right op and plan (found by the mutation run): a chain of plans held
back on the device behind a failed one, and a failed event returned after a list of events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

N = 4096


def test_every_plan_behind_a_failed_one_is_held_back_transitively(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    uint_buffer: Callable[..., cl.Buffer],
) -> None:
    # produce fails on the device (its user event fails after all plans were issued); consume
    # follows produce and again follows consume: both are held back, again only through consume.
    # (A fresh user event, not the gate fixture: PoCL aborts when a failed one is set again.)
    gate = cl.UserEvent(ctx)
    src, mid, dst = uint_buffer(N), uint_buffer(N, fill=3), uint_buffer(N, fill=4)
    produce = ExecutionPlan(description="produce", queue=queue)
    produce.ops.append(
        lambda: kernels.produce(queue, (N,), None, src, np.int32(10), wait_for=[gate])
    )
    consume = ExecutionPlan(description="consume", queue=queue_b, after=produce)
    consume.ops.append(lambda: kernels.consume(queue_b, (N,), None, src, mid))
    again = ExecutionPlan(description="again", queue=queue, after=consume)
    again.ops.append(lambda: kernels.consume(queue, (N,), None, mid, dst))
    unrelated = ExecutionPlan(description="unrelated", ops=[lambda: gate.set_status(-5)])
    sched = Scheduler(async_mode=True)
    for p in (produce, consume, again, unrelated):
        sched.submit(p)

    with pytest.raises(Scheduler.Error) as info:
        sched.run()

    err = info.value
    assert err.plan is produce and err.op_index == 0
    assert err.unrun_plans == [consume, again]
    assert "2 later plan(s) not run: plan 1 'consume', plan 2 'again'" in str(err)


def test_a_failed_event_after_an_op_that_returned_a_list_names_its_own_op(
    ctx: cl.Context,
) -> None:
    done = cl.UserEvent(ctx)
    done.set_status(cl.command_execution_status.COMPLETE)
    failed = cl.UserEvent(ctx)
    failed.set_status(-5)
    plan = ExecutionPlan(description="mixed", ops=[lambda: [done], lambda: failed])
    sched = Scheduler()
    sched.submit(plan)
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    err = info.value
    assert err.plan is plan and err.op_index == 1 and err.event is failed
