"""Device time from real profiled OpenCL commands on the default device (PoCL on CPU, or a GPU:
where a test needs a kernel of some length, the ``busy`` fixture calibrates it to the device):
spans on the host clock, histograms, busy figure, and no host wait at hand-off.

Tolerance for "inside the host span": the calibration's own bound (``DeviceClock.tolerance_ns``,
a few microseconds on PoCL) plus 100 µs for drift between calibration and measurement."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import subprocess
import sys
import threading
import time
import timeit
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import device, log, profiling, telemetry

DRIFT_NS = 100_000
BUSY = """
__kernel void busy(__global float *a, const int n) {
    const int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < n; ++k) x = x * 0.999f + 1.0f;
    a[i] = x;
}
__kernel void scale(__global float *a, const float s) { a[get_global_id(0)] *= s; }
"""
T = telemetry.Scope("netcl.test", "0")
OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
_PROFILING_ON = cl.command_queue_properties.PROFILING_ENABLE


@pytest.fixture(scope="module")
def pq(ctx: cl.Context) -> cl.CommandQueue:
    return cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)


@pytest.fixture(scope="module")
def kernels(ctx: cl.Context) -> tuple[cl.Kernel, cl.Kernel, cl.Buffer]:
    prg = cl.Program(ctx, BUSY).build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)
    return cl.Kernel(prg, "busy"), cl.Kernel(prg, "scale"), buf


@pytest.fixture
def own(ctx: cl.Context) -> tuple[cl.CommandQueue, tuple[cl.Kernel, cl.Kernel, cl.Buffer]]:
    """A profiling queue and the kernels in a context of their own, for a test that fails a
    command: after that a driver may give up the whole context (OpenCL allows it), which must
    not be the session's."""
    own = cl.Context(devices=ctx.devices)
    prg = cl.Program(own, BUSY).build()
    buf = cl.Buffer(own, cl.mem_flags.READ_WRITE, 4 * 4096)
    return cl.CommandQueue(own, properties=_PROFILING_ON), (
        cl.Kernel(prg, "busy"),
        cl.Kernel(prg, "scale"),
        buf,
    )


@pytest.fixture
def collector() -> Iterator[profiling.Collector]:
    c = profiling.Collector()
    yield c
    c.flush(5.0)


def _busy(q: cl.CommandQueue, k: tuple[cl.Kernel, cl.Kernel, cl.Buffer], n: int) -> cl.Event:
    busy, _, buf = k
    busy.set_args(buf, np.int32(n))
    return cl.enqueue_nd_range_kernel(q, busy, (4096,), None)


def _scale(q: cl.CommandQueue, k: tuple[cl.Kernel, cl.Kernel, cl.Buffer]) -> cl.Event:
    _, scale, buf = k
    scale.set_args(buf, np.float32(1.0))
    return cl.enqueue_nd_range_kernel(q, scale, (4096,), None)


def _by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_profiled_kernels_are_device_spans_inside_the_host_span(
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector, spans: InMemorySpanExporter
) -> None:
    n = 8
    with T.span("netcl.test.step") as host:
        events = [_busy(pq, kernels, 400) for _ in range(n)]
        unit = collector.watch(profiling.REPLAY, events, labels=["busy"] * n, parent=host)
        pq.finish()
    assert collector.flush(10.0) == 0
    finished = spans.get_finished_spans()
    (step,) = _by_name(list(finished), "netcl.test.step")
    (envelope,) = _by_name(list(finished), "netcl.device.replay")
    device = _by_name(list(finished), "netcl.device.kernel")
    assert len(device) == n
    assert envelope.parent is not None and envelope.parent.span_id == step.context.span_id
    clock = collector.clock(pq.device)
    assert clock is not None and clock.tolerance_ns < 1_000_000, clock
    tol = clock.tolerance_ns + DRIFT_NS
    assert step.start_time is not None and step.end_time is not None
    for span in device:
        assert span.parent is not None and span.parent.span_id == envelope.context.span_id
        assert span.start_time is not None and span.end_time is not None
        assert span.end_time > span.start_time  # positive device duration
        assert step.start_time - tol <= span.start_time, (step.start_time, span.start_time)
        assert span.end_time <= step.end_time + tol, (span.end_time, step.end_time)
        assert span.attributes is not None and span.attributes["netcl.kernel.name"] == "busy"
    # in order on the device, and their sum within the replay's device duration
    starts = sorted((s.start_time or 0, s.end_time or 0) for s in device)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(starts))
    total = sum((s.end_time or 0) - (s.start_time or 0) for s in device)
    assert unit.duration is not None and total <= unit.duration * 1e9 + 1
    assert envelope.attributes is not None
    assert envelope.attributes["netcl.device.duration"] == unit.duration
    assert unit.duration * 1e9 <= (envelope.end_time or 0) - (envelope.start_time or 0) + 1
    assert [c.name for c in unit.commands] == ["busy"] * n


def test_kernel_histogram_carries_kernel_names(
    pq: cl.CommandQueue,
    kernels: Any,
    collector: profiling.Collector,
    metric_points: Callable[[str], list[Any]],
) -> None:
    def counts() -> dict[str, int]:
        return {
            p.attributes["netcl.kernel.name"]: p.count
            for p in metric_points("netcl.kernel.duration")
        }

    before = counts()
    events = [_busy(pq, kernels, 10), _scale(pq, kernels), _scale(pq, kernels)]
    collector.watch(profiling.COMMANDS, events, labels=["busy", "scale", "scale"])
    pq.finish()
    collector.flush()
    after = counts()
    assert after.get("busy", 0) - before.get("busy", 0) == 1
    assert after.get("scale", 0) - before.get("scale", 0) == 2
    # the buckets the dashboards' quantiles need: 1 µs to 10 s, not the SDK's default ones
    (bounds,) = {tuple(p.explicit_bounds) for p in metric_points("netcl.kernel.duration")}
    assert bounds[0] == 1e-6 and bounds[-1] == 10.0 and len(bounds) > 15


@pytest.mark.parametrize(
    ("kind", "metric", "attribute"),
    [
        (profiling.GRAPH_NODE, "netcl.graph.node.device_duration", "netcl.node.name"),
        (
            profiling.SCHEDULER_PLAN,
            "netcl.scheduler.plan.device_duration",
            "netcl.plan.description",
        ),
        (profiling.REPLAY, "netcl.capture.replay.device_duration", "netcl.capture.name"),
    ],
)
def test_each_kind_has_its_histogram(
    pq: cl.CommandQueue,
    kernels: Any,
    collector: profiling.Collector,
    metric_points: Callable[[str], list[Any]],
    kind: str,
    metric: str,
    attribute: str,
) -> None:
    name = f"unit-{kind}"
    unit = collector.watch(kind, [_scale(pq, kernels)], name=name)
    pq.finish()
    collector.flush()
    (point,) = [p for p in metric_points(metric) if p.attributes.get(attribute) == name]
    assert point.count == 1 and point.sum == pytest.approx(unit.duration)
    assert point.attributes["netcl.device.name"] == pq.device.name.strip()


