"""The timeline file, whole: from spans with known times, attributes, resources and statuses,
the exact Chrome trace-event document (tracks host first, each slice's lane, title, category,
microseconds from the first span, arguments, the arrows from host steps to device work, and
the counts in ``otherData``)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode

from netcl.core.chrome_trace import ChromeTraceExporter

TRACE = 0xABC
SERVICE = Resource({"service.name": "svc"})


def _span(
    name: str,
    span_id: int,
    start: int,
    end: int | None,
    *,
    parent: int = 0,
    attributes: dict[str, Any] | None = None,
    resource: Resource = SERVICE,
    status: Status | None = None,
) -> ReadableSpan:
    """A finished span as the SDK hands it to an exporter (times in ns)."""
    return ReadableSpan(
        name=name,
        context=SpanContext(TRACE, span_id, is_remote=False),
        parent=SpanContext(TRACE, parent, is_remote=False) if parent else None,
        resource=resource,
        attributes=attributes or {},
        start_time=start,
        end_time=end,
        status=status or Status(StatusCode.UNSET),
    )


def _spans() -> list[ReadableSpan]:
    """A host step with two children (given latest first, named against the time order) and a
    device replay under it holding one kernel of a device with no name; a failed host span of
    another service; a span never ended; one of the same service overlapping the step's end."""
    return [
        _span("step", 1, 1_000, 9_000, attributes={"netcl.n": 3, "netcl.dims": (4, 2)}),
        _span("a.later", 3, 4_000, 5_000, parent=1),
        _span("b.earlier", 2, 2_000, 3_000, parent=1),
        _span(
            "netcl.device.replay",
            4,
            2_500,
            6_000,
            parent=1,
            attributes={"netcl.device.name": "pocl-cpu"},
        ),
        _span(
            "netcl.device.kernel",
            5,
            2_500,
            6_000,
            parent=4,
            attributes={"netcl.kernel.name": "twice", "netcl.device.name": "pocl-cpu"},
        ),
        _span("netcl.device.copy", 6, 7_000, 7_500, parent=1),
        _span(
            "failed",
            7,
            8_000,
            12_000,
            resource=Resource({}),
            status=Status(StatusCode.ERROR, "boom"),
        ),
        _span("open", 8, 1_500, None),
        _span("overlap", 9, 8_500, 10_000),
    ]


def _x(
    name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {**args, "trace_id": format(TRACE, "032x")},
    }


def _meta(pid: int, track: str) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": track}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
    ]


EXPECTED_EVENTS = [
    *_meta(1, "host: svc"),
    _x("step", "host", 1, 1, 0.0, 8.0, {"netcl.n": 3, "netcl.dims": [4, 2], "span": "step"}),
    _x("open", "host", 1, 1, 0.5, 0.0, {"span": "open"}),
    _x("b.earlier", "host", 1, 1, 1.0, 1.0, {"span": "b.earlier"}),
    _x("a.later", "host", 1, 1, 3.0, 1.0, {"span": "a.later"}),
    _x("overlap", "host", 1, 2, 7.5, 1.5, {"span": "overlap"}),
    *_meta(2, "host: unknown"),
    _x("failed", "host", 2, 1, 7.0, 4.0, {"span": "failed", "status": "ERROR: boom"}),
    *_meta(3, "device: pocl-cpu"),
    _x(
        "netcl.device.replay",
        "device",
        3,
        1,
        1.5,
        3.5,
        {"netcl.device.name": "pocl-cpu", "span": "netcl.device.replay"},
    ),
    _x(
        "twice",
        "device",
        3,
        1,
        1.5,
        3.5,
        {
            "netcl.kernel.name": "twice",
            "netcl.device.name": "pocl-cpu",
            "span": "netcl.device.kernel",
        },
    ),
    *_meta(4, "device: unknown"),
    _x("netcl.device.copy", "device", 4, 1, 6.0, 0.5, {"span": "netcl.device.copy"}),
    {"name": "device work", "cat": "flow", "id": 4, "ph": "s", "pid": 1, "tid": 1, "ts": 0.0},
    {
        "name": "device work",
        "cat": "flow",
        "id": 4,
        "ph": "f",
        "bp": "e",
        "pid": 3,
        "tid": 1,
        "ts": 1.5,
    },
    {"name": "device work", "cat": "flow", "id": 6, "ph": "s", "pid": 1, "tid": 1, "ts": 0.0},
    {
        "name": "device work",
        "cat": "flow",
        "id": 6,
        "ph": "f",
        "bp": "e",
        "pid": 4,
        "tid": 1,
        "ts": 6.0,
    },
]


def test_the_whole_document_of_known_spans(tmp_path: Path) -> None:
    """Every event of the file for known spans, in order: tracks sorted host first, slices by
    start (longest, then outermost, first) in lanes that nest, kernel slices titled by kernel,
    failures marked, arrows only from a host span to the device span under it."""
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export(_spans())
    path = exporter.write()
    assert path == tmp_path / "trace.json"
    doc = json.loads(path.read_text())
    assert doc["traceEvents"] == EXPECTED_EVENTS
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"] == {"epoch_ns": 1_000, "spans": 9, "spans_left_out": 0}


