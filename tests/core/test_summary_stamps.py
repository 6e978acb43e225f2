"""Summary device time on a plain queue when its stamps are sampled (issue #61): which units are
stamped, that a stamped unit covers its own work, that the totals and the busy share estimated
from the stamped units and their weights are within their stated error, and that the device
spans of stamped units sit under their host spans. Real kernels on the default device, of a
length calibrated to it (``busy``), so the same properties are checked on PoCL and on a GPU.

The stated error (guide, Summary on a plain queue): a stamped unit stands for ``w = 1 / p`` units
(``p``: its chance of a stamp), so the estimate of a total is ``sum(w * d)`` over the stamped
units, unbiased, with a standard error of ``sqrt(sum((w * w - w) * d * d))`` (each unit drawn on
its own); the tests allow three of them."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import profiling, telemetry

T = telemetry.Scope("netcl.test", "0")
DRIFT_NS = 100_000  # calibration drift allowed between a device span and its host span
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE


def _summary(ctx: cl.Context, **options: Any) -> tuple[profiling.Collector, cl.CommandQueue]:
    """A collector of its own in summary mode (collecting on demand) and a plain queue that it
    stamps on a side queue."""
    collector = profiling.Collector(mode="summary", interval=3600.0, **options)
    queue = cl.CommandQueue(ctx)
    assert collector._bracket(queue) is not None  # its side queue made (enabled() does this)
    return collector, queue


def _own(busy: Any, ctx: cl.Context, loops: int) -> int:
    """The device time (ns) of a busy kernel of ``loops`` loops: the fastest of three on a
    profiling queue."""
    pq = cl.CommandQueue(ctx, properties=_PROFILING)
    timed = [busy.launch(pq, loops) for _ in range(3)]
    pq.finish()
    return min(e.profile.end - e.profile.start for e in timed)


def _unit(
    collector: profiling.Collector, queue: cl.CommandQueue, busy: Any, loops: int
) -> profiling.DeviceTime:
    """One unit of one busy kernel, handed over as a replay is: begin(), the work, watch()."""
    begin = collector.begin(queue)
    assert begin is not None  # a plain queue watched in summary mode: a stamp or not, never None
    event = busy.launch(queue, loops)
    return collector.watch(profiling.REPLAY, [event], queue=queue, begin=begin)


def test_a_queues_first_unit_and_one_after_an_idle_while_are_stamped(
    ctx: cl.Context, busy: Any
) -> None:
    """With no budget for stamps, a queue's first unit and the first after 10 ms without one
    are still stamped (at a low rate every unit is) and cover their kernel; units back to back
    are not: done at the hand-off without a duration, nothing handed to the collector."""
    collector, queue = _summary(ctx, stamp_budget=0.0)
    loops = busy.loops(1e-3)
    own = _own(busy, ctx, loops)
    first = _unit(collector, queue, busy, loops)
    rest = [_unit(collector, queue, busy, 1) for _ in range(20)]  # back to back: no stamp
    queue.finish()
    time.sleep(0.02)
    again = _unit(collector, queue, busy, loops)
    queue.finish()
    assert collector.flush(10.0) == 0
    for unit in (first, again):
        assert unit.duration is not None and unit.weight == 1.0
        # stamped on the wrong side of the kernel, ~0; a loaded CPU stretches it, never halves it
        assert unit.duration * 1e9 >= own / 2, (unit.duration, own)
    assert all(u.done and u.duration is None for u in rest)
    stats = collector.stats()
    assert stats.watched == 2 and stats.by_kind[profiling.REPLAY][0] == 2


def test_every_unit_is_stamped_where_the_budget_allows(ctx: cl.Context, busy: Any) -> None:
    """With a budget no cost exceeds, units back to back are all stamped, each of weight 1."""
    collector, queue = _summary(ctx, stamp_budget=math.inf)
    units = [_unit(collector, queue, busy, 1) for _ in range(20)]
    queue.finish()
    assert collector.flush(10.0) == 0
    assert all(u.duration is not None and u.weight == 1.0 for u in units)
    assert collector.stats().by_kind[profiling.REPLAY][0] == 20


def test_sampled_stamps_estimate_totals_and_busy_share_within_their_stated_error(
    ctx: cl.Context, busy: Any
) -> None:
    """Units of two known lengths, each waited for (the loop of a service), with a budget that
    stamps some of them: every stamped unit covers its kernel; the count and the device seconds
    estimated from the stamped ones and their weights are within three stated standard errors
    of the truth (the units enqueued; the stamped units' mean length of each kind times the
    units of that kind); the busy share is those seconds over its window."""
    collector, queue = _summary(ctx, stamp_budget=0.01, busy_window=600.0)
    lengths = busy.loops(0.25e-3), busy.loops(0.75e-3)  # kernels of about 0.5 and 1.5 ms
    own = [_own(busy, ctx, loops) for loops in lengths]
    units = []
    for i in range(300):
        units.append(_unit(collector, queue, busy, lengths[i % 2]))
        queue.finish()
    assert collector.flush(10.0) == 0
    stamped = [(i % 2, u) for i, u in enumerate(units) if u.duration is not None]
    assert 5 <= len(stamped) <= 295, f"{len(stamped)} of 300 stamped: sampling not exercised"
    for kind, unit in stamped:  # exact, each: it covers its own kernel
        assert unit.duration is not None and unit.duration * 1e9 >= own[kind] / 2
    weights = [u.weight for _, u in stamped]
    seconds = [u.duration or 0.0 for _, u in stamped]
    means = [statistics.mean(u.duration or 0.0 for k, u in stamped if k == kind) for kind in (0, 1)]
    count, total = collector.stats().by_kind[profiling.REPLAY]
    assert total == sum(w * d for w, d in zip(weights, seconds, strict=True))
    count_error = math.sqrt(sum(w * w - w for w in weights))
    assert abs(count - 300) <= 3 * count_error + 1, (count, count_error)
    truth = 150 * (means[0] + means[1])
    error = math.sqrt(sum((w * w - w) * d * d for w, d in zip(weights, seconds, strict=True)))
    assert abs(total - truth) <= 3 * error + 0.05 * truth, (total, truth, error)
    (share,) = collector.busy().values()
    # the window holds every unit: the share times the window is the estimated seconds
    assert share * collector.busy_window == pytest.approx(total, rel=1e-6)


def test_stamped_units_device_spans_sit_under_their_host_spans(
    ctx: cl.Context, busy: Any, spans: InMemorySpanExporter
) -> None:
    """A stamped unit's device span is a child of the host span current at the hand-off and lies
    inside it (within the clock's tolerance); a unit not stamped has none."""
    collector, queue = _summary(ctx, stamp_budget=0.01)
    loops = busy.loops(0.25e-3)
    units = []
    for _ in range(60):
        with T.span("netcl.test.step"):
            units.append(_unit(collector, queue, busy, loops))
            queue.finish()
            assert collector.flush(10.0) == 0
    finished = spans.get_finished_spans()
    hosts = {s.context.span_id: s for s in finished if s.name == "netcl.test.step"}
    device = [s for s in finished if s.name == "netcl.device.replay"]
    assert len(device) == sum(u.duration is not None for u in units) < len(units)
    clock = collector.clock(queue.device)
    assert clock is not None
    tol = clock.tolerance_ns + DRIFT_NS
    for span in device:
        assert span.parent is not None and span.parent.span_id in hosts
        host = hosts[span.parent.span_id]
        assert host.start_time is not None and host.end_time is not None
        assert span.start_time is not None and span.end_time is not None
        assert host.start_time - tol <= span.start_time <= span.end_time <= host.end_time + tol