def test_markers_give_the_device_time_between_them(
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector, spans: InMemorySpanExporter
) -> None:
    before = cl.enqueue_marker(pq)
    kernel = _busy(pq, kernels, 400)
    after = cl.enqueue_marker(pq)
    unit = collector.watch_markers(profiling.GRAPH_NODE, before, after, name="fc0")
    pq.finish()
    assert unit.poll() is not None
    own = kernel.profile.end - kernel.profile.start
    assert unit.duration is not None and unit.duration * 1e9 >= own
    assert unit.commands == ()  # no per-command spans for markers
    (node,) = _by_name(list(spans.get_finished_spans()), "netcl.device.node")
    assert node.attributes is not None and node.attributes["netcl.node.name"] == "fc0"


def test_hand_off_never_waits_for_the_device(
    pq: cl.CommandQueue, busy: Any, collector: profiling.Collector
) -> None:
    long = busy.enqueue(pq, 0.3)  # the checks below take well under that on any device
    pq.flush()
    t0 = time.perf_counter()
    unit = collector.watch(profiling.REPLAY, [long], labels=["busy"])
    left = collector.collect()
    polled = unit.poll()
    elapsed = time.perf_counter() - t0
    still_running = long.command_execution_status != cl.command_execution_status.COMPLETE
    pq.finish()
    assert still_running, "the kernel finished before the checks: make it longer"
    assert left == 1 and polled is None and not unit.done
    assert elapsed < 0.05, elapsed
    assert collector.flush() == 0 and unit.done and unit.duration and unit.duration > 0.01


def test_without_profiling_nothing_is_paid(
    queue: cl.CommandQueue,
    pq: cl.CommandQueue,
    kernels: Any,
    collector: profiling.Collector,
    spans: InMemorySpanExporter,
) -> None:
    assert not profiling.enabled(queue) and profiling.enabled(pq)
    n = 20_000
    per_check = min(timeit.repeat(lambda: profiling.enabled(queue), number=n, repeat=5)) / n
    assert per_check < 1e-6, f"enabled() costs {per_check * 1e9:.0f} ns"
    # events of a queue without profiling, watched anyway: dropped, no span, no error
    unit = collector.watch(profiling.REPLAY, [_scale(queue, kernels)], labels=["scale"])
    queue.finish()
    collector.flush()
    assert unit.done and unit.duration is None
    assert collector.stats().dropped == 1
    assert not [s for s in spans.get_finished_spans() if s.name.startswith("netcl.device.")]


def test_busy_is_the_share_of_the_window_with_commands(
    pq: cl.CommandQueue,
    kernels: Any,
    collector: profiling.Collector,
    metric_points: Callable[[str], list[Any]],
) -> None:
    t0 = time.time_ns()
    units = [collector.watch(profiling.COMMANDS, [_busy(pq, kernels, 2000)]) for _ in range(5)]
    pq.finish()
    collector.flush()
    now = time.time_ns()
    busy = collector.busy(now)[pq.device.name.strip()]
    ran = sum(u.duration or 0 for u in units)
    # the window (5 s) holds all of it: busy is what ran over the window
    assert now - t0 < 4e9
    assert busy == pytest.approx(ran / collector.busy_window, rel=1e-6)
    assert 0 < busy <= 1
    # the process-wide gauge reports through the SDK
    profiling.watch(profiling.COMMANDS, [_scale(pq, kernels)])
    pq.finish()
    profiling.flush()
    points = metric_points("netcl.device.busy")
    assert any(p.attributes["netcl.device.name"] == pq.device.name.strip() for p in points)


def test_clock_maps_device_time_onto_the_host_clock(
    pq: cl.CommandQueue, collector: profiling.Collector
) -> None:
    t0 = time.time_ns()
    marker = cl.enqueue_marker(pq)
    marker.wait()
    t1 = time.time_ns()
    unit = collector.watch(profiling.COMMANDS, [marker])
    collector.flush()
    clock = collector.clock(pq.device)
    assert clock is not None and unit.end_ns is not None
    tol = clock.tolerance_ns + DRIFT_NS
    assert t0 - tol <= unit.end_ns <= t1 + tol, (t0, unit.end_ns, t1, clock)


def test_the_collecting_thread_starts_with_the_first_unit_and_never_holds_up_exit(
    pq: cl.CommandQueue, collector: profiling.Collector
) -> None:
    """The first watched unit starts one thread, ``netcl-profiling``, a daemon: a program that
    watched device time still exits when its main thread ends."""
    assert collector._thread is None
    marker = cl.enqueue_marker(pq)
    collector.watch(profiling.COMMANDS, [marker])
    thread = collector._thread
    assert thread is not None and thread.name == "netcl-profiling" and thread.daemon
    collector.watch(profiling.COMMANDS, [cl.enqueue_marker(pq)])
    assert collector._thread is thread  # one thread for every unit
    collector.flush(5.0)


