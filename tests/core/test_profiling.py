"""Device time from real profiled OpenCL commands on the default device (PoCL on CPU): spans on the
host clock, histograms, busy figure, and no host wait at hand-off.

Tolerance for "inside the host span": the calibration's own bound (``DeviceClock.tolerance_ns``,
a few microseconds on PoCL) plus 100 µs for drift between calibration and measurement."""

from __future__ import annotations

import itertools
import time
import timeit
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import log, profiling, telemetry

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


@pytest.fixture(scope="module")
def pq(ctx: cl.Context) -> cl.CommandQueue:
    return cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)


@pytest.fixture(scope="module")
def kernels(ctx: cl.Context) -> tuple[cl.Kernel, cl.Kernel, cl.Buffer]:
    prg = cl.Program(ctx, BUSY).build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)
    return cl.Kernel(prg, "busy"), cl.Kernel(prg, "scale"), buf


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
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector,
    metric_points: Callable[[str], list[Any]],
) -> None:  # fmt: skip
    def counts() -> dict[str, int]:
        return {p.attributes["netcl.kernel.name"]: p.count
                for p in metric_points("netcl.kernel.duration")}  # fmt: skip

    before = counts()
    events = [_busy(pq, kernels, 10), _scale(pq, kernels), _scale(pq, kernels)]
    collector.watch(profiling.COMMANDS, events, labels=["busy", "scale", "scale"])
    pq.finish()
    collector.flush()
    after = counts()
    assert after.get("busy", 0) - before.get("busy", 0) == 1
    assert after.get("scale", 0) - before.get("scale", 0) == 2


@pytest.mark.parametrize(
    ("kind", "metric", "attribute"),
    [
        (profiling.GRAPH_NODE, "netcl.graph.node.device_duration", "netcl.node.name"),
        (profiling.SCHEDULER_PLAN, "netcl.scheduler.plan.device_duration",
         "netcl.plan.description"),
        (profiling.REPLAY, "netcl.capture.replay.device_duration", "netcl.capture.name"),
    ],
)  # fmt: skip
def test_each_kind_has_its_histogram(
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector,
    metric_points: Callable[[str], list[Any]], kind: str, metric: str, attribute: str,
) -> None:  # fmt: skip
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
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector
) -> None:
    long = _busy(pq, kernels, 200_000)  # hundreds of milliseconds on a CPU device
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
    queue: cl.CommandQueue, pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector,
    spans: InMemorySpanExporter,
) -> None:  # fmt: skip
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
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector,
    metric_points: Callable[[str], list[Any]],
) -> None:  # fmt: skip
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
    """Each kind of SDK failure is logged once per process (log.warn_once): leave that record
    as it was, so that tests of the log itself still see their first failures."""
    saved = set(log._warned)
    yield
    log._warned.clear()
    log._warned.update(saved)


def test_a_failing_sdk_changes_nothing(
    pq: cl.CommandQueue, kernels: Any, collector: profiling.Collector,
    fresh_failure_log: None, hostile_sdk: Callable[[], None],
) -> None:  # fmt: skip
    with T.span("netcl.test.hostile") as host:
        unit = collector.watch(profiling.REPLAY, [_scale(pq, kernels)], labels=["scale"],
                               parent=host)  # fmt: skip
        pq.finish()
    assert collector.flush() == 0
    hostile_sdk()
    assert unit.done and unit.duration is not None and unit.duration > 0


def test_span_budget_keeps_metrics_and_drops_only_command_spans(
    pq: cl.CommandQueue, kernels: Any, spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:  # fmt: skip
    """Past its CPU budget the collector still records every unit's envelope span and every
    metric point, but no per-command spans (a budget of 0: none at all)."""
    collector = profiling.Collector(span_budget=0.0)

    def scale_points() -> int:
        return sum(p.count for p in metric_points("netcl.kernel.duration")
                   if p.attributes["netcl.kernel.name"] == "scale")  # fmt: skip

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
