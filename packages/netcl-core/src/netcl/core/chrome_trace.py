"""A span exporter that writes a timeline file: Chrome trace-event JSON, which Perfetto UI
(ui.perfetto.dev, "Open trace file") and ``chrome://tracing`` open; selected with
``OTEL_TRACES_EXPORTER=chrome_trace``. The package's guide says what goes where. Times in the file
are microseconds from the first span; ``otherData.epoch_ns`` gives that instant on the host clock.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from netcl.core import paths, settings

__all__ = ["DEVICE_PREFIX", "TRACE_FILE_VARIABLE", "ChromeTraceExporter"]

#: Spans whose name starts with this go on a device track.
DEVICE_PREFIX = "netcl.device."
#: The variable naming the output file.
TRACE_FILE_VARIABLE = settings.TRACE_FILE.name


class _Slice(NamedTuple):
    track: str  # "host: name" or "device: name"
    title: str
    start_ns: int
    end_ns: int
    span_id: int
    parent_id: int
    args: dict[str, Any]


class ChromeTraceExporter(SpanExporter):
    """Collects finished spans and writes them to ``path`` (default: ``NETCL_TRACE_FILE`` or
    ``netcl-trace.json``) as Chrome trace-event JSON. Keeps at most ``max_spans`` spans (the
    first ones); the file says how many were left out."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, max_spans: int = 1_000_000
    ) -> None:
        self.path = Path(path or settings.TRACE_FILE.value(settings.TRACE_FILE.default_text()))
        self.max_spans = max_spans
        self._slices: list[_Slice] = []
        self._left_out = 0
        self._lock = threading.Lock()
        self._written = -1

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        converted = [_slice(s) for s in spans]
        with self._lock:
            room = self.max_spans - len(self._slices)
            self._slices.extend(converted[: max(room, 0)])
            self._left_out += max(len(converted) - max(room, 0), 0)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.write()
        return True

    def shutdown(self) -> None:
        self.write()

    def write(self) -> Path:
        """Write the file now (skipped when nothing changed since the last write)."""
        with self._lock:
            slices, left_out = list(self._slices), self._left_out
            if len(slices) + left_out == self._written:
                return self.path
            self._written = len(slices) + left_out
        data = json.dumps(_document(slices, left_out), separators=(",", ":")).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(self.path, data, prefix=f".{self.path.name}.")
        return self.path


def _slice(span: ReadableSpan) -> _Slice:
    attrs = dict(span.attributes or {})
    start = span.start_time or 0
    end = max(span.end_time or start, start)
    if span.name.startswith(DEVICE_PREFIX):
        track = f"device: {attrs.get('netcl.device.name', 'unknown')}"
        title = str(attrs.get("netcl.kernel.name") or span.name)
    else:
        service = span.resource.attributes.get("service.name", "unknown") if span.resource else ""
        track, title = f"host: {service}", span.name
    args: dict[str, Any] = {
        k: v if isinstance(v, (str, int, float, bool)) else list(v)  # type: ignore[arg-type]
        for k, v in attrs.items()
    }
    args["span"] = span.name
    args["trace_id"] = format(span.context.trace_id, "032x") if span.context else ""
    if span.status.status_code.name == "ERROR":
        args["status"] = f"ERROR: {span.status.description or ''}"
    parent = span.parent.span_id if span.parent else 0
    span_id = span.context.span_id if span.context else 0
    return _Slice(track, title, start, end, span_id, parent, args)


def _ordered(slices: list[_Slice]) -> list[_Slice]:
    """By start, longest first, parents before children (a device envelope and its only kernel
    cover the same interval): the order that nests."""
    parent = {s.span_id: s.parent_id for s in slices}

    def depth(s: _Slice) -> int:  # ancestors in the file
        n, up = 0, s.parent_id
        while up in parent and n < len(parent):  # ids that loop (spans without a context: 0)
            n, up = n + 1, parent[up]
        return n

    return sorted(slices, key=lambda s: (s.start_ns, -s.end_ns, depth(s)))


def _lanes(slices: list[_Slice]) -> list[int]:
    """A row per slice (in :func:`_ordered` order) such that the slices of a row nest properly
    (what the viewers draw)."""
    rows: list[list[int]] = []  # per row, the end times of the open (enclosing) slices
    lane = [0] * len(slices)
    for i, s in enumerate(slices):
        for r, stack in enumerate(rows):
            while stack and stack[-1] <= s.start_ns:
                stack.pop()
            if not stack or stack[-1] >= s.end_ns:
                stack.append(s.end_ns)
                lane[i] = r + 1
                break
        else:
            rows.append([s.end_ns])
            lane[i] = len(rows)
    return lane


def _document(slices: list[_Slice], left_out: int) -> dict[str, Any]:
    epoch = min((s.start_ns for s in slices), default=0)
    tracks = sorted({s.track for s in slices}, key=lambda t: (not t.startswith("host"), t))
    pid = {t: n + 1 for n, t in enumerate(tracks)}
    events: list[dict[str, Any]] = []
    where: dict[int, dict[str, float]] = {}  # span id -> its slice's pid, tid and ts
    for t in tracks:
        events.append({"ph": "M", "name": "process_name", "pid": pid[t], "args": {"name": t}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid[t], "args": {"sort_index": pid[t]}}
        )
        kind = t.split(":")[0]  # host or device
        mine = _ordered([s for s in slices if s.track == t])
        for s, tid in zip(mine, _lanes(mine), strict=True):
            at = where[s.span_id] = {"pid": pid[t], "tid": tid, "ts": (s.start_ns - epoch) / 1e3}
            dur = (s.end_ns - s.start_ns) / 1e3
            events.append(
                {"ph": "X", "name": s.title, "cat": kind, **at, "dur": dur, "args": s.args}
            )
    host = {s.span_id for s in slices if s.track.startswith("host")}
    for n, s in enumerate(slices):  # arrows from a host span to the top device span under it
        if s.track.startswith("device") and s.parent_id in host:
            common = {"name": "device work", "cat": "flow", "id": n + 1}
            events.append({**common, "ph": "s", **where[s.parent_id]})
            events.append({**common, "ph": "f", "bp": "e", **where[s.span_id]})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"epoch_ns": epoch, "spans": len(slices), "spans_left_out": left_out},
    }
