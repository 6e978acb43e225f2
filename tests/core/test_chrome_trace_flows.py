"""The timeline file's arrows and clock: each arrow runs from a host step's slice to the device
replay under it (a viewer draws it between those two points), ``otherData.epoch_ns`` is the
host-clock instant of time 0, and a write that fails leaves no temporary file behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import profiling, telemetry
from netcl.core.chrome_trace import ChromeTraceExporter

T = telemetry.Scope("netcl.test", "0")
SOURCE = "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }"


def test_arrows_join_a_host_step_to_its_device_replay(
    ctx: cl.Context, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    kernel = cl.Kernel(cl.Program(ctx, SOURCE).build(), "twice")
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
    kernel.set_args(buf)
    collector = profiling.Collector()
    for _ in range(2):
        with T.span("netcl.test.step") as host:
            events = [cl.enqueue_nd_range_kernel(q, kernel, (1024,), None)]
            events.append(cl.enqueue_copy(q, np.empty(1024, np.float32), buf, is_blocking=False))
            collector.watch(profiling.REPLAY, events, labels=["twice"], parent=host)
            q.finish()
    assert collector.flush() == 0
    finished = spans.get_finished_spans()
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export(finished)
    doc = json.loads(exporter.write().read_text())
    assert doc["otherData"]["epoch_ns"] == min(s.start_time or 0 for s in finished)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    steps = [s for s in slices if s["name"] == "netcl.test.step"]
    replays = [s for s in slices if s["name"] == "netcl.device.replay"]
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    ends = [e for e in doc["traceEvents"] if e["ph"] == "f"]
    assert len(steps) == len(replays) == len(starts) == len(ends) == 2
    ids = {e["id"] for e in starts}
    assert len(ids) == 2 and {e["id"] for e in ends} == ids
    at = lambda e: (e["pid"], e["tid"], e["ts"])  # noqa: E731
    assert sorted(map(at, starts)) == sorted(map(at, steps))
    assert sorted(map(at, ends)) == sorted(map(at, replays))
    assert all(e["bp"] == "e" and e["cat"] == "flow" for e in ends)


def test_a_failed_write_leaves_no_temporary_file(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    with T.span("netcl.test.step"):
        pass
    target = tmp_path / "trace.json"
    target.mkdir()  # a folder where the file should go: the final rename fails
    exporter = ChromeTraceExporter(target)
    exporter.export(spans.get_finished_spans())
    with pytest.raises(IsADirectoryError):
        exporter.write()
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]
