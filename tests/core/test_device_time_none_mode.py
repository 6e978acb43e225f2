"""What a collector does on its own: in mode ``none`` a watched unit records nothing, yet keeps
what its caller gave it (done at once, no duration, its name and attributes); device time
arrives without a flush (the collector's thread); units past ``max_pending`` are dropped and
counted once each."""

from __future__ import annotations

import time

import numpy as np
import pyopencl as cl

from netcl.core import profiling


def test_a_unit_watched_in_mode_none_keeps_its_name_and_attributes(ctx: cl.Context) -> None:
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
    event = cl.enqueue_fill_buffer(q, buf, np.uint8(0), 0, 64)
    collector = profiling.Collector()
    collector.mode = "none"
    unit = collector.watch(profiling.REPLAY, [event], name="step", attributes={"netcl.test": 1})
    q.finish()
    assert unit.done and unit.duration is None
    assert (unit.name, unit.attributes) == ("step", {"netcl.test": 1})
    assert collector.flush() == 0


def test_device_time_arrives_without_a_flush(ctx: cl.Context) -> None:
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
    collector = profiling.Collector(interval=0.01)
    unit = collector.watch(profiling.REPLAY, [cl.enqueue_fill_buffer(q, buf, np.uint8(0), 0, 64)])
    q.finish()
    deadline = time.monotonic() + 10
    while unit.duration is None and time.monotonic() < deadline:  # the collector's thread
        time.sleep(0.01)
    assert unit.duration is not None and unit.duration >= 0
    assert collector.stats().collected == 1


def test_units_past_max_pending_are_dropped_and_counted_once(ctx: cl.Context) -> None:
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
    gate = cl.UserEvent(ctx)  # holds the commands: nothing completes while the units pile up
    collector = profiling.Collector(max_pending=2)
    for _ in range(3):
        ev = cl.enqueue_fill_buffer(q, buf, np.uint8(0), 0, 64, wait_for=[gate])
        collector.watch(profiling.REPLAY, [ev])
    stats = collector.stats()
    assert (stats.watched, stats.dropped, stats.pending) == (3, 1, 2)
    gate.set_status(cl.command_execution_status.COMPLETE)
    q.finish()
    assert collector.flush() == 0
    assert collector.stats().dropped == 1
