"""Misuse errors, exceptions inside a capture, threads, and interception removal."""

from __future__ import annotations

import gc
import os
import sys
import threading
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.capture import KernelCapture, _intercept

N = 32


def test_misuse_raises_runtime_errors(queue: cl.CommandQueue, kernels: Any, buf: Any) -> None:
    cap = KernelCapture()
    with pytest.raises(RuntimeError, match="end: not recording"):
        cap.end()
    with pytest.raises(RuntimeError, match="replay: nothing captured"):
        cap.replay()
    with pytest.raises(RuntimeError) as info:
        cap.save(os.devnull)
    assert str(info.value) == (
        "KernelCapture.save: nothing captured; record with begin() ... end() first"
    )
    cap.begin()
    try:
        with pytest.raises(RuntimeError, match="begin: already recording"):
            cap.begin()
        with pytest.raises(RuntimeError, match="replay: still recording"):
            cap.replay()
        with pytest.raises(RuntimeError, match="replay_with_new_buffers: still recording"):
            cap.replay_with_new_buffers({})
        other = KernelCapture()
        with pytest.raises(RuntimeError) as info:
            other.begin()
        assert str(info.value) == (
            "KernelCapture.begin: this thread is already recording into another KernelCapture; "
            "end() that one first (captures of one thread do not nest)"
        )
        assert not other.is_recording
    finally:
        cap.end()