def test_spans_past_the_limit_are_counted_not_kept(tmp_path: Path) -> None:
    """With ``max_spans``, the first spans are kept and the file counts those left out; a write
    with nothing new keeps the file as it is."""
    exporter = ChromeTraceExporter(tmp_path / "trace.json", max_spans=3)
    exporter.export(_spans()[:2])
    exporter.export(_spans()[2:5])
    assert exporter.force_flush() is True
    doc = json.loads((tmp_path / "trace.json").read_text())
    assert doc["otherData"] == {"epoch_ns": 1_000, "spans": 3, "spans_left_out": 2}
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"] == [
        "step",
        "b.earlier",
        "a.later",
    ]
    (tmp_path / "trace.json").write_text("kept")
    exporter.shutdown()
    assert (tmp_path / "trace.json").read_text() == "kept"


def test_the_file_defaults_to_the_variable_else_netcl_trace_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No path given: ``NETCL_TRACE_FILE`` when set (and not blank), else ``netcl-trace.json``
    in the working folder."""
    monkeypatch.delenv("NETCL_TRACE_FILE", raising=False)
    assert ChromeTraceExporter().path == Path("netcl-trace.json")
    monkeypatch.setenv("NETCL_TRACE_FILE", "  ")
    assert ChromeTraceExporter().path == Path("netcl-trace.json")
    monkeypatch.setenv("NETCL_TRACE_FILE", str(tmp_path / "t.json"))
    assert ChromeTraceExporter().path == tmp_path / "t.json"
    assert ChromeTraceExporter(tmp_path / "given.json").path == tmp_path / "given.json"


def test_a_span_without_times_sits_at_the_host_clocks_zero(tmp_path: Path) -> None:
    """A span the SDK hands over without start or end time is a zero-length slice at host
    time 0 (``otherData.epoch_ns`` 0), not an error."""
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export([_span("untimed", 1, None, None)])  # type: ignore[arg-type]
    doc = json.loads(exporter.write().read_text())
    assert doc["otherData"] == {"epoch_ns": 0, "spans": 1, "spans_left_out": 0}
    assert [e for e in doc["traceEvents"] if e["ph"] == "X"] == [
        _x("untimed", "host", 1, 1, 0.0, 0.0, {"span": "untimed"})
    ]


def test_a_span_without_a_context_has_an_empty_trace_id(tmp_path: Path) -> None:
    """A span handed over without a span context (under a parent from elsewhere) still gets its
    slice, with trace id ``""``."""
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export(
        [
            ReadableSpan(
                name="bare",
                context=None,
                resource=SERVICE,
                start_time=5,
                end_time=2_005,
                parent=SpanContext(TRACE, 7, is_remote=True),
            )
        ]
    )
    doc = json.loads(exporter.write().read_text())
    (bare,) = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert (bare["name"], bare["ts"], bare["dur"], bare["args"]) == (
        "bare",
        0.0,
        2.0,
        {"span": "bare", "trace_id": ""},
    )


def test_spans_without_a_context_or_parent_are_written(tmp_path: Path) -> None:
    """Spans handed over with neither a span context nor a parent (both ids 0, as if each were
    its own parent) are written, in start order: the exporter once looked for their depth
    forever, and ``write`` (and so ``shutdown``) hung."""
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export(
        [
            ReadableSpan(
                name=name, context=None, resource=SERVICE, start_time=start, end_time=start + 1_000
            )
            for name, start in (("b", 9), ("a", 5))
        ]
    )
    done = threading.Thread(target=exporter.write, daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "write() did not return"
    doc = json.loads((tmp_path / "trace.json").read_text())
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"] == ["a", "b"]


def test_spans_starting_together_nest_longest_first(tmp_path: Path) -> None:
    """Two spans that start at the same time, neither the other's parent, share one lane: the
    longer one encloses the shorter, whatever order the SDK hands them over in."""
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export([_span("short", 1, 1_000, 2_000), _span("long", 2, 1_000, 5_000)])
    doc = json.loads(exporter.write().read_text())
    assert [(e["name"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"] == [
        ("long", 1),
        ("short", 1),
    ]


def test_a_chain_of_spans_over_one_interval_nests_parents_first(tmp_path: Path) -> None:
    """Four spans each the parent of the next, all over the same interval (an envelope, its
    only step, its only kernel...), handed over deepest first: the file lists them parents
    first, as the viewers nest them, on one lane."""
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    chain = [_span(name, n, 1_000, 5_000, parent=n - 1) for n, name in enumerate("abcd", 1)]
    exporter.export(chain[::-1])
    doc = json.loads(exporter.write().read_text())
    assert [(e["name"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"] == [
        ("a", 1),
        ("b", 1),
        ("c", 1),
        ("d", 1),
    ]


def test_the_file_is_written_through_a_hidden_temporary_file_of_this_process(
    tmp_path: Path,
) -> None:
    """Written through ``.<name>.<pid>.*.tmp`` beside it (hidden; a cleaner can tell whose it
    is), removed when the rename fails: here the path is a folder."""
    (tmp_path / "trace.json").mkdir()
    exporter = ChromeTraceExporter(tmp_path / "trace.json")
    exporter.export(_spans())
    with pytest.raises(OSError) as info:
        exporter.write()
    assert Path(info.value.filename).name.startswith(f".trace.json.{os.getpid()}."), info.value
    assert Path(info.value.filename).parent == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # nothing left behind
