"""In mode ``none`` a watched unit records nothing, yet keeps what its caller gave it: it is done
at once, has no duration, and carries its name and attributes (callers read them back)."""

from __future__ import annotations

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
