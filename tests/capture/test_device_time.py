"""Device time of replays on profiling queues (real kernels on the default device): every
replayed command's event goes to the device-time collector (no host wait), so a replay of N
kernels yields N device spans under the replay's span, ``netcl.kernel.duration`` by kernel name
and ``netcl.capture.replay.device_duration``; a replay on a plain queue watches nothing.

What "inside the replay's host span" means: ``netcl.capture.replay`` ends when the commands are
enqueued, before the device has run them, so its device spans start after it starts (within the
clock mapping's tolerance) but may end after it. The test's own span around the replay and the
``finish`` that waits for it must contain them at both ends. Tolerance: the calibration's stated
bound (``DeviceClock.tolerance_ns``) plus 100 µs of drift, as in netcl-core's tests."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import profiling, telemetry
from netcl.runtime.capture import KernelCapture

from .conftest import Kernels

DRIFT_NS = 100_000
N = 6
SIZE = 1 << 14
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE
T = telemetry.Scope("netcl.test", "0")


@pytest.fixture(scope="module")
def pq(ctx: cl.Context) -> cl.CommandQueue:
    return cl.CommandQueue(ctx, properties=_PROFILING)


@pytest.fixture(autouse=True)
def _fresh_clock() -> Iterator[None]:
    """Each unit calibrates its clock anew. PoCL's device clock is CLOCK_MONOTONIC_RAW, which NTP
    does not slew, and ``time.time_ns()`` is: a calibration 10 s old was 0.74 ms off on a freshly
    booted CI machine. These tests are about where spans sit, not about the host's NTP."""
    collector = profiling.collector()
    saved, collector.recalibrate = collector.recalibrate, 0.0
    try:
        yield
    finally:
        collector.recalibrate = saved


