"""An interrupted run (KeyboardInterrupt, any BaseException) keeps what it did not complete and
the next run resumes it: no op runs twice, none is lost. Telemetry failures never lose plans."""

from __future__ import annotations

import contextvars
import logging
import random
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import log
from netcl.runtime.scheduler import ExecutionPlan, Scheduler

COMPLETE = cl.command_execution_status.COMPLETE


class Counts:
    """A device buffer of per-op counters: ``op(k)`` enqueues a kernel adding 1 to slot ``k``."""

    def __init__(self, queue: cl.CommandQueue, kernels: Any, n: int) -> None:
        self.queue, self.kernels, self.n = queue, kernels, n
        self.buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, n * 4)
        cl.enqueue_fill_buffer(queue, self.buf, np.uint32(0), 0, n * 4).wait()

    def op(self, k: int) -> Callable[[], cl.Event]:
        return lambda: self.kernels.bump(self.queue, (1,), None, self.buf, np.uint32(k))

    def read(self) -> npt.NDArray[np.uint32]:
        out = np.empty(self.n, dtype=np.uint32)
        cl.enqueue_copy(self.queue, out, self.buf)  # blocking
        return out


def _three_plans(counts: Counts, interrupt_at: int) -> tuple[list[ExecutionPlan], list[int]]:
    """Plans of ops 0-2, 3-5 and 6-7; op ``interrupt_at`` raises KeyboardInterrupt on its first
    call, before enqueueing anything. Returns the plans and the list of that op's calls."""
    calls: list[int] = []

    def interrupting() -> cl.Event:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return counts.op(interrupt_at)()

    plans = [ExecutionPlan(description=name) for name in ("h2d", "compute", "d2h")]
    for k in range(8):
        op = interrupting if k == interrupt_at else counts.op(k)
        plans[0 if k < 3 else 1 if k < 6 else 2].ops.append(op)
    return plans, calls


