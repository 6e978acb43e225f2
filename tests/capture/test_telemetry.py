"""Spans and metrics of capture and replay (names are API)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.capture import KernelCapture

N = 32


def _total(points: list[Any]) -> int:
    return int(sum(p.value for p in points))


def test_record_and_replay_spans_and_metrics(
    queue: cl.CommandQueue, kernels: Any, buf: Any, spans: Any, metric_points: Any
) -> None:
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    replays0 = _total(metric_points("netcl.capture.replays"))
    launches0 = _total(metric_points("netcl.capture.replayed_launches"))
    cap = KernelCapture()
    cap.begin()
    for _ in range(3):
        kernels.add(queue, (N,), None, out, a, a)
        queue.finish()  # a host wait: no command
    cl.enqueue_copy(queue, out, a)
    cap.end()
    cap.replay()
    cap.replay_with_new_buffers({a.int_ptr: buf(np.ones(N))})
    finished = spans.get_finished_spans()
    assert [s.name for s in finished] == [
        "netcl.capture.record",
        "netcl.capture.replay",
        "netcl.capture.replay",
    ]
    record, plain, rebound = finished
    assert record.attributes["netcl.capture.launches"] == 3
    assert record.attributes["netcl.capture.commands"] == 4  # the launches and the copy
    assert plain.attributes["netcl.capture.launches"] == 3
    assert plain.attributes["netcl.capture.rebound"] == 0
    assert rebound.attributes["netcl.capture.rebound"] == 1
    assert record.instrumentation_scope.name == "netcl.runtime.capture"
    assert _total(metric_points("netcl.capture.replays")) - replays0 == 2
    assert _total(metric_points("netcl.capture.replayed_launches")) - launches0 == 6


def test_no_sdk_replay_works_and_skips_telemetry() -> None:
    """Without an SDK the replay takes the fast path (run in a fresh interpreter)."""
    code = textwrap.dedent(
        """
        import numpy as np, pyopencl as cl
        from opentelemetry import trace
        from netcl.core import device, telemetry
        from netcl.runtime.capture import KernelCapture, _telemetry
        q = device.default_queue()
        prg = cl.Program(q.context, "__kernel void inc(__global float *x) "
                         "{ x[get_global_id(0)] += 1.0f; }").build()
        k = cl.Kernel(prg, "inc")
        x = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 64)
        cl.enqueue_fill_buffer(q, x, np.float32(0), 0, 64)
        cap = KernelCapture()
        cap.begin(); k(q, (16,), None, x); cap.end()
        started = []
        telemetry.Scope.span = lambda *a, **k: started.append(a)
        _telemetry.TEL.tracer.start_span = lambda *a, **k: started.append(a)
        for _ in range(4): cap.replay()
        out = np.empty(16, np.float32); cl.enqueue_copy(q, out, x)
        assert trace._TRACER_PROVIDER is None
        assert started == [], started
        totals = (_telemetry.REPLAYS.get(), _telemetry.REPLAYED_LAUNCHES.get())
        assert totals == (4, 4), totals
        assert (out == 5).all(), out
        print("ok", cap.replay_count)
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok 4"


def test_a_failing_sdk_changes_no_result(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any, hostile_sdk: Any
) -> None:
    """Span processors raising in on_start and on_end, a metric reader raising on record and
    collect: begin/end/replay/replay_with_new_buffers return what they would without them."""
    a, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()
    cap.begin()
    assert cap.is_recording
    for _ in range(3):
        kernels.add(queue, (N,), None, out, a, a)
    assert cap.end() == 3
    hostile_sdk()
    cl._cl._enqueue_fill_buffer(queue, out, np.float32(0), 0, 4 * N)
    done = cap.replay()
    assert isinstance(done, cl.Event)
    done.wait()
    np.testing.assert_allclose(host_read(out, N), 2.0)
    a2 = buf(np.full(N, 4.0))
    done = cap.replay_with_new_buffers({a.int_ptr: a2})
    assert isinstance(done, cl.Event)
    done.wait()
    np.testing.assert_allclose(host_read(out, N), 8.0)
    hostile_sdk()
    with pytest.raises(ValueError, match="matches no buffer"):  # errors still reach the caller
        cap.replay_with_new_buffers({buf(np.zeros(N)).int_ptr: a2})
    assert cap.replay_count == 2
    with cap:  # and as a context manager
        kernels.add(queue, (N,), None, out, a, a)
    assert cap.num_launches == 1
    hostile_sdk()