class _Chain:
    """A capture of ``N`` launches (axpy and add alternating) and a copy to the host."""

    def __init__(self, queue: cl.CommandQueue, k: Kernels) -> None:
        ctx = queue.context
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        self.x = np.linspace(0, 1, SIZE, dtype=np.float32)
        self.y = cl.Buffer(ctx, flags, hostbuf=np.zeros(SIZE, np.float32))
        self.xb = cl.Buffer(ctx, flags, hostbuf=self.x)
        self.y2 = cl.Buffer(ctx, flags, hostbuf=np.zeros(SIZE, np.float32))
        self.host = np.empty(SIZE, np.float32)
        self.cap = KernelCapture()
        with self.cap:
            for i in range(N):
                if i % 2:
                    k.add(queue, (SIZE,), None, self.y, self.y, self.xb)  # y = y + x
                else:
                    k.axpy(queue, (SIZE,), None, self.y, self.xb, np.float32(2.0))  # y += 2x
            cl.enqueue_copy(queue, self.host, self.y, is_blocking=False)
        queue.finish()

    def expect(self, runs: int) -> np.ndarray[Any, Any]:
        return (runs * N // 2 * 3 * self.x).astype(np.float32)


def _named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _replays() -> tuple[int, float]:
    return profiling.collector().stats().by_kind.get(profiling.REPLAY, (0, 0.0))


def test_a_profiled_replay_yields_a_device_span_per_command(
    pq: cl.CommandQueue,
    kernels: Kernels,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    chain = _Chain(pq, kernels)
    profiling.flush(5.0)
    spans.clear()

    def kernel_counts() -> dict[str, int]:
        return {
            p.attributes["netcl.kernel.name"]: p.count
            for p in metric_points("netcl.kernel.duration")
        }

    def replay_count() -> int:
        return sum(p.count for p in metric_points("netcl.capture.replay.device_duration"))

    kernels_before, replays_before = kernel_counts(), replay_count()
    with T.span("netcl.test.step"):
        chain.cap.replay()
        pq.finish()
    assert profiling.flush(10.0) == 0
    np.testing.assert_allclose(chain.host, chain.expect(2), rtol=1e-5)

    finished = list(spans.get_finished_spans())
    (step,) = _named(finished, "netcl.test.step")
    (host,) = _named(finished, "netcl.capture.replay")
    (envelope,) = _named(finished, "netcl.device.replay")
    device = _named(finished, "netcl.device.kernel")
    (copy,) = _named(finished, "netcl.device.transfer")
    assert len(device) == N
    assert host.parent is not None and host.parent.span_id == step.context.span_id
    assert envelope.parent is not None and envelope.parent.span_id == host.context.span_id
    clock = profiling.collector().clock(pq.device)
    assert clock is not None
    tol = clock.tolerance_ns + DRIFT_NS
    assert host.start_time is not None and step.end_time is not None
    for span in [*device, copy]:
        assert span.parent is not None and span.parent.span_id == envelope.context.span_id
        assert span.start_time is not None and span.end_time is not None
        assert span.end_time > span.start_time or span is copy  # a kernel takes device time
        assert span.start_time >= host.start_time - tol  # after the replay began
        assert step.start_time is not None and span.start_time >= step.start_time - tol
        assert span.end_time <= step.end_time + tol  # before the wait for it ended
    names = [s.attributes["netcl.kernel.name"] for s in sorted(device, key=lambda s: s.start_time)]
    assert names == ["axpy", "add"] * (N // 2)
    # in order on the device, so their sum is within the replay's device duration
    intervals = sorted((s.start_time or 0, s.end_time or 0) for s in [*device, copy])
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(intervals))
    total = sum(e - s for s, e in intervals)
    duration = envelope.attributes["netcl.device.duration"]
    assert 0 < total <= duration * 1e9 + len(intervals)
    after = kernel_counts()
    assert after.get("axpy", 0) - kernels_before.get("axpy", 0) == N // 2
    assert after.get("add", 0) - kernels_before.get("add", 0) == N // 2
    assert replay_count() - replays_before == 1


def test_rebound_replays_and_replays_without_an_sdk_record_device_time(
    pq: cl.CommandQueue, kernels: Kernels, otel_mode: str
) -> None:
    chain = _Chain(pq, kernels)
    profiling.flush(5.0)
    count, seconds = _replays()
    chain.cap.replay()
    chain.cap.replay_with_new_buffers({chain.y.int_ptr: chain.y2})
    pq.finish()
    assert profiling.flush(10.0) == 0
    count2, seconds2 = _replays()
    assert count2 - count == 2 and seconds2 > seconds
    np.testing.assert_allclose(chain.host, chain.expect(1), rtol=1e-5)  # from y2: one run
    by_kernel = profiling.collector().stats().by_kernel
    assert {"axpy", "add"} <= set(by_kernel)


def test_a_capture_over_two_profiling_queues_keeps_every_event(
    ctx: cl.Context, pq: cl.CommandQueue, kernels: Kernels
) -> None:
    other = cl.CommandQueue(ctx, properties=_PROFILING)
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    a = cl.Buffer(ctx, flags, hostbuf=np.ones(SIZE, np.float32))
    b = cl.Buffer(ctx, flags, hostbuf=np.ones(SIZE, np.float32))
    cap = KernelCapture()
    with cap:
        e = kernels.axpy(pq, (SIZE,), None, a, b, np.float32(1.0))
        kernels.axpy(other, (SIZE,), None, b, a, np.float32(1.0), wait_for=[e])
    other.finish()
    pq.finish()
    profiling.flush(5.0)
    commands = sum(n for n, _ in profiling.collector().stats().by_kernel.values())
    count = _replays()[0]
    cap.replay()
    other.finish()
    pq.finish()
    assert profiling.flush(10.0) == 0
    assert _replays()[0] - count == 1
    assert sum(n for n, _ in profiling.collector().stats().by_kernel.values()) - commands == 2


def test_a_replay_on_a_plain_queue_watches_nothing(
    queue: cl.CommandQueue, kernels: Kernels
) -> None:
    assert not profiling.enabled(queue)
    chain = _Chain(queue, kernels)
    watched = profiling.collector().stats().watched
    chain.cap.replay()
    chain.cap.replay_with_new_buffers({chain.y.int_ptr: chain.y2})
    queue.finish()
    assert profiling.collector().stats().watched == watched
    np.testing.assert_allclose(chain.host, chain.expect(1), rtol=1e-5)


def test_a_profiled_replay_is_correct_under_a_failing_sdk(
    pq: cl.CommandQueue, kernels: Kernels, hostile_sdk: Callable[[], None]
) -> None:
    chain = _Chain(pq, kernels)
    count = _replays()[0]
    chain.cap.replay()
    pq.finish()
    assert profiling.flush(10.0) == 0  # the collector's spans fail inside the SDK, not here
    hostile_sdk()
    np.testing.assert_allclose(chain.host, chain.expect(2), rtol=1e-5)
    assert _replays()[0] - count == 1


@pytest.fixture
def summary() -> Iterator[profiling.Collector]:
    """The process-wide collector in summary mode, drawing no unit for detail (restored after)."""
    collector = profiling.collector()
    saved = collector.mode, collector.sample_budget
    collector.mode, collector.sample_budget = "summary", 0.0
    try:
        yield collector
    finally:
        collector.mode, collector.sample_budget = saved


def test_a_replay_in_summary_mode_records_its_device_time_and_samples_its_kernels(
    pq: cl.CommandQueue,
    kernels: Kernels,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
    summary: profiling.Collector,
) -> None:
    """Summary mode: a replay's device span and histogram point as in per-command mode, but no
    span per command and no kernel points; a replay drawn for detail has both, so that
    ``netcl.kernel.duration`` keeps filling in."""
    chain = _Chain(pq, kernels)
    profiling.flush(5.0)
    spans.clear()

    def kernel_counts() -> dict[str, int]:
        return {
            p.attributes["netcl.kernel.name"]: p.count
            for p in metric_points("netcl.kernel.duration")
        }

    def replay_points() -> tuple[int, float]:
        points = metric_points("netcl.capture.replay.device_duration")
        return sum(p.count for p in points), sum(p.sum for p in points)

    kernels_before, (count, seconds) = kernel_counts(), replay_points()
    with T.span("netcl.test.step"):
        chain.cap.replay()
        pq.finish()
    assert profiling.flush(10.0) == 0
    np.testing.assert_allclose(chain.host, chain.expect(2), rtol=1e-5)
    finished = list(spans.get_finished_spans())
    (host,) = _named(finished, "netcl.capture.replay")
    (envelope,) = _named(finished, "netcl.device.replay")
    assert envelope.parent is not None and envelope.parent.span_id == host.context.span_id
    duration = envelope.attributes["netcl.device.duration"]
    assert duration > 0 and "netcl.device.sampled" not in envelope.attributes
    assert not [s for s in finished if s.name in ("netcl.device.kernel", "netcl.device.transfer")]
    count2, seconds2 = replay_points()
    assert count2 == count + 1 and seconds2 - seconds == pytest.approx(duration)
    assert kernel_counts() == kernels_before

    # sampled: credit for far more than a replay's detail (0.05 s of collection)
    summary.sample_budget = 1.0
    time.sleep(0.06)
    spans.clear()
    chain.cap.replay()
    pq.finish()
    assert profiling.flush(10.0) == 0
    finished = list(spans.get_finished_spans())
    (envelope,) = _named(finished, "netcl.device.replay")
    assert envelope.attributes["netcl.device.sampled"] is True
    assert len(_named(finished, "netcl.device.kernel")) == N
    after = kernel_counts()
    assert after.get("axpy", 0) - kernels_before.get("axpy", 0) == N // 2
    assert after.get("add", 0) - kernels_before.get("add", 0) == N // 2
    assert replay_points()[0] == count + 2


def test_a_summary_replay_keeps_only_its_first_and_last_events(
    pq: cl.CommandQueue, kernels: Kernels, summary: profiling.Collector
) -> None:
    """The draw for detail is made before the replay: one not drawn keeps the first and the last
    event, every other one released as it is enqueued (as a plain replay does); one drawn keeps
    them all. Either way, the device time of the whole replay."""
    chain = _Chain(pq, kernels)
    program = chain.cap._program
    assert program is not None
    ends: list[cl.Event] = []
    last = program.run(None, ends, ends=True)
    every: list[cl.Event] = []
    program.run(None, every, ends=False)
    pq.finish()
    assert len(ends) == 2 and ends[1] is last and len(every) == N + 1
    kinds = [e.command_type for e in ends]
    assert kinds == [cl.command_type.NDRANGE_KERNEL, cl.command_type.READ_BUFFER]
    assert not profiling.detail(N + 1)  # no budget: never drawn
    summary.mode = "commands"
    assert profiling.detail(N + 1)
    summary.mode = "none"
    assert not profiling.detail(N + 1)
    summary.mode = "summary"
    before = _replays()
    t0 = time.perf_counter()
    chain.cap.replay()
    pq.finish()
    wall = time.perf_counter() - t0
    assert profiling.flush(10.0) == 0
    count, seconds = _replays()
    assert count == before[0] + 1
    # the whole replay on the device: it ran between the enqueue and the finish (a bound that
    # holds on a loaded machine, where one replay can take 10x the one before)
    assert 0 < seconds - before[1] <= wall
    np.testing.assert_allclose(chain.host, chain.expect(4), rtol=1e-5)  # recorded, 3 runs


def test_a_capture_made_in_mode_none_replays_unwatched(
    pq: cl.CommandQueue, kernels: Kernels, summary: profiling.Collector
) -> None:
    summary.mode = "none"
    chain = _Chain(pq, kernels)
    summary.mode = "summary"  # the capture was made unwatched: it stays so
    watched = summary.stats().watched
    chain.cap.replay()
    pq.finish()
    assert summary.stats().watched == watched
    np.testing.assert_allclose(chain.host, chain.expect(2), rtol=1e-5)


def test_a_summary_replay_on_a_plain_queue_is_bracketed_around_its_work(
    ctx: cl.Context, spans: InMemorySpanExporter, summary: profiling.Collector, busy: Any
) -> None:
    """On a plain queue a summary replay's device time comes from two stamps on a side queue:
    it covers a kernel of known length (a busy loop calibrated to the device, timed on a
    profiling queue first), and its device span sits under the replay's span, inside the step
    that waited for it."""
    plain, pq = cl.CommandQueue(ctx), cl.CommandQueue(ctx, properties=_PROFILING)
    loops = busy.loops(2e-3)
    timed = [busy.launch(pq, loops) for _ in range(3)]
    pq.finish()
    own = min(e.profile.end - e.profile.start for e in timed)
    assert own > 2_000_000, f"the busy kernel takes {own} ns: make it longer"
    cap = KernelCapture()
    with cap:
        busy.launch(plain, loops)
    plain.finish()
    profiling.flush(5.0)
    spans.clear()
    with T.span("netcl.test.step"):
        cap.replay()
        plain.finish()
        assert profiling.flush(10.0) == 0  # the end stamp too: the step holds both
    finished = list(spans.get_finished_spans())
    (step,) = _named(finished, "netcl.test.step")
    (host,) = _named(finished, "netcl.capture.replay")
    (envelope,) = _named(finished, "netcl.device.replay")
    assert envelope.parent is not None and envelope.parent.span_id == host.context.span_id
    duration = envelope.attributes["netcl.device.duration"]
    # a loaded CPU stretches a kernel, never halves it; stamped on the wrong side, ~0
    assert duration * 1e9 >= own / 2, (duration, own)
    clock = summary.clock(plain.device)
    assert clock is not None
    tol = clock.tolerance_ns + DRIFT_NS
    assert envelope.start_time is not None and envelope.end_time is not None
    assert host.start_time is not None and step.end_time is not None
    assert clock.measured_ns >= host.start_time  # calibrated for this replay (_fresh_clock)
    assert envelope.start_time >= host.start_time - tol
    assert envelope.end_time <= step.end_time + tol
    assert not _named(finished, "netcl.device.kernel")  # no command has its own time here


def test_a_capture_of_only_a_finish_replays_nothing_with_every_command_watched(
    pq: cl.CommandQueue, summary: profiling.Collector
) -> None:
    """In commands mode a replay keeps every command's event: one of no commands (a capture of
    only a finish, which an in-order queue orders anyway) returns no event and watches nothing."""
    summary.mode = "commands"
    cap = KernelCapture()
    with cap:
        pq.finish()
    watched = summary.stats().watched
    assert cap.replay() is None
    assert summary.stats().watched == watched
