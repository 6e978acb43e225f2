"""Spans and metrics (names are API), and the no-SDK fast path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

_COUNTERS = ("netcl.scheduler.ops", "netcl.scheduler.host_waits", "netcl.scheduler.runs")


def _counters(metric_points: Callable[[str], list[Any]]) -> dict[tuple[str, ...], float]:
    """The scheduler's counters now, by name and attributes (values cumulative over the
    session)."""
    return {
        (name, *(f"{k}={v}" for k, v in sorted(p.attributes.items()))): p.value
        for name in _COUNTERS
        for p in metric_points(name)
    }


def _added(
    before: dict[tuple[str, ...], float], after: dict[tuple[str, ...], float]
) -> dict[tuple[str, ...], float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _ops_total(metric_points: Callable[[str], list[Any]], async_mode: bool) -> int:
    return sum(
        p.value
        for p in metric_points("netcl.scheduler.ops")
        if p.attributes.get("netcl.scheduler.async") == async_mode
    )


@pytest.mark.parametrize("async_mode", [False, True])
def test_run_and_plan_spans(
    async_mode: bool,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
    queue: cl.CommandQueue,
    kernels: object,
) -> None:
    n = 256
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, n * 4)
    before = _ops_total(metric_points, async_mode)
    sched = Scheduler(async_mode=async_mode)
    copy = ExecutionPlan(description="h2d copy")
    sched.submit(lambda: kernels.scale(queue, (n,), None, buf, np.float32(1)), plan=copy)
    sched.submit(lambda: None, plan=copy)
    sched.submit(lambda: kernels.scale(queue, (n,), None, buf, np.float32(1)))

    sched.run()

    finished = spans.get_finished_spans()
    (run,) = [s for s in finished if s.name == "netcl.scheduler.run"]
    plans = [s for s in finished if s.name == "netcl.scheduler.plan"]
    assert run.attributes is not None
    assert run.attributes["netcl.scheduler.plans"] == 2
    assert run.attributes["netcl.scheduler.ops"] == 3
    assert run.attributes["netcl.scheduler.async"] is async_mode
    assert run.attributes["netcl.scheduler.events"] == 2
    assert run.instrumentation_scope is not None
    assert run.instrumentation_scope.name == "netcl.runtime.scheduler"
    assert [s.attributes["netcl.plan.description"] for s in plans if s.attributes] == [
        "h2d copy",
        "",
    ]
    assert [s.attributes["netcl.plan.ops"] for s in plans if s.attributes] == [2, 1]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in plans)
    assert _ops_total(metric_points, async_mode) - before == 3


def test_spans_of_ops_nest_under_their_plan(spans: InMemorySpanExporter) -> None:
    from opentelemetry import trace

    tracer = trace.get_tracer("test")
    sched = Scheduler()

    def traced_op() -> None:
        with tracer.start_as_current_span("user.op"):
            pass

    sched.submit(traced_op, plan=ExecutionPlan(description="outer"))
    sched.run()
    by_name = {s.name: s for s in spans.get_finished_spans()}
    op_span, plan_span = by_name["user.op"], by_name["netcl.scheduler.plan"]
    assert op_span.parent is not None and op_span.parent.span_id == plan_span.context.span_id


def test_a_failed_run_marks_its_spans_and_counts_done_ops(
    spans: InMemorySpanExporter, metric_points: Callable[[str], list[Any]]
) -> None:
    def boom() -> None:
        raise KeyError("x")

    runs_before = sum(
        p.value
        for p in metric_points("netcl.scheduler.runs")
        if p.attributes.get("netcl.scheduler.result") == "error"
    )
    before = _ops_total(metric_points, False)
    sched = Scheduler()
    plan = sched.submit(lambda: None, plan=ExecutionPlan(description="f"))
    sched.submit(boom, plan=plan)
    sched.submit(lambda: None)
    with pytest.raises(Scheduler.Error):
        sched.run()

    finished = {s.name: s for s in spans.get_finished_spans()}
    assert finished["netcl.scheduler.run"].status.status_code is StatusCode.ERROR
    assert finished["netcl.scheduler.plan"].status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in finished["netcl.scheduler.plan"].events)
    assert _ops_total(metric_points, False) - before == 1  # only the op before the failure
    runs_after = sum(
        p.value
        for p in metric_points("netcl.scheduler.runs")
        if p.attributes.get("netcl.scheduler.result") == "error"
    )
    assert runs_after - runs_before == 1


def test_no_span_work_without_an_sdk() -> None:
    # A fresh interpreter with no SDK: run must not touch the tracing API at all.
    code = textwrap.dedent(
        """
        from opentelemetry import trace
        from netcl.runtime.scheduler import Scheduler, ExecutionPlan

        def refuse(*args, **kwargs):
            raise AssertionError("span work without an SDK")

        trace.ProxyTracer.start_as_current_span = refuse
        trace.ProxyTracer.start_span = refuse
        trace.NoOpTracer.start_as_current_span = refuse
        trace.NoOpTracer.start_span = refuse
        sched = Scheduler()
        calls = []
        sched.submit(lambda: calls.append(1), plan=ExecutionPlan(description="a"))
        sched.submit(lambda: calls.append(2))
        assert sched.run() == [] and calls == [1, 2]
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("async_mode", [False, True])
def test_run_returns_correct_results_under_a_hostile_sdk(
    async_mode: bool,
    hostile_sdk: Callable[[], None],
    ctx: cl.Context,
    queue: cl.CommandQueue,
    queue_b: cl.CommandQueue,
    kernels: Any,
    uint_buffer: Callable[..., cl.Buffer],
    expected_consumed: Callable[[int, int], Any],
) -> None:
    # span processors raising in on_start/on_end, a metric reader raising on record and collect:
    # the run returns what it returns without telemetry, and its errors stay its own
    n = 4096
    src, dst = uint_buffer(n), uint_buffer(n, fill=3)
    produce = ExecutionPlan(description="produce", queue=queue)
    produce.ops.append(lambda: kernels.produce(queue, (n,), None, src, np.int32(10)))
    consume = ExecutionPlan(description="consume", queue=queue_b, after=produce)
    consume.ops.append(lambda: kernels.consume(queue_b, (n,), None, src, dst))
    sched = Scheduler(async_mode=async_mode)
    sched.submit(produce)
    sched.submit(consume)

    events = sched.run()
    hostile_sdk()  # the reader collects now (raising inside the SDK)

    assert len(events) == 2 and sched.plans == ()
    assert all(e.command_execution_status == cl.command_execution_status.COMPLETE for e in events)
    out = np.empty(n, dtype=np.uint32)
    cl.enqueue_copy(queue, out, dst)
    np.testing.assert_array_equal(out, expected_consumed(n, 10))

    def boom() -> None:
        raise ValueError("bad input")

    failing = sched.submit(boom, plan=ExecutionPlan(description="boom"))
    later = sched.submit(lambda: None)
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    assert info.value.plan is failing and info.value.unrun_plans == [later]