def test_exception_inside_capture_with_end_in_finally(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    original = cl.Kernel.__dict__["_set_arg_multi"]
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()

    def recorded_code() -> None:
        kernels.add(queue, (N,), None, out, a, a)
        assert cl.Kernel.__dict__["_set_arg_multi"] is not original  # intercepting now
        raise ZeroDivisionError("inside the capture")

    cap.begin()
    try:
        with pytest.raises(ZeroDivisionError):
            recorded_code()
    finally:
        assert cap.end() == 1
    assert cl.Kernel.__dict__["_set_arg_multi"] is original
    assert not _intercept.is_patched()
    cap.replay()
    np.testing.assert_allclose(host_read(out, N), 2.0)


def test_exception_inside_context_manager_discards_the_recording(
    queue: cl.CommandQueue, kernels: Any, buf: Any, spans: Any
) -> None:
    original = cl.Kernel.__dict__["_set_arg_multi"]
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()

    def recorded_code() -> None:
        with cap:
            kernels.add(queue, (N,), None, out, a, a)
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        recorded_code()
    assert cl.Kernel.__dict__["_set_arg_multi"] is original
    assert not cap.is_recording and cap.num_launches == 0
    with pytest.raises(RuntimeError, match="nothing captured"):
        cap.replay()
    (span,) = [s for s in spans.get_finished_spans() if s.name == "netcl.capture.record"]
    assert not span.status.is_ok


def test_reset_while_recording_fails_the_recording_span_as_discarded_before_end(
    queue: cl.CommandQueue, kernels: Any, buf: Any, spans: Any
) -> None:
    """``reset()`` during a recording ends its ``netcl.capture.record`` span as an error of type
    ``discarded`` whose description says the capture was discarded before ``end()``; a reset
    after ``end()`` leaves the finished span as it was."""
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()
    cap.begin()
    kernels.add(queue, (N,), None, out, a, a)
    cap.reset()
    assert not cap.is_recording
    (span,) = [s for s in spans.get_finished_spans() if s.name == "netcl.capture.record"]
    assert not span.status.is_ok
    assert span.status.description == "capture discarded before end()"
    assert span.attributes["error.type"] == "discarded"
    with cap:
        kernels.add(queue, (N,), None, out, a, a)
    cap.reset()
    done = [s for s in spans.get_finished_spans() if s.name == "netcl.capture.record"][1]
    assert done.status.is_ok and "error.type" not in done.attributes


def test_failing_launch_is_not_recorded(queue: cl.CommandQueue, kernels: Any, buf: Any) -> None:
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()
    with cap:
        with pytest.raises((cl.Error, TypeError, ValueError)):
            kernels.add(queue, (N,), None, out, a)  # one argument short
        kernels.add(queue, (N,), None, out, a, a)
    assert cap.num_launches == 1


@pytest.mark.parametrize("queues", [1, 2])
def test_a_finished_capture_holds_no_recorded_event(
    queue: cl.CommandQueue, kernels: Any, buf: Any, queues: int
) -> None:
    """The recording's events only told the order of its commands: end() lets them go (a
    capture of 50k launches held 50k driver events), on one queue and across two, where they
    planned the replay's waits first; the replay keeps that order."""
    q2 = cl.CommandQueue(queue.context) if queues == 2 else queue
    a, b, out = buf(np.ones(N)), buf(np.zeros(N)), buf(np.zeros(N))
    with KernelCapture() as cap:
        e1 = kernels.axpy(queue, (N,), None, b, a, np.float32(2))  # b = 2a
        e2 = kernels.add(q2, (N,), None, out, b, a, wait_for=[e1])  # out = b + a
        e3 = cl.enqueue_copy(q2, a, out, wait_for=[e2])  # a = out
        cl.wait_for_events([e3])
    assert cap._program is not None and (cap._program.plan is not None) == (queues == 2)
    done = cap.replay()  # recorded from a = 1: b = 2, out = 3, a = 3; replayed: 8, 11, 11
    assert done is not None
    done.wait()
    host = np.empty(N, np.float32)
    cl.enqueue_copy(queue, host, a)
    np.testing.assert_allclose(host, 11.0)
    held = [sys.getrefcount(e) for e in (e1, e2, e3)]
    del cap
    gc.collect()
    assert [sys.getrefcount(e) for e in (e1, e2, e3)] == held  # the capture held none


def test_other_threads_pass_through(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    a, mine, theirs = buf(np.ones(N)), buf(np.zeros(N)), buf(np.zeros(N))
    other_queue = cl.CommandQueue(queue.context)
    started, recorded = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            started.wait(10)
            for _ in range(5):
                kernels.axpy(other_queue, (N,), None, theirs, a, 1.0)
                cl.enqueue_copy(other_queue, theirs, np.full(N, 7.0, np.float32))
            other_queue.finish()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            recorded.set()

    t = threading.Thread(target=other)
    t.start()
    cap = KernelCapture()
    cap.begin()
    started.set()
    kernels.add(queue, (N,), None, mine, a, a)
    recorded.wait(10)
    kernels.add(queue, (N,), None, mine, mine, a)
    n = cap.end()
    t.join(10)
    assert not errors
    assert n == 2
    assert all(r.queue is queue for r in cap.commands)
    np.testing.assert_allclose(host_read(theirs, N), 7.0)


def test_two_threads_record_their_own_captures(
    queue: cl.CommandQueue, kernels: Any, buf: Any
) -> None:
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    barrier = threading.Barrier(2, timeout=10)
    counts: dict[str, int] = {}

    def record(name: str, launches: int) -> None:
        q = cl.CommandQueue(queue.context)
        cap = KernelCapture()
        cap.begin()
        barrier.wait()
        for _ in range(launches):
            kernels.add(q, (N,), None, out, a, a)
        barrier.wait()
        counts[name] = cap.end()

    threads = [threading.Thread(target=record, args=(n, k)) for n, k in (("x", 2), ("y", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert counts == {"x": 2, "y": 3}


def test_dropped_recording_capture_unpatches(queue: cl.CommandQueue) -> None:
    cap = KernelCapture()
    cap.begin()
    assert _intercept.is_patched()
    del cap
    gc.collect()
    assert not _intercept.is_patched()


def test_reset_stops_a_recording(queue: cl.CommandQueue, kernels: Any, buf: Any) -> None:
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()
    cap.begin()
    kernels.add(queue, (N,), None, out, a, a)
    cap.reset()
    assert not cap.is_recording and not _intercept.is_patched()
    assert cap.num_launches == 0 and cap.replay_count == 0
    with pytest.raises(RuntimeError, match="end: not recording"):
        cap.end()