class _JumpingClock:
    """``time`` whose ``time_ns`` reads one second ahead for its first two readings (a host
    clock that jumps back during a calibration's first round); the rest as ``time``."""

    def __init__(self) -> None:
        self.readings = 0

    def time_ns(self) -> int:
        self.readings += 1
        return time.time_ns() + (1_000_000_000 if self.readings <= 2 else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_clock_that_jumps_during_calibration_maps_by_one_round(
    ctx: cl.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calibration rounds that cannot all be right (the host clock jumped back): the mapping of
    the narrowest single round, with its honest, non-zero tolerance, not an error."""
    dev = ctx.devices[0]
    steady = profiling._calibrate(ctx, dev)
    monkeypatch.setattr(profiling, "time", _JumpingClock())
    jumped = profiling._calibrate(ctx, dev, rounds=4)
    monkeypatch.undo()
    assert 1 <= jumped.tolerance_ns < 100_000_000  # one round's width, not the jump's
    slack = steady.tolerance_ns + jumped.tolerance_ns + 50_000_000
    assert (
        min(abs(jumped.offset_ns - steady.offset_ns - jump) for jump in (0, 1_000_000_000)) <= slack
    ), (steady, jumped)


def test_bad_input_is_refused(pq: cl.CommandQueue, collector: profiling.Collector) -> None:
    marker = cl.enqueue_marker(pq)
    with pytest.raises(ValueError, match=r"unknown kind 'replays'; expected one of \["):
        collector.watch("replays", [marker])
    with pytest.raises(ValueError, match="2 labels for 1 events"):
        collector.watch(profiling.REPLAY, [marker], labels=["a", "b"])
    with pytest.raises(ValueError, match="no events"):
        collector.watch(profiling.REPLAY, [])
    assert collector.stats().watched == 0
    pq.finish()


@pytest.fixture
def fresh_failure_log() -> Iterator[None]:
    """Each kind of failure is logged once per process (log.warn_once): start the test as a
    fresh process would (whatever ran before), and leave that record as it was after, so that
    tests of the log itself still see their first failures."""
    saved = set(log._warned)
    log._warned.clear()
    yield
    log._warned.clear()
    log._warned.update(saved)


def test_a_failing_sdk_changes_nothing(
    pq: cl.CommandQueue,
    kernels: Any,
    collector: profiling.Collector,
    fresh_failure_log: None,
    hostile_sdk: Callable[[], None],
) -> None:
    with T.span("netcl.test.hostile") as host:
        unit = collector.watch(
            profiling.REPLAY, [_scale(pq, kernels)], labels=["scale"], parent=host
        )
        pq.finish()
    assert collector.flush() == 0
    hostile_sdk()
    assert unit.done and unit.duration is not None and unit.duration > 0


def test_span_budget_keeps_metrics_and_drops_only_command_spans(
    pq: cl.CommandQueue,
    kernels: Any,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    """Past its CPU budget the collector still records every unit's envelope span and every
    metric point, but no per-command spans (a budget of 0: none at all)."""
    collector = profiling.Collector(span_budget=0.0)

    def scale_points() -> int:
        return sum(
            p.count
            for p in metric_points("netcl.kernel.duration")
            if p.attributes["netcl.kernel.name"] == "scale"
        )

    before = scale_points()
    for _ in range(3):
        collector.watch(profiling.REPLAY, [_scale(pq, kernels)], labels=["scale"])
    pq.finish()
    collector.flush()
    finished = list(spans.get_finished_spans())
    envelopes = _by_name(finished, "netcl.device.replay")
    assert len(envelopes) == 3 and not _by_name(finished, "netcl.device.kernel")
    assert all((e.attributes or {}).get("netcl.device.commands_skipped") == 1 for e in envelopes)
    assert scale_points() - before == 3
    assert collector.stats().spans_skipped == 3


# -- summary mode ------------------------------------------------------------------------------
def _kernel_points(metric_points: Callable[[str], list[Any]], name: str) -> int:
    return sum(
        p.count
        for p in metric_points("netcl.kernel.duration")
        if p.attributes["netcl.kernel.name"] == name
    )


def _replay_points(metric_points: Callable[[str], list[Any]], name: str) -> list[Any]:
    return [
        p
        for p in metric_points("netcl.capture.replay.device_duration")
        if p.attributes.get("netcl.capture.name") == name
    ]


def test_summary_mode_records_one_envelope_per_unit_and_no_command_detail(
    pq: cl.CommandQueue,
    kernels: Any,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    collector = profiling.Collector(mode="summary", sample_budget=0.0)
    before = _kernel_points(metric_points, "busy")
    n = 8
    with T.span("netcl.test.summary") as host:
        events = [_busy(pq, kernels, 400) for _ in range(n)]
        unit = collector.watch(
            profiling.REPLAY, events, labels=["busy"] * n, name="summary-unit", parent=host
        )
        pq.finish()
    assert collector.flush(10.0) == 0
    # the device time from the first command's start to the last one's end, on the host clock
    clock = collector.clock(pq.device)
    assert clock is not None and unit.start_ns is not None and unit.end_ns is not None
    assert unit.start_ns == events[0].profile.start + clock.offset_ns
    assert unit.end_ns == events[-1].profile.end + clock.offset_ns
    assert unit.duration == pytest.approx((unit.end_ns - unit.start_ns) / 1e9, abs=1e-9)
    own = sum(e.profile.end - e.profile.start for e in events) / 1e9
    assert own <= unit.duration * (1 + 1e-9)
    assert unit.commands == () and not unit.sampled
    finished = list(spans.get_finished_spans())
    (envelope,) = _by_name(finished, "netcl.device.replay")
    assert envelope.parent is not None and envelope.parent.span_id == host.context.span_id
    assert envelope.attributes is not None
    assert envelope.attributes["netcl.device.duration"] == unit.duration
    assert "netcl.device.sampled" not in envelope.attributes
    assert not _by_name(finished, "netcl.device.kernel")  # no per-command spans
    (point,) = _replay_points(metric_points, "summary-unit")
    assert point.count == 1 and point.sum == pytest.approx(unit.duration)
    assert _kernel_points(metric_points, "busy") == before  # no per-kernel histogram
    stats = collector.stats()
    assert stats.by_kind[profiling.REPLAY] == (1, unit.duration) and stats.by_kernel == {}
    assert stats.sampled == 0
    # the envelope counts as busy time
    busy = collector.busy()[pq.device.name.strip()]
    assert busy == pytest.approx(unit.duration / collector.busy_window, rel=1e-6)


def test_a_unit_says_whether_it_is_pending_or_its_duration(
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector
) -> None:
    gate = cl.UserEvent(pq.context)
    marker = cl.enqueue_marker(pq, wait_for=[gate])
    unit = collector.watch(profiling.REPLAY, [marker], name="step")
    assert repr(unit) == "DeviceTime('replay', 'step', pending)"
    t0 = time.monotonic()
    assert collector.flush(0.05) == 1  # waited its timeout for it, in vain
    assert time.monotonic() - t0 >= 0.05
    gate.set_status(cl.command_execution_status.COMPLETE)
    pq.finish()
    assert collector.flush(5.0) == 0 and unit.duration is not None
    assert repr(unit) == f"DeviceTime('replay', 'step', {unit.duration * 1e3:.3f} ms)"


def test_a_failed_command_drops_its_unit(own: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A unit whose command failed has no duration: it is dropped, with a warning, and nothing
    more is asked of the device (no clock calibrated: no queue made, no marker enqueued, no
    timestamp read in a context the driver may have given up after the failure)."""
    pq, kernels = own
    collector = profiling.Collector(mode="summary", sample_budget=0.0, interval=3600.0)
    gate = cl.UserEvent(pq.context)
    _, scale, buf = kernels
    scale.set_args(buf, np.float32(1.0))
    first = _scale(pq, kernels)
    failed = cl.enqueue_nd_range_kernel(pq, scale, (4096,), None, wait_for=[gate])
    gate.set_status(-5)  # the kernel waiting for it fails
    with contextlib.suppress(cl.Error):
        pq.finish()
    assert failed.command_execution_status < 0
    unit = collector.watch(profiling.REPLAY, [first, failed])
    assert collector.flush(5.0) == 0
    assert unit.done and unit.duration is None
    assert collector.stats().dropped == 1 and collector.stats().collected == 0
    assert collector.clock(pq.device) is None


def test_summary_mode_samples_units_in_per_command_detail(
    pq: cl.CommandQueue,
    kernels: Any,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    """A drawn unit is recorded as in per-command mode (its kernels' points, a span each) and its
    device span says it was sampled; with credit for every unit, every unit is drawn."""
    collector = profiling.Collector(mode="summary", sample_budget=1.0)
    time.sleep(0.06)  # credit fills up to 0.05 s of collection: far more than 3 units cost
    before = _kernel_points(metric_points, "scale")
    units = [
        collector.watch(
            profiling.REPLAY, [_scale(pq, kernels), _scale(pq, kernels)], labels=["scale", "scale"]
        )
        for _ in range(3)
    ]
    pq.finish()
    assert collector.flush(10.0) == 0
    assert all(u.sampled and len(u.commands) == 2 for u in units)
    assert _kernel_points(metric_points, "scale") - before == 6
    assert collector.stats().sampled == 3 and collector.stats().by_kernel["scale"][0] == 6
    finished = list(spans.get_finished_spans())
    envelopes = _by_name(finished, "netcl.device.replay")
    assert len(envelopes) == 3
    assert all((e.attributes or {}).get("netcl.device.sampled") is True for e in envelopes)
    assert len(_by_name(finished, "netcl.device.kernel")) == 6


@pytest.mark.usefixtures("slow_sdk")
def test_a_blocking_exporter_does_not_stop_the_draws(
    pq: cl.CommandQueue,
    kernels: Any,
    spans: InMemorySpanExporter,
) -> None:
    """A drawn unit is charged what collecting it cost in CPU time: an SDK that blocks in a
    span's end (a synchronous exporter, a slow network) or waits for the GIL on a loaded machine
    must not inflate the cost per command, or the next draws all but stop (a dashboard's kernel
    panels went empty that way)."""
    collector = profiling.Collector(mode="summary", sample_budget=1.0, interval=3600.0)
    time.sleep(0.06)
    unit = collector.watch(profiling.REPLAY, [_scale(pq, kernels)] * 8)
    pq.finish()
    assert unit.sampled and collector.flush(5.0) == 0
    assert len(_by_name(list(spans.get_finished_spans()), "netcl.device.kernel")) == 8
    # the SDK's CPU time, not its 9 blocking ends (20 ms each: ~5.6 ms a command after the update)
    assert collector._command_cost < 2e-3, collector._command_cost


def test_summary_sampling_is_charged_at_hand_off(pq: cl.CommandQueue, kernels: Any) -> None:
    """A burst of units cannot draw more detail than the credit there is: each drawn unit is
    charged its expected cost at once, so from a full credit (one second at twice 0.1% of a core:
    2 ms) at most 51 of a thousand units of 8 commands (~40 µs each) are drawn."""
    # no collection until the flush below: the cost per command stays the first guess
    collector = profiling.Collector(mode="summary", sample_budget=0.001, interval=3600.0)
    events = [_scale(pq, kernels) for _ in range(8)]
    pq.finish()
    t0 = time.monotonic()
    units = [collector.watch(profiling.COMMANDS, events) for _ in range(1000)]
    refilled = int((time.monotonic() - t0) / 0.02)  # a unit's worth every 20 ms
    drawn = sum(u.sampled for u in units)
    assert 50 <= drawn <= 51 + refilled, drawn
    assert sum(len(u._events) for u in units) == 8 * drawn + 2 * (1000 - drawn)
    assert collector.flush(10.0) == 0
    assert collector.stats().sampled == drawn
    # nothing is drawn without a budget
    none = profiling.Collector(mode="summary", sample_budget=0.0)
    time.sleep(0.01)
    assert not any(none.watch(profiling.COMMANDS, events).sampled for _ in range(100))
    none.flush()


def test_summary_draws_give_small_and_large_units_the_same_chance() -> None:
    """Where the budget covers a share of the units, a unit of 17 commands is drawn as often as
    one of a single command (per unit offered): a soak's scheduler plans of one copy once took
    every draw from its 17-kernel replays, and the kernel panels went dead after a minute."""
    collector = profiling.Collector(mode="summary", sample_budget=0.005, interval=3600.0)
    offered, drawn = {1: 0, 17: 0}, {1: 0, 17: 0}
    deadline = time.monotonic() + 2.5  # the chance is set every 0.25 s by collect()
    while time.monotonic() < deadline:
        for size in (1, 1, 1, 1, 17):
            offered[size] += 1
            drawn[size] += collector.detail(size)
        collector.collect()
        time.sleep(0.001)
    small, large = (drawn[n] / offered[n] for n in (1, 17))
    assert drawn[17] >= 20 and 0.5 < large / small < 2, (offered, drawn)
    # and about the budget was spent: the chance was set for it (a first guess of the cost)
    assert large < 0.5, (offered, drawn)


def test_a_unit_dearer_than_the_full_credit_is_still_drawn() -> None:
    """At the default budget the full credit (one second at twice 0.1% of a core: 2 ms) is less
    than collecting a unit of 2000 commands is expected to cost (~10 ms): such a unit is still
    drawn while the credit is not spent, and then spends it (the next one waits for the refill)."""
    collector = profiling.Collector(mode="summary", interval=3600.0)
    assert collector.detail(2000)
    assert not collector.detail(2000)  # the credit is spent: about 1 s to refill


def test_summary_mode_keeps_markers_and_single_commands(pq: cl.CommandQueue, kernels: Any) -> None:
    collector = profiling.Collector(mode="summary", sample_budget=0.0)
    before = cl.enqueue_marker(pq)
    kernel = _busy(pq, kernels, 400)
    after = cl.enqueue_marker(pq)
    node = collector.watch_markers(profiling.GRAPH_NODE, before, after, name="fc0")
    single = collector.watch(profiling.SCHEDULER_PLAN, [kernel], name="one")
    pq.finish()
    assert collector.flush(10.0) == 0
    own = kernel.profile.end - kernel.profile.start
    assert node.duration is not None and node.duration * 1e9 >= own
    assert single.duration == pytest.approx(own / 1e9)
    assert single.commands == ()
    # a device with marker units only is in the busy gauge (at 0: what runs between two markers
    # is not known to be the device's), so its dashboard panel reads 0, not "no data"
    markers = profiling.Collector(mode="summary", sample_budget=0.0)
    markers.watch_markers(profiling.GRAPH_NODE, cl.enqueue_marker(pq), cl.enqueue_marker(pq))
    pq.finish()
    assert markers.flush(10.0) == 0 and list(markers.busy().values()) == [0.0]


def test_mode_none_watches_nothing(
    pq: cl.CommandQueue, kernels: Any, spans: InMemorySpanExporter
) -> None:
    collector = profiling.Collector(mode="none")
    unit = collector.watch(profiling.REPLAY, [_scale(pq, kernels)], labels=["scale"])
    marked = collector.watch_markers(
        profiling.GRAPH_NODE, cl.enqueue_marker(pq), cl.enqueue_marker(pq)
    )
    pq.finish()
    assert unit.done and marked.done and unit.poll() is None and marked.duration is None
    assert collector.stats().watched == 0 and collector.flush() == 0
    assert not [s for s in spans.get_finished_spans() if s.name.startswith("netcl.device.")]
    with pytest.raises(ValueError, match="no events"):  # bad input is still refused
        collector.watch(profiling.REPLAY, [])
    # the process-wide collector's mode decides what enabled() answers
    process = profiling.collector()
    saved = process.mode
    try:
        process.mode = "none"
        assert not profiling.enabled(pq)
        process.mode = "summary"
        assert profiling.enabled(pq)
    finally:
        process.mode = saved


def test_a_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mode 'sumary'; expected one of commands, summary, none"):
        profiling.Collector(mode="sumary")  # type: ignore[arg-type]
    collector = profiling.Collector(mode="commands")
    with pytest.raises(ValueError, match="mode 'off'"):
        collector.mode = "off"  # type: ignore[assignment]
    assert collector.mode == "commands"


def test_the_kernel_metric_says_it_is_sampled(
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector, metric_reader: Any
) -> None:
    """The kernel histogram's description (read once a kernel was measured, here: the test
    does not rely on others before it) says how summary mode samples it."""
    collector.watch(profiling.COMMANDS, [_scale(pq, kernels)], labels=["scale"])
    assert collector.flush(10.0) == 0
    data = metric_reader.get_metrics_data()
    described = {
        m.name: m.description
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    text = described["netcl.kernel.duration"]
    assert "summary mode" in text and "sampled" in text and "0.1% of a core" in text, text


@pytest.mark.parametrize(
    ("value", "mode", "profiled"),
    [
        ("", "commands", False),
        ("0", "commands", False),
        ("1", "commands", True),
        ("commands", "commands", True),
        ("Summary", "summary", True),
        ("maybe", "commands", None),
    ],
)
def test_netcl_profile_sets_the_default_queue_and_the_mode(
    value: str, mode: str, profiled: bool | None
) -> None:
    """Watched or not; and the queue profiles its commands only in per-command mode (a
    summary's queue is plain, its units stamped on a side queue)."""
    script = (
        "from netcl.core import device, profiling\n"
        "print(profiling.collector().mode)\n"
        "try:\n"
        "    q = device.default_queue()\n"
        "    print(profiling.enabled(q), bool(q.properties & 2))\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "NETCL_PROFILE": value}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert out[0] == mode
    if profiled is None:
        assert out[1].startswith("NETCL_PROFILE='maybe': expected 1 to turn profiling on"), out
        assert "summary for one device time per replay" in out[1]
    else:
        assert out[1] == f"{profiled} {profiled and mode == 'commands'}"


def test_a_plain_queue_that_cannot_be_bracketed_is_left_unwatched_and_logged_once(
    ctx: cl.Context, kernels: Any, fresh_failure_log: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Summary mode stamps a plain queue's units on a side queue; an out-of-order queue's work
    has no last command to stamp after: not watched (as before: device time needs a profiling
    queue there), said once in the log however often it is asked."""
    try:
        ooo = cl.CommandQueue(ctx, properties=OOO)
    except cl.Error:
        pytest.skip("the device has no out-of-order queues")
    process = profiling.collector()
    saved = process.mode
    try:
        process.mode = "summary"
        with caplog.at_level("WARNING", logger="netcl.core.profiling"):
            assert device.watcher(ooo) is None and not profiling.enabled(ooo)
            assert device.watcher(ooo) is None
            plain = cl.CommandQueue(ctx)
            assert device.watcher(plain) is process and profiling.enabled(plain)
            assert device.watcher(plain, cl.CommandQueue(ctx)) is None  # one queue at a time
    finally:
        process.mode = saved
    (record,) = [r for r in caplog.records if r.getMessage().startswith("device_time_not_")]
    assert "out-of-order" in record.getMessage() and "profiling queue" in record.getMessage()
    assert not device.watcher(plain)  # per-command mode: a plain queue is not watched


def test_a_plain_queue_bracket_covers_its_work_and_only_its_work(
    ctx: cl.Context, pq: cl.CommandQueue, busy: Any
) -> None:
    """The stamps of ``begin`` and ``watch(begin=...)`` bracket exactly the work between them:
    a busy kernel inside counts in full, a longer one queued before the bracket does not (the
    kernel calibrated to milliseconds on the device, so that the stamps' own few microseconds
    do not count)."""
    loops = busy.loops(2e-3)
    timed = [busy.launch(pq, loops) for _ in range(3)]
    pq.finish()
    own = min(e.profile.end - e.profile.start for e in timed)
    process = profiling.collector()
    saved = process.mode
    try:
        process.mode = "summary"
        plain = cl.CommandQueue(ctx)
        assert profiling.enabled(plain)  # its side queue made
        busy.launch(plain, 10 * loops)  # queued ahead of the unit: not its work
        begin = process.begin(plain)
        assert begin is not None and process.begin(pq) is None  # a profiling queue: no stamp
        unit = process.watch(
            profiling.REPLAY, [busy.launch(plain, loops)], queue=plain, begin=begin
        )
        plain.finish()
        assert process.flush(10.0) == 0
    finally:
        process.mode = saved
    assert unit.duration is not None
    # a loaded CPU stretches a kernel (2.6x seen with the 2-core machine's cores busy), never
    # halves it; the one before would add 10x its length
    assert own / 2 <= unit.duration * 1e9 <= own * 5, (unit.duration, own)


def test_a_plain_queue_at_a_freed_out_of_order_queues_address_is_bracketed(
    ctx: cl.Context,
) -> None:
    """The side queues are found by the queue's pointer: a plain queue made where an
    out-of-order one (which cannot be bracketed) was freed is still bracketed (a full-suite
    order once found it unwatched)."""
    process = profiling.collector()
    saved = process.mode
    try:
        process.mode = "summary"
        for _ in range(50):
            ooo = cl.CommandQueue(ctx, properties=OOO)
            assert not profiling.enabled(ooo)
            address = ooo.int_ptr
            del ooo
            plain = cl.CommandQueue(ctx)
            if plain.int_ptr == address:
                assert profiling.enabled(plain)
                return
        pytest.skip("the driver never reused a freed queue's address")
    finally:
        process.mode = saved


def test_busy_is_exact_over_a_window_that_slides_past_a_command(
    pq: cl.CommandQueue, kernels: Any
) -> None:
    """``busy(now)``: the share of ``(now - busy_window, now]`` covered by collected commands,
    exactly, for a window that holds all of a command, part of it (either end cut), or none."""
    collector = profiling.Collector(mode="commands", busy_window=30.0)
    unit = collector.watch(profiling.COMMANDS, [_busy(pq, kernels, 2000)])
    pq.finish()
    assert collector.flush() == 0
    start, end = unit.start_ns, unit.end_ns
    assert start is not None and end is not None and end > start + 1
    name, window = pq.device.name.strip(), 30_000_000_000
    mid = (start + end) // 2
    assert collector.busy(end + 10) == {name: (end - start) / window}
    assert collector.busy(mid) == {name: (mid - start) / window}
    assert collector.busy(start) == {name: 0.0}
    assert collector.busy(window + mid) == {name: (end - mid) / window}
    assert collector.busy(window + end) == {name: 0.0}
    now = collector.busy()  # the window ending now: the command is still in it
    assert now == {name: pytest.approx((end - start) / window, rel=1e-9)}
    time.sleep(0.01)
    later = collector.watch(profiling.COMMANDS, [_busy(pq, kernels, 2000)])
    pq.finish()
    assert collector.flush() == 0
    assert later.start_ns is not None and later.start_ns > end + 1
    between = (end + later.start_ns) // 2  # after the first command, before the second
    assert collector.busy(between) == {name: (end - start) / window}


def test_flush_gives_up_after_5_s_by_default(ctx: cl.Context, pq: cl.CommandQueue) -> None:
    """``flush()`` without a timeout waits 5 s for work that does not complete, then returns
    how many units are still pending."""
    collector = profiling.Collector(mode="commands", interval=3600.0)
    gate = cl.UserEvent(ctx)
    collector.watch(profiling.COMMANDS, [cl.enqueue_marker(pq, wait_for=[gate])])
    t0 = time.monotonic()
    try:
        assert collector.flush() == 1
        waited = time.monotonic() - t0
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
        pq.finish()
    assert 5.0 <= waited < 5.8, waited
    assert collector.flush() == 0


def test_flush_returns_soon_after_the_work_completes(ctx: cl.Context, pq: cl.CommandQueue) -> None:
    """``flush(timeout)`` waits for pending device time only as long as the work takes (it
    looks every few milliseconds), and returns 0 once all is collected."""
    import threading

    collector = profiling.Collector(mode="commands", interval=3600.0)
    gate = cl.UserEvent(ctx)
    unit = collector.watch(profiling.COMMANDS, [cl.enqueue_marker(pq, wait_for=[gate])])
    timer = threading.Timer(0.05, gate.set_status, (cl.command_execution_status.COMPLETE,))
    t0 = time.monotonic()
    timer.start()
    try:
        assert collector.flush(5.0) == 0
        waited = time.monotonic() - t0
    finally:
        timer.join()
        pq.finish()
    assert unit.duration is not None
    assert 0.04 <= waited < 0.6, waited
    t0 = time.monotonic()
    assert collector.flush(5.0) == 0  # nothing pending: no wait at all
    assert time.monotonic() - t0 < 0.1


def test_a_markers_unit_goes_under_the_parent_given_with_its_attributes(
    pq: cl.CommandQueue, collector: profiling.Collector, spans: InMemorySpanExporter
) -> None:
    """``watch_markers(parent=...)`` puts the device span under that span, not the current
    one, with the caller's attributes; a markers unit is never drawn as a sample."""
    with T.span("netcl.test.step") as step:
        pass
    with T.span("netcl.test.other") as other:
        given = collector.watch_markers(
            profiling.COMMANDS,
            cl.enqueue_marker(pq),
            cl.enqueue_marker(pq),
            parent=step,
            queue=pq,
            attributes={"netcl.device.label": "given"},
        )
        current = collector.watch_markers(
            profiling.COMMANDS, cl.enqueue_marker(pq), cl.enqueue_marker(pq), name="current"
        )
    pq.finish()
    assert given.poll() is not None  # collected in this thread
    assert collector.flush() == 0
    assert given.attributes == {"netcl.device.label": "given"} and current.attributes is None
    assert not given.sampled and collector.stats().sampled == 0
    by_label = {
        (s.attributes or {})["netcl.device.label"]: s
        for s in _by_name(list(spans.get_finished_spans()), "netcl.device.commands")
    }
    assert set(by_label) == {"given", "current"}
    assert step.context is not None and other.context is not None
    for label, parent in (("given", step.context), ("current", other.context)):
        span = by_label[label]
        assert span.parent is not None and span.parent.span_id == parent.span_id, label
        assert "netcl.device.sampled" not in (span.attributes or {})


def test_a_markers_unit_in_mode_none_keeps_what_its_caller_gave(pq: cl.CommandQueue) -> None:
    """In mode ``none`` a markers unit is done at once with no duration, and keeps its kind,
    name, parent and attributes."""
    collector = profiling.Collector(mode="none")
    with T.span("netcl.test.step") as step:
        unit = collector.watch_markers(
            profiling.GRAPH_NODE,
            cl.enqueue_marker(pq),
            cl.enqueue_marker(pq),
            name="fc0",
            parent=step,
            attributes={"netcl.test": 1},
        )
        current = collector.watch_markers(
            profiling.GRAPH_NODE, cl.enqueue_marker(pq), cl.enqueue_marker(pq)
        )
    pq.finish()
    assert unit.done and unit.duration is None and unit.poll() is None
    assert (unit.kind, unit.name, unit.attributes, unit.labels) == (
        profiling.GRAPH_NODE,
        "fc0",
        {"netcl.test": 1},
        (),
    )
    assert unit.parent is step
    assert current.parent.context == step.context
    assert collector.stats().watched == 0


def test_a_bracketed_unit_ends_with_its_own_events_not_later_work(
    ctx: cl.Context, kernels: Any
) -> None:
    """On a plain queue in summary mode, ``watch(begin=...)`` stamps the unit's end once its
    own events complete: work enqueued after them (here held back) does not delay it."""
    process = profiling.collector()
    saved = process.mode
    gate = cl.UserEvent(ctx)
    plain = cl.CommandQueue(ctx)
    try:
        process.mode = "summary"
        assert profiling.enabled(plain)
        begin = process.begin(plain)
        own = _scale(plain, kernels)
        cl.enqueue_marker(plain, wait_for=[gate])  # later work, held until the test ends
        unit = process.watch(profiling.REPLAY, [own], queue=plain, begin=begin)
        own.wait()
        deadline = time.monotonic() + 5.0
        while unit.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert unit.duration is not None
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
        plain.finish()
        process.mode = saved
        process.flush(5.0)


def test_plain_queues_of_one_context_share_one_stamp_kernel(ctx: cl.Context) -> None:
    """A collector brackets each plain queue on a side queue of its own, with one stamp kernel
    per context (built once), and a side found again is the one made; its stamps complete."""
    collector = profiling.Collector(mode="summary", interval=3600.0)
    a, b = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    side_a, side_b = collector._bracket(a), collector._bracket(b)
    assert side_a is not None and side_b is not None
    assert side_a.kernel is side_b.kernel and side_a.queue is not side_b.queue
    assert collector._bracket(a) is side_a
    stamp = collector.begin(a)
    assert stamp is not None
    a.finish()
    stamp.wait()
    assert stamp.get_info(cl.event_info.COMMAND_QUEUE) == side_a.queue


def test_summary_default_queue_is_profiled_where_the_driver_refuses_the_stamp(
    ctx: cl.Context,
    kernels: Any,
    fresh_failure_log: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In summary mode, where the driver refuses the side queue's stamp, the default queue is a
    profiling one (device time still works), and the refusal is said once in the log."""
    fresh = cl.Context(devices=ctx.devices)  # a context no default queue was made for yet
    process = profiling.collector()
    saved = process.mode
    # a kernel of another context as the stamp: the driver refuses to enqueue it
    monkeypatch.setitem(process._stamp_kernels, fresh.int_ptr, kernels[0])
    monkeypatch.setenv("NETCL_PROFILE", "summary")
    sides = set(process._sides)
    try:
        process.mode = "summary"
        with caplog.at_level("WARNING", logger="netcl.core.profiling"):
            queue = device.default_queue(fresh)
    finally:
        process.mode = saved
        device._queues.pop((fresh.int_ptr, "summary"), None)
        for ptr in set(process._sides) - sides:  # a later queue at that address starts afresh
            process._sides.pop(ptr, None)
    assert queue.properties & cl.command_queue_properties.PROFILING_ENABLE
    (record,) = [r for r in caplog.records if r.getMessage().startswith("device_time_not_")]
    assert "the driver refused a side queue's stamp" in record.getMessage()


_COMPLETE = cl.command_execution_status.COMPLETE


def _completes_within(event: cl.Event, seconds: float) -> bool:
    """Whether ``event`` completes within ``seconds`` (polled: a stamp held by a user event
    never does, and waiting on it would hang)."""
    deadline = time.monotonic() + seconds
    while event.command_execution_status != _COMPLETE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_stamp_on_a_profiling_queue_is_a_marker_on_it(ctx: cl.Context) -> None:
    """On a profiling queue a stamp is a marker in the queue's own order."""
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    stamp = profiling.Collector(mode="summary", interval=3600.0).stamp(queue)
    assert stamp.get_info(cl.event_info.COMMAND_QUEUE) == queue
    assert stamp.command_type == cl.command_type.MARKER
    queue.finish()
    assert stamp.profile.end > 0


def test_a_plain_queues_stamp_waits_for_the_work_enqueued_before_it(ctx: cl.Context) -> None:
    """A stamp of a plain queue runs on its side queue once everything enqueued on the queue
    so far has completed (here held back by a user event), not before."""
    collector = profiling.Collector(mode="summary", interval=3600.0)
    plain = cl.CommandQueue(ctx)
    side = collector._bracket(plain)
    assert side is not None
    gate = cl.UserEvent(ctx)
    cl.enqueue_marker(plain, wait_for=[gate])  # earlier work, held
    try:
        stamp = collector.stamp(plain)
        assert stamp.get_info(cl.event_info.COMMAND_QUEUE) == side.queue
        assert not _completes_within(stamp, 1.0)
    finally:
        gate.set_status(_COMPLETE)
    assert _completes_within(stamp, 10.0)
    plain.finish()


def test_a_plain_queues_later_commands_wait_for_its_stamp(ctx: cl.Context) -> None:
    """Commands enqueued on a plain queue after its stamp wait for the stamp (here held back on
    the side queue): a busy device cannot run the stamp after them."""
    collector = profiling.Collector(mode="summary", interval=3600.0)
    plain = cl.CommandQueue(ctx)
    side = collector._bracket(plain)
    assert side is not None
    gate = cl.UserEvent(ctx)
    cl.enqueue_marker(side.queue, wait_for=[gate])  # the side queue, held
    try:
        stamp = collector.stamp(plain)
        later = cl.enqueue_marker(plain)
        assert not _completes_within(later, 1.0)
    finally:
        gate.set_status(_COMPLETE)
    assert _completes_within(stamp, 10.0) and _completes_within(later, 10.0)
    plain.finish()


def test_a_stamp_after_given_events_waits_for_them_only(ctx: cl.Context) -> None:
    """A stamp given ``after`` runs once those events complete, whatever else the queue still
    has to do, and holds none of the queue's later commands."""
    collector = profiling.Collector(mode="summary", interval=3600.0)
    plain = cl.CommandQueue(ctx)
    assert collector._bracket(plain) is not None
    busy, ready, pending = cl.UserEvent(ctx), cl.UserEvent(ctx), cl.UserEvent(ctx)
    ready.set_status(_COMPLETE)
    cl.enqueue_marker(plain, wait_for=[busy])  # the queue's own work, held throughout
    try:
        assert _completes_within(collector.stamp(plain, after=[ready]), 10.0)
        stamp = collector.stamp(plain, after=[pending])
        assert not _completes_within(stamp, 1.0)
        pending.set_status(_COMPLETE)
        assert _completes_within(stamp, 10.0)
    finally:
        pending.set_status(_COMPLETE) if pending.command_execution_status else None
        busy.set_status(_COMPLETE)
    plain.finish()


class _DriverGoneError(RuntimeError):
    """A collection failure of one kind (a type of its own: warned once per process)."""


class _QueueFreedError(RuntimeError):
    """A collection failure of another kind."""


class _FailingCollector(profiling.Collector):
    """A collector whose collection fails twice with one error, then with another, then parks
    its (daemon) thread for good."""

    def __init__(self) -> None:
        super().__init__(interval=0.01)
        self.calls = 0
        self.parked = threading.Event()

    def collect(self) -> int:
        self.calls += 1
        if self.calls <= 2:
            raise _DriverGoneError("driver went away")
        if self.calls == 3:
            raise _QueueFreedError("queue freed")
        self.parked.set()
        threading.Event().wait()  # never set: the thread stays here
        return 0


def test_a_failing_collection_is_logged_once_per_error_and_collection_goes_on(
    fresh_failure_log: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The collector thread survives a failing collection, keeps collecting every interval,
    and says so in the log once per kind of error, with the error."""
    failing = _FailingCollector()
    gone = threading.Event()  # the collector lives on: never set
    thread = threading.Thread(
        target=profiling._collecting, args=(weakref.ref(failing), gone), daemon=True
    )
    with caplog.at_level("WARNING", logger="netcl.core.profiling"):
        thread.start()
        assert failing.parked.wait(10.0)
    assert failing.calls == 4
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "netcl.core.profiling"
    ]
    assert said == [
        ("WARNING", "device_time_not_collected error=\"_DriverGoneError('driver went away')\""),
        ("WARNING", "device_time_not_collected error=\"_QueueFreedError('queue freed')\""),
    ]


@pytest.mark.parametrize("mode", ["summary", "commands"])
def test_a_failed_command_is_named_in_the_warning(
    mode: profiling.Mode,
    own: Any,
    fresh_failure_log: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warning for a unit dropped because a command failed says which: in summary mode
    the first or last command (all a summary reads), per command the index and its status."""
    pq, kernels = own
    collector = profiling.Collector(mode=mode, sample_budget=0.0, interval=3600.0)
    gate = cl.UserEvent(pq.context)
    first = _scale(pq, kernels)
    failed = cl.enqueue_nd_range_kernel(pq, kernels[1], (4096,), None, wait_for=[gate])
    gate.set_status(-5)  # the kernel waiting for it fails
    with contextlib.suppress(cl.Error):
        pq.finish()
    status = failed.command_execution_status
    with caplog.at_level("WARNING", logger="netcl.core.profiling"):
        unit = collector.watch(profiling.REPLAY, [first, failed])
        assert collector.flush(5.0) == 0
    assert unit.done and unit.duration is None
    why = (
        "the first or last command failed"
        if mode == "summary"
        else f"command 1 failed: status {status}"
    )
    said = [r.getMessage() for r in caplog.records if r.name == "netcl.core.profiling"]
    assert said == [f"device_time_not_collected error=\"_CommandFailedError('{why}')\""]


def test_busy_intervals_are_dropped_a_second_after_the_window_leaves_them(
    pq: cl.CommandQueue, kernels: Any
) -> None:
    """A command's interval is kept for ``busy_window`` plus one second, then dropped at the
    next collection: without a metric reader nothing else would drop them."""
    collector = profiling.Collector(mode="commands", busy_window=0.1)
    unit = collector.watch(profiling.COMMANDS, [_busy(pq, kernels, 200)])
    pq.finish()
    assert collector.flush() == 0
    assert unit.end_ns is not None
    name, later = pq.device.name.strip(), unit.end_ns + 10
    assert collector.busy(later)[name] > 0  # still held
    time.sleep(1.3)  # past the window and its second
    assert collector.busy(later) == {name: 0.0}  # dropped by busy()'s own collection


def test_a_collectors_thread_ends_when_the_collector_is_gone(pq: cl.CommandQueue) -> None:
    """Each collector that watched work runs a thread; dropping the collector ends it, even in
    the middle of an hour's interval (5 collectors dropped: none of their threads left)."""
    collectors = [profiling.Collector(mode="commands", interval=3600.0) for _ in range(5)]
    for collector in collectors:
        collector.watch(profiling.COMMANDS, [cl.enqueue_marker(pq)])
        assert collector.flush(5.0) == 0
    threads = [c._thread for c in collectors]
    assert all(t is not None and t.is_alive() for t in threads)
    del collectors, collector
    gc.collect()  # a pending unit and its collector hold each other
    for thread in threads:
        assert thread is not None
        thread.join(5.0)
    assert [t for t in threads if t is not None and t.is_alive()] == []


def test_plain_queues_follow_the_process_wide_collectors_mode_not_the_last_one_built(
    ctx: cl.Context,
) -> None:
    """``device.watcher`` on a plain queue follows the process-wide collector's mode: building
    another collector (with a mode of its own) changes nothing for everyone else."""
    plain = cl.CommandQueue(ctx)
    process = profiling.collector()
    saved = process.mode
    try:
        process.mode = "summary"
        profiling.Collector(mode="commands")
        assert device.watcher(plain) is process
        process.mode = "commands"
        profiling.Collector(mode="summary")
        assert device.watcher(plain) is None
    finally:
        process.mode = saved


def test_a_unit_holds_its_queue_from_the_hand_off(ctx: cl.Context) -> None:
    """Watched without ``queue=``, a unit asks its events for their queue at the hand-off and
    holds it until collected: OpenCL does not keep a queue alive for its events, so the
    collector's thread must never ask an event for a queue its program may have freed since."""
    queue = cl.CommandQueue(ctx, properties=_PROFILING_ON)
    collector = profiling.Collector(mode="commands", interval=3600.0)
    unit = collector.watch(profiling.COMMANDS, [cl.enqueue_marker(queue)])
    assert unit._queue is not None and unit._queue.int_ptr == queue.int_ptr
    queue.finish()
    del queue  # the program's last reference
    gc.collect()
    assert collector.flush(5.0) == 0 and unit.duration is not None


def test_a_lowered_recalibrate_applies_to_queues_seen_before(pq: cl.CommandQueue) -> None:
    """How old a clock calibration may get is judged when a unit is collected, by the current
    ``recalibrate``: lowered to 0, the next unit of a queue already seen calibrates anew (a full
    suite once kept a calibration 29 ms older than the replay it mapped)."""
    collector = profiling.Collector(mode="commands", interval=3600.0, recalibrate=60.0)
    collector.watch(profiling.COMMANDS, [cl.enqueue_marker(pq)], queue=pq)
    assert collector.flush(5.0) == 0
    first = collector.clock(pq.device)
    collector.recalibrate = 0.0
    t0 = time.time_ns()
    collector.watch(profiling.COMMANDS, [cl.enqueue_marker(pq)], queue=pq)
    assert collector.flush(5.0) == 0
    again = collector.clock(pq.device)
    assert first is not None and again is not None
    assert again.measured_ns >= t0 > first.measured_ns
