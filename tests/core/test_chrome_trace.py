"""The timeline file: Chrome trace-event JSON with host and device tracks, chosen by the SDK's
standard exporter variable through netcl-core's entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import profiling, telemetry
from netcl.core.chrome_trace import ChromeTraceExporter

T = telemetry.Scope("netcl.test", "0")
SOURCE = "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }"


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _tracks(doc: dict[str, Any]) -> dict[int, str]:
    return {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def _check_nesting(slices: list[dict[str, Any]]) -> None:
    """Slices of one row either nest or do not overlap (what the viewers can draw)."""
    rows: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for s in slices:
        rows.setdefault((s["pid"], s["tid"]), []).append((s["ts"], s["ts"] + s["dur"]))
    for row in rows.values():
        row.sort(key=lambda r: (r[0], -r[1]))
        stack: list[float] = []
        for start, end in row:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, (start, end, stack)
            stack.append(end)


def test_entry_point_selects_the_exporter() -> None:
    (ep,) = entry_points(group="opentelemetry_traces_exporter", name="chrome_trace")
    assert ep.load() is ChromeTraceExporter


def test_host_and_device_spans_on_their_own_tracks(
    ctx: cl.Context, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    kernel = cl.Kernel(cl.Program(ctx, SOURCE).build(), "twice")
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
    kernel.set_args(buf)
    collector = profiling.Collector()
    for _ in range(2):
        with T.span("netcl.test.step") as host:
            events = [cl.enqueue_nd_range_kernel(q, kernel, (1024,), None) for _ in range(3)]
            events.append(cl.enqueue_copy(q, np.empty(1024, np.float32), buf, is_blocking=False))
            collector.watch(profiling.REPLAY, events, labels=["twice"] * 3, parent=host)
            q.finish()
    assert collector.flush() == 0
    exporter = ChromeTraceExporter(tmp_path / "out" / "trace.json")
    exporter.export(spans.get_finished_spans())
    exporter.shutdown()
    doc = _load(tmp_path / "out" / "trace.json")
    tracks = _tracks(doc)
    host_pid = next(p for p, n in tracks.items() if n.startswith("host: "))
    device_pid = next(p for p, n in tracks.items() if n == f"device: {q.device.name.strip()}")
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    on = {pid: [s for s in slices if s["pid"] == pid] for pid in (host_pid, device_pid)}
    assert {s["name"] for s in on[host_pid]} == {"netcl.test.step"}
    names = sorted(s["name"] for s in on[device_pid])
    assert names == sorted(
        ["netcl.device.replay"] * 2 + ["twice"] * 6 + ["netcl.device.transfer"] * 2
    )
    assert all(s["dur"] >= 0 and s["ts"] >= 0 for s in slices)
    _check_nesting(slices)
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 4  # one arrow per host step to its device replay
    assert doc["otherData"]["spans"] == len(slices)
    # what the viewers read: times in ms, host tracks first, a category per slice
    assert doc["displayTimeUnit"] == "ms"
    order = {
        e["pid"]: e["args"]["sort_index"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_sort_index"
    }
    assert order[host_pid] < order[device_pid]
    assert {s["cat"] for s in on[host_pid]} == {"host"}
    assert {s["cat"] for s in on[device_pid]} == {"device"}
    traced = {f"{x.context.trace_id:032x}" for x in spans.get_finished_spans()}
    assert {s["args"]["trace_id"] for s in on[host_pid]} <= traced  # a slice finds its trace


def test_chosen_by_the_standard_variable(tmp_path: Path) -> None:
    code = f"""
        import numpy as np, pyopencl as cl
        from netcl.core import device, profiling, telemetry
        telemetry.configure(service_name="timeline-test")
        q = cl.CommandQueue(device.default_context(),
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
        k = cl.Kernel(cl.Program(q.context, {SOURCE!r}).build(), "twice")
        buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4096)
        k.set_args(buf)
        t = telemetry.Scope("netcl.test", "0")
        with t.span("netcl.test.step"):
            profiling.watch(profiling.REPLAY, [cl.enqueue_nd_range_kernel(q, k, (1024,), None)],
                            labels=["twice"])
            q.finish()
        telemetry.shutdown()
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    path = tmp_path / "timeline.json"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "OTEL_TRACES_EXPORTER": "chrome_trace", "NETCL_TRACE_FILE": str(path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = _load(path)
    assert sorted(_tracks(doc).values())[-1] == "host: timeline-test"
    assert any(n.startswith("device: ") for n in _tracks(doc).values())
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {"netcl.test.step", "twice", "netcl.device.replay"} <= names


def test_an_envelope_around_one_kernel_nests_above_it(
    ctx: cl.Context, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A device span and its only child cover the same interval: the parent must come first in
    the file (the viewers nest equal slices in file order)."""
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    kernel = cl.Kernel(cl.Program(ctx, SOURCE).build(), "twice")
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)  # set_args keeps no reference
    kernel.set_args(buf)
    collector = profiling.Collector()
    with T.span("netcl.test.node") as host:
        event = cl.enqueue_nd_range_kernel(q, kernel, (1024,), None)
        collector.watch(profiling.GRAPH_NODE, [event], labels=["twice"], name="n0", parent=host)
        q.finish()
    collector.flush()
    finished = list(spans.get_finished_spans())
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export(finished[::-1])  # children first, as a batch may deliver them
    exporter.shutdown()
    slices = [e for e in _load(tmp_path / "trace.json")["traceEvents"] if e["ph"] == "X"]
    node = next(i for i, s in enumerate(slices) if s["name"] == "netcl.device.node")
    twice = next(i for i, s in enumerate(slices) if s["name"] == "twice")
    assert (slices[node]["ts"], slices[node]["dur"]) == (slices[twice]["ts"], slices[twice]["dur"])
    assert node < twice and slices[node]["tid"] == slices[twice]["tid"]
