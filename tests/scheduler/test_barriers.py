"""The barriers that order plans on the device: kept alive until done (PoCL aborts the process
when a barrier is released before the failure of an event it waits for has reached it), and
dropped once done, so a scheduler that orders plans on the device run after run holds a bounded
number of them."""

from __future__ import annotations

from typing import Any

import pyopencl as cl
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.runtime.scheduler import ExecutionPlan, Scheduler
from netcl.runtime.scheduler._run import Barriers

COMPLETE = cl.command_execution_status.COMPLETE
LIMIT = 64  # Barriers prunes the done ones when it holds this many


def test_many_runs_ordered_on_the_device_keep_a_bounded_number_of_barriers(
    queue: cl.CommandQueue, queue_b: cl.CommandQueue, spans: InMemorySpanExporter
) -> None:
    """Run after run of a plan ordered on the device by a barrier: every run completes, and the
    scheduler keeps no more barriers alive than its limit, not one per run."""
    sched = Scheduler(async_mode=True)
    runs = 3 * LIMIT
    for _ in range(runs):
        first = ExecutionPlan([lambda: cl.enqueue_marker(queue)], "first", queue=queue)
        then = ExecutionPlan([lambda: cl.enqueue_marker(queue_b)], "then", queue_b, after=first)
        sched.submit(first)
        sched.submit(then)
        events = sched.run(wait=True)
        assert [e.command_execution_status for e in events] == [COMPLETE, COMPLETE]
    orderings = [
        s.attributes["netcl.plan.ordering"]
        for s in spans.get_finished_spans()
        if s.name == "netcl.scheduler.plan" and s.attributes is not None
    ]
    assert orderings == ["none", "device"] * runs
    held: list[Any] = sched._barriers._events
    assert 0 < len(held) <= LIMIT
    assert all(isinstance(b, cl.Event) for b in held)


def test_barriers_not_yet_done_are_kept_when_the_done_ones_are_dropped(
    ctx: cl.Context, gate: cl.UserEvent
) -> None:
    """Barriers still waiting (here on a closed gate) survive the pruning, in order; those done
    are let go."""
    waiting_queue = cl.CommandQueue(ctx)  # held back by the gate until teardown opens it
    done_queue = cl.CommandQueue(ctx)
    barriers = Barriers()
    pending = [cl.enqueue_barrier(waiting_queue, wait_for=[gate]) for _ in range(10)]
    for b in pending:
        barriers.hold(b)
    for _ in range(LIMIT - len(pending)):
        done = cl.enqueue_barrier(done_queue)
        done.wait()
        barriers.hold(done)
    assert len(barriers._events) == LIMIT  # not pruned before the list reaches the limit
    newest = cl.enqueue_barrier(waiting_queue, wait_for=[gate])
    barriers.hold(newest)
    assert all(b.command_execution_status > COMPLETE for b in pending)
    assert [id(b) for b in barriers._events] == [id(b) for b in [*pending, newest]]

    gate.set_status(COMPLETE)
    newest.wait()
    for _ in range(LIMIT - len(barriers._events)):  # up to the limit again: all of them done
        done = cl.enqueue_barrier(done_queue)
        done.wait()
        barriers.hold(done)
    last = cl.enqueue_barrier(done_queue)
    barriers.hold(last)
    assert [id(b) for b in barriers._events] == [id(last)]