def test_counters_of_successful_runs_by_mode(
    queue: cl.CommandQueue, metric_points: Callable[[str], list[Any]]
) -> None:
    """A run that succeeds counts as ok under its mode, with the ops it ran and the host waits
    it made (the runs, ops and host_waits counters, each labelled by netcl.scheduler.async)."""
    before = _counters(metric_points)
    sync = Scheduler()
    for _ in range(2):
        sync.submit(lambda: cl.enqueue_marker(queue))
    sync.submit(lambda: None)
    sync.run()  # host waits after plans 0 and 1, not after the last
    first = ExecutionPlan([lambda: cl.enqueue_marker(queue)], "first", queue=queue)
    on_host = ExecutionPlan([lambda: None, lambda: None], "on host", after=first)  # no queue
    asynchronous = Scheduler(async_mode=True)
    asynchronous.submit(first)
    asynchronous.submit(on_host)
    asynchronous.run()  # the host waits for first before on_host
    assert _added(before, _counters(metric_points)) == {
        ("netcl.scheduler.ops", "netcl.scheduler.async=False"): 3,
        ("netcl.scheduler.ops", "netcl.scheduler.async=True"): 3,
        ("netcl.scheduler.host_waits", "netcl.scheduler.async=False"): 2,
        ("netcl.scheduler.host_waits", "netcl.scheduler.async=True"): 1,
        ("netcl.scheduler.runs", "netcl.scheduler.async=False", "netcl.scheduler.result=ok"): 1,
        ("netcl.scheduler.runs", "netcl.scheduler.async=True", "netcl.scheduler.result=ok"): 1,
    }


@pytest.mark.parametrize("async_mode", [False, True])
def test_counters_of_an_interrupted_run_and_its_resumption(
    async_mode: bool, metric_points: Callable[[str], list[Any]]
) -> None:
    """An interrupted run counts as an error with the ops that returned; the run that resumes
    it counts as ok with only the ops it ran itself."""
    calls: list[int] = []

    def interrupted_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    mode = f"netcl.scheduler.async={async_mode}"
    sched = Scheduler(async_mode=async_mode)
    sched.submit(ExecutionPlan([lambda: None, interrupted_once, lambda: None], "resumed"))
    before = _counters(metric_points)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    middle = _counters(metric_points)
    assert _added(before, middle) == {
        ("netcl.scheduler.ops", mode): 1,
        ("netcl.scheduler.runs", mode, "netcl.scheduler.result=error"): 1,
    }
    sched.run()
    assert _added(middle, _counters(metric_points)) == {
        ("netcl.scheduler.ops", mode): 2,
        ("netcl.scheduler.runs", mode, "netcl.scheduler.result=ok"): 1,
    }
    assert len(calls) == 2
