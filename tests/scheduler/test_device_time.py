"""Device time of scheduler plans on a profiling queue (real kernels on the default device): the
events a plan's ops return, as a ``netcl.device.plan`` span under the plan's span and a point of
``netcl.scheduler.plan.device_duration`` by description; nothing watched without profiling."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import profiling
from netcl.runtime.scheduler import ExecutionPlan, Scheduler

from .conftest import Kernels

N = 4096


def _plans(queue: cl.CommandQueue, k: Kernels, buf: cl.Buffer, tag: str) -> list[Any]:
    def scale() -> cl.Event:
        k.scale.set_args(buf, np.float32(2.0))
        return cl.enqueue_nd_range_kernel(queue, k.scale, (N,), None)

    def two() -> list[cl.Event]:
        return [scale(), scale()]

    first = ExecutionPlan([scale], description=f"{tag} one", queue=queue)
    second = ExecutionPlan([two, scale], description=f"{tag} three", queue=queue, after=first)
    return [first, second]


def _points(metric_points: Callable[[str], list[Any]], tag: str) -> dict[str, int]:
    return {
        p.attributes["netcl.plan.description"]: p.count
        for p in metric_points("netcl.scheduler.plan.device_duration")
        if str(p.attributes.get("netcl.plan.description", "")).startswith(tag)
    }


@pytest.mark.parametrize("async_mode", [False, True], ids=["sync", "async"])
def test_a_plan_on_a_profiling_queue_records_its_device_time(
    ctx: cl.Context,
    kernels: Kernels,
    async_mode: bool,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    pq = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    cl.enqueue_fill_buffer(pq, buf, np.float32(1.0), 0, 4 * N)
    tag = f"dt-{async_mode}"
    sched = Scheduler(async_mode=async_mode)
    for plan in _plans(pq, kernels, buf, tag):
        sched.submit(plan)
    sched.run(wait=True)
    out = np.empty(N, np.float32)
    cl.enqueue_copy(pq, out, buf)
    np.testing.assert_array_equal(out, np.full(N, 16.0, np.float32))
    assert profiling.flush(10.0) == 0
    assert _points(metric_points, tag) == {f"{tag} one": 1, f"{tag} three": 1}
    finished = spans.get_finished_spans()
    plans = {s.context.span_id: s for s in finished if s.name == "netcl.scheduler.plan"}
    device = {
        s.attributes["netcl.plan.description"]: s
        for s in finished
        if s.name == "netcl.device.plan"
        and str(s.attributes["netcl.plan.description"]).startswith(tag)
    }
    assert set(device) == {f"{tag} one", f"{tag} three"}
    for name, d in device.items():
        assert d.parent is not None
        host = plans[d.parent.span_id]
        assert host.attributes["netcl.plan.description"] == name
        assert d.attributes["netcl.device.duration"] > 0
    # the plan of three kernels: three device spans under its device span
    three = device[f"{tag} three"]
    under = three.context.span_id
    kernels_under = [
        s
        for s in finished
        if s.name == "netcl.device.kernel" and s.parent is not None and s.parent.span_id == under
    ]
    assert len(kernels_under) == 3


def test_a_plan_without_profiling_is_not_watched(
    ctx: cl.Context, queue: cl.CommandQueue, kernels: Kernels
) -> None:
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    watched = profiling.collector().stats().watched
    sched = Scheduler()
    for plan in _plans(queue, kernels, buf, "plain"):
        sched.submit(plan)
    sched.run(wait=True)
    assert profiling.collector().stats().watched == watched


@pytest.mark.parametrize(
    "props", [cl.command_queue_properties.PROFILING_ENABLE, 0], ids=["profiling", "plain"]
)  # plain: bracketed on a side queue
def test_a_plan_in_summary_mode_has_its_device_time_and_no_command_spans(
    ctx: cl.Context,
    kernels: Kernels,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
    props: int,
) -> None:
    collector = profiling.collector()
    saved = collector.mode, collector.sample_budget, collector.stamp_budget
    # no unit drawn for detail; on a plain queue every plan stamped (none left out by the
    # stamps' sampling, which plans enqueued back to back would see)
    collector.mode, collector.sample_budget, collector.stamp_budget = "summary", 0.0, math.inf
    try:
        pq = cl.CommandQueue(ctx, properties=props)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
        cl.enqueue_fill_buffer(pq, buf, np.float32(1.0), 0, 4 * N)
        sched = Scheduler()
        tag = f"summary {props}"  # the points of each case apart
        for plan in _plans(pq, kernels, buf, tag):
            sched.submit(plan)
        sched.run(wait=True)
        assert profiling.flush(10.0) == 0
    finally:
        collector.mode, collector.sample_budget, collector.stamp_budget = saved
    assert _points(metric_points, tag) == {f"{tag} one": 1, f"{tag} three": 1}
    finished = spans.get_finished_spans()
    device = [
        s
        for s in finished
        if s.name == "netcl.device.plan"
        and str(s.attributes["netcl.plan.description"]).startswith(tag)
    ]
    assert len(device) == 2 and all(d.attributes["netcl.device.duration"] > 0 for d in device)
    assert not [s for s in finished if s.name == "netcl.device.kernel"]