@pytest.mark.parametrize("async_mode", [False, True])
def test_keyboard_interrupt_in_an_op_keeps_the_rest_and_the_next_run_resumes(
    async_mode: bool,
    queue: cl.CommandQueue,
    kernels: Any,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    def ops_counted() -> int:
        return sum(p.value for p in metric_points("netcl.scheduler.ops"))

    counts = Counts(queue, kernels, 8)
    plans, calls = _three_plans(counts, interrupt_at=4)
    ops_before = ops_counted()
    sched = Scheduler(async_mode=async_mode)
    for p in plans:
        sched.submit(p)

    with pytest.raises(KeyboardInterrupt) as info:
        sched.run()
    assert type(info.value) is KeyboardInterrupt  # unchanged, not wrapped in Scheduler.Error
    (run_span,) = [s for s in spans.get_finished_spans() if s.name == "netcl.scheduler.run"]
    assert run_span.attributes is not None
    assert run_span.attributes["error.type"] == "KeyboardInterrupt"

    if async_mode:  # h2d was issued but not waited for: it stays until a run completes it
        assert sched.plans == tuple(plans)
    else:  # h2d completed; compute stays from op 4 on, then d2h
        assert sched.plans == (plans[1], plans[2])
    queue.finish()
    np.testing.assert_array_equal(counts.read(), [1, 1, 1, 1, 0, 0, 0, 0])
    assert "plans=3" in repr(sched) or "plans=2" in repr(sched)

    events = sched.run()

    np.testing.assert_array_equal(counts.read(), np.ones(8, dtype=np.uint32))  # each op once
    assert len(calls) == 2
    assert sched.plans == ()
    assert ops_counted() - ops_before == 8  # the interrupted run counted 4, the resumed one 4
    # the resumed run returns the events of the plans it completed, the ones issued before the
    # interrupt included
    assert len(events) == (8 if async_mode else 5)
    assert all(e.command_execution_status == COMPLETE for e in events)


def test_ops_submitted_after_an_interrupt_run_after_the_interrupted_plan(
    queue: cl.CommandQueue, kernels: Any
) -> None:
    counts = Counts(queue, kernels, 9)
    plans, _ = _three_plans(counts, interrupt_at=3)
    sched = Scheduler()
    for p in plans:
        sched.submit(p)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    sched.submit(counts.op(8), plan=plans[1])  # appended to the interrupted plan
    later = sched.submit(counts.op(8))  # a new plan: runs after the kept ones
    assert sched.plans == (plans[1], plans[2], later)
    sched.run()
    np.testing.assert_array_equal(counts.read(), [1] * 8 + [2])


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_plan_resumed_after_its_event_op_returns_that_event(
    async_mode: bool, queue: cl.CommandQueue
) -> None:
    """A plan interrupted after an op that returned an event, resumed with only ops that return
    None left: the resumed run waits for that event and returns it."""
    calls: list[int] = []

    def interrupted_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    marked: list[cl.Event] = []

    def mark() -> cl.Event:
        marked.append(cl.enqueue_marker(queue))
        return marked[-1]

    plan = ExecutionPlan([mark, interrupted_once])
    sched = Scheduler(async_mode=async_mode)
    sched.submit(plan)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    assert sched.plans == (plan,)

    events = sched.run()

    assert len(marked) == 1 and events == marked
    assert marked[0].command_execution_status == COMPLETE
    assert len(calls) == 2 and sched.plans == ()


class HostWait:
    """An event-like op whose first ``wait()`` is interrupted (a Ctrl-C during a host wait)."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self) -> None:
        self.waits += 1
        if self.waits == 1:
            raise KeyboardInterrupt


@pytest.mark.parametrize("async_mode", [False, True])
def test_keyboard_interrupt_during_the_wait_keeps_the_issued_plans_without_rerunning(
    async_mode: bool, queue: cl.CommandQueue, kernels: Any
) -> None:
    counts = Counts(queue, kernels, 4)
    sched = Scheduler(async_mode=async_mode)
    first = sched.submit(counts.op(0), plan=ExecutionPlan(description="first"))
    sched.submit(counts.op(1), plan=first)
    waiting = ExecutionPlan(ops=[counts.op(2), HostWait()], description="waits")
    sched.submit(waiting)
    last = sched.submit(counts.op(3), plan=ExecutionPlan(description="last"))

    with pytest.raises(KeyboardInterrupt):
        sched.run()

    if async_mode:  # interrupted in the final wait: every op ran, every plan stays to be waited
        assert sched.plans == (first, waiting, last)
        expected_before = [1, 1, 1, 1]
    else:  # interrupted waiting for 'waits': 'first' completed, 'last' never started
        assert sched.plans == (waiting, last)
        expected_before = [1, 1, 1, 0]
    queue.finish()
    np.testing.assert_array_equal(counts.read(), expected_before)

    events = sched.run()

    np.testing.assert_array_equal(counts.read(), [1, 1, 1, 1])
    host_wait = waiting.ops[1]
    assert isinstance(host_wait, HostWait) and host_wait.waits == 2  # waited again, not rerun
    assert host_wait in events
    assert sched.plans == ()


def test_scheduler_error_keeps_its_contract_after_a_resume(
    queue: cl.CommandQueue, kernels: Any
) -> None:
    counts = Counts(queue, kernels, 8)
    plans, _ = _three_plans(counts, interrupt_at=1)

    def boom() -> None:
        raise ValueError("bad")

    plans[1].ops.insert(1, boom)
    sched = Scheduler()
    for p in plans:
        sched.submit(p)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    with pytest.raises(Scheduler.Error) as info:
        sched.run()  # resumes 'h2d' at op 1, then fails in 'compute'
    assert info.value.plan is plans[1] and info.value.op is boom
    assert info.value.unrun_plans == [plans[2]]
    assert sched.plans == ()  # the error carries the unrun plans; the scheduler keeps nothing
    np.testing.assert_array_equal(counts.read(), [1, 1, 1, 1, 0, 0, 0, 0])


@pytest.mark.parametrize("async_mode", [False, True])
def test_a_resumed_plan_runs_the_ops_its_first_run_took_though_plan_ops_was_edited(
    async_mode: bool, queue: cl.CommandQueue, kernels: Any
) -> None:
    """After an interrupt the user drops the op that already ran from ``plan.ops``: the next
    run still resumes where the interrupted one stopped, on the ops it took (no op lost)."""
    counts = Counts(queue, kernels, 3)
    plans, calls = _three_plans(counts, interrupt_at=1)
    plan = plans[0]  # ops 0, 1 (interrupts on its first call) and 2
    sched = Scheduler(async_mode=async_mode)
    sched.submit(plan)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    del plan.ops[0]  # op 0 ran: the user takes it out of the plan
    events = sched.run()
    np.testing.assert_array_equal(counts.read(), [1, 1, 1])  # ops 1 and 2 ran, once each
    assert len(calls) == 2 and len(events) == 3 and sched.plans == ()


# --- interrupts at random moments ------------------------------------------------------------


@pytest.fixture
def alarm() -> Iterator[list[bool]]:
    """A SIGALRM handler that raises KeyboardInterrupt while ``armed[0]`` is True."""
    armed = [False]

    def handler(signum: int, frame: object) -> None:
        if armed[0]:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, handler)
    yield armed
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


# an interrupt that lands in a weakref callback or a finalizer is printed and dropped by Python
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_interrupts_at_random_moments_never_repeat_or_lose_an_op(
    queue: cl.CommandQueue, alarm: list[bool]
) -> None:
    # Each op enqueues a marker and then, as its last step, counts itself in a list (no call
    # after the enqueue returns, so an interrupt cannot land between the count and the return).
    # A KeyboardInterrupt from a timer lands anywhere in run(): in an op, between ops, in the
    # scheduler's bookkeeping, in span start/end, in a wait. Whatever it hits, running again
    # until the scheduler is empty must have returned from every op exactly once.
    rng = random.Random(1234)
    plans_per_run, ops_per_plan = 12, 4
    deadline = time.monotonic() + 4.0
    rounds = interrupts = 0

    def stress() -> None:
        nonlocal rounds, interrupts
        while time.monotonic() < deadline or rounds < 20:
            rounds += 1
            returned = [0] * (plans_per_run * ops_per_plan)

            def make_op(k: int, returned: list[int] = returned) -> Callable[[], cl.Event]:
                def op() -> cl.Event:
                    ev = cl.enqueue_marker(queue)
                    returned[k] += 1
                    return ev

                return op

            sched = Scheduler(async_mode=rng.random() < 0.5)
            chained = rng.random() < 0.5  # each plan after the previous: barriers in async mode
            plan = None
            for p in range(plans_per_run):
                plan = ExecutionPlan(
                    description=f"p{p}",
                    queue=queue if chained else None,
                    after=plan if chained else None,
                )
                for o in range(ops_per_plan):
                    sched.submit(make_op(p * ops_per_plan + o), plan=plan)
            while sched.plans:
                try:
                    alarm[0] = True
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0, 0.002))
                    sched.run()
                except KeyboardInterrupt:
                    interrupts += 1
                alarm[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            assert returned == [1] * len(returned), f"round {rounds}: {returned}"

    # spans started by an interrupted run may stay attached: keep that out of the test context
    contextvars.copy_context().run(stress)
    queue.finish()
    assert interrupts >= 20, f"only {interrupts} interrupts in {rounds} rounds"


# --- telemetry failures ----------------------------------------------------------------------


class _FailingProcessor(SpanProcessor):
    """Raises in on_start and/or on_end of the scheduler's spans while switched on."""

    def __init__(self) -> None:
        self.on_start_fails = False
        self.on_end_fails = False

    def on_start(self, span: Span, parent_context: object = None) -> None:
        if self.on_start_fails and span.name.startswith("netcl.scheduler."):
            raise RuntimeError("span processor failed in on_start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.on_end_fails and span.name.startswith("netcl.scheduler."):
            raise RuntimeError("span processor failed in on_end")


_PROCESSOR = _FailingProcessor()
trace.get_tracer_provider().add_span_processor(_PROCESSOR)  # type: ignore[attr-defined]


@pytest.fixture
def failing_processor() -> Iterator[_FailingProcessor]:
    yield _PROCESSOR
    _PROCESSOR.on_start_fails = _PROCESSOR.on_end_fails = False


@pytest.mark.parametrize("where", ["on_start", "on_end", "both"])
@pytest.mark.parametrize("async_mode", [False, True])
def test_a_raising_span_processor_never_breaks_a_run(
    where: str,
    async_mode: bool,
    failing_processor: _FailingProcessor,
    queue: cl.CommandQueue,
    kernels: Any,
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = Counts(queue, kernels, 8)
    plans, _ = _three_plans(counts, interrupt_at=99)  # nothing interrupts
    sched = Scheduler(async_mode=async_mode)
    for p in plans:
        sched.submit(p)
    failing_processor.on_start_fails = where in ("on_start", "both")
    failing_processor.on_end_fails = where in ("on_end", "both")

    monkeypatch.setattr(log, "_warned", set())  # forget failures logged before (warn_once)
    with caplog.at_level(logging.WARNING, logger="netcl.core.telemetry"):
        events = sched.run()

    # logged once per kind of failure (not per span): a span whose start failed is never ended
    failures = [r.getMessage() for r in caplog.records if "telemetry_failed" in r.getMessage()]
    stages = ["end"] if where == "on_end" else ["start"]
    assert [f.split()[1] for f in failures] == [f"stage={s}" for s in stages], failures

    assert len(events) == 8 and sched.plans == ()
    np.testing.assert_array_equal(counts.read(), np.ones(8, dtype=np.uint32))
    if where == "on_end":  # started spans are still exported (the failing processor comes last)
        names = [s.name for s in spans.get_finished_spans()]
        assert names.count("netcl.scheduler.plan") == 3


@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_raising_span_processor_does_not_change_the_error(
    where: str, failing_processor: _FailingProcessor, queue: cl.CommandQueue, kernels: Any
) -> None:
    counts = Counts(queue, kernels, 8)
    failing_processor.on_start_fails = where == "on_start"
    failing_processor.on_end_fails = where == "on_end"

    def boom() -> None:
        raise ValueError("bad input")

    plans, _ = _three_plans(counts, interrupt_at=99)
    plans[1].ops.insert(0, boom)
    sched = Scheduler()
    for p in plans:
        sched.submit(p)
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    assert info.value.op is boom and info.value.unrun_plans == [plans[2]]

    # and an interrupt stays an interrupt, with the plans kept
    plans, calls = _three_plans(counts, interrupt_at=4)
    for p in plans:
        sched.submit(p)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    assert sched.plans == (plans[1], plans[2])
    sched.run()
    assert len(calls) == 2 and sched.plans == ()


class _HostEvent:
    """A host-side event an op returns (waiting is free)."""

    def wait(self) -> None:
        pass


# an interrupt that lands in a weakref callback or a finalizer is printed and dropped by Python
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_interrupts_as_ops_return_never_repeat_or_lose_an_op(
    alarm: list[bool], otel_mode: str
) -> None:
    # Trivial Python ops, each counting itself as its very last step before it returns: nearly
    # all of a run's time is the scheduler's own work between one op's return and the next
    # call, so timer interrupts spread over the run keep landing right after an op returned,
    # where a scheduler that stored the op's result late would lose it or run the op again.
    # Running until the scheduler is empty must have returned from every op exactly once, and
    # the events the completing runs return are never an op's event twice. (Without an SDK
    # the run is nearly all bookkeeping; with one, span work sits between the ops too.)
    rng = random.Random(4321)
    plans_per_run, ops_per_plan = 40, 5
    n = plans_per_run * ops_per_plan
    deadline = time.monotonic() + 2.5
    rounds = interrupts = 0

    def stress() -> None:
        nonlocal rounds, interrupts
        while time.monotonic() < deadline or rounds < 40:
            rounds += 1
            returned = [0] * n
            events = [_HostEvent() for _ in range(n)]

            def make_op(
                k: int, returned: list[int] = returned, events: list[_HostEvent] = events
            ) -> Callable[[], _HostEvent]:
                def op() -> _HostEvent:
                    ev = events[k]
                    returned[k] += 1
                    return ev

                return op

            sched = Scheduler(async_mode=rounds % 2 == 0)
            for p in range(plans_per_run):
                plan = ExecutionPlan(description=f"p{p}")
                for o in range(ops_per_plan):
                    sched.submit(make_op(p * ops_per_plan + o), plan=plan)
            seen: list[object] = []
            longest = 0.0004  # doubled after each interrupt: a resumed run always completes
            while sched.plans:
                try:
                    alarm[0] = True
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0, longest))
                    longest *= 2
                    seen += sched.run()
                except KeyboardInterrupt:
                    interrupts += 1
                alarm[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            assert returned == [1] * n, f"round {rounds}: {returned}"
            assert len({id(e) for e in seen}) == len(seen), f"round {rounds}: an event twice"

    # spans started by an interrupted run may stay attached: keep that out of the test context
    contextvars.copy_context().run(stress)
    assert interrupts >= 100, f"only {interrupts} interrupts in {rounds} rounds"


def test_system_exit_in_an_op_is_not_wrapped_and_keeps_the_plans(
    queue: cl.CommandQueue, kernels: Any
) -> None:
    counts = Counts(queue, kernels, 3)
    exits: list[int] = []

    def exit_once() -> cl.Event:
        if not exits:
            exits.append(1)
            raise SystemExit(3)
        return counts.op(1)()

    sched = Scheduler()
    plan = sched.submit(counts.op(0), plan=ExecutionPlan(description="p"))
    sched.submit(exit_once, plan=plan)
    later = sched.submit(counts.op(2))
    with pytest.raises(SystemExit) as info:
        sched.run()
    assert info.value.code == 3
    assert sched.plans == (plan, later)
    sched.run()
    np.testing.assert_array_equal(counts.read(), [1, 1, 1])
