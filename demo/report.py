"""The demo's printed report: span durations by name, device time, where telemetry went."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from netcl.core import profiling, table, telemetry


class SpanStats(SpanProcessor):
    """Durations of the finished spans, by span name."""

    def __init__(self) -> None:
        self.durations: dict[str, list[int]] = {}

    def on_end(self, span: ReadableSpan) -> None:
        ns = (span.end_time or 0) - (span.start_time or 0)
        self.durations.setdefault(span.name, []).append(ns)

    def table(self) -> list[str]:
        total = sum(len(d) for d in self.durations.values())
        rows = []
        for name, ns in sorted(self.durations.items()):
            ns.sort()
            p50, p99 = ns[len(ns) // 2], ns[min(len(ns) - 1, len(ns) * 99 // 100)]
            rows.append((name, len(ns), us(p50), us(p99)))
        head = (f"span ({total} in all)", "count", "p50", "p99")
        return table.table(rows, head, right=(1, 2, 3))


def us(ns: int) -> str:
    return f"{ns / 1e3:.1f} µs" if ns < 1e6 else f"{ns / 1e6:.3f} ms"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f} ms"


def rows(pairs: list[tuple[str, str]]) -> list[str]:
    return table.pairs(pairs)


def device_time(top: int = 3) -> list[str]:
    """Device time the profiling collector saw: per kind of work and the top kernels (only
    what netcl or this demo watched)."""
    stats = profiling.collector().stats()
    rows = [
        (name, count, ms(seconds).strip(), us(int(seconds / count * 1e9)))
        for name, (count, seconds) in sorted(stats.by_kind.items())
    ]
    kernels = sorted(stats.by_kernel.items(), key=lambda kv: -kv[1][1])[:top]
    rows += [
        ("kernel " + name, count, ms(seconds).strip(), us(int(seconds / count * 1e9)))
        for name, (count, seconds) in kernels
    ]
    head = ("device time (profiled)", "count", "total", "mean")
    return table.table(rows, head, right=(1, 2, 3))


def where(providers: dict[str, Any], prometheus_port: int | None) -> list[str]:
    """Where spans, metrics and logs went, one line each, and whether export failed."""
    if providers.get("disabled"):
        return ["telemetry: off (OTEL_SDK_DISABLED=true): nothing recorded, nothing exported"]
    exporters: dict[str, list[str]] = providers["exporters"]
    if not exporters:
        return ["telemetry: an OpenTelemetry SDK installed before the demo handles it"]
    lines = [
        f"{signal + ':':<9}{', '.join(_places(names, prometheus_port)) or 'not exported'}"
        if names or signal != "logs"
        else f"{'logs:':<9}stdlib logging, not configured here (netcl.core.log.configure_logging)"
        for signal, names in exporters.items()
    ]
    if not exporters["traces"]:
        lines.append("(--console-spans prints every span; the OTEL_* variables pick exporters)")
    lines += [f"export FAILED: {line}" for line in telemetry.export_failures()]
    return lines


def _places(names: list[str], prometheus_port: int | None) -> list[str]:
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the SDK's default endpoint")
    out = []
    for name in names:
        if name.startswith("otlp"):
            out.append(f"OTLP/{'gRPC' if 'grpc' in name else 'HTTP'} to {endpoint}")
        elif name == "prometheus":  # --prometheus-port, else the exporter's variables
            default = "localhost" if prometheus_port is None else "127.0.0.1"
            host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", default)
            port = prometheus_port or os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")
            out.append(f"Prometheus on http://{host}:{port}/metrics")
        elif name == "console":
            out.append("stderr, one line each")
        elif name == "chrome_trace":
            out.append(f"timeline file {os.environ.get('NETCL_TRACE_FILE', 'netcl-trace.json')}")
        else:
            out.append(name)
    return out


class Progress:
    """Progress of a loop longer than a second on stderr: on a terminal one line rewritten in
    place every 10 %; otherwise (a log file, a pipe) a plain line every few seconds, no ``\\r``."""

    EVERY_S = 5.0  #: seconds between plain lines when stderr is not a terminal

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.t0, self.shown = what, total, time.perf_counter(), -1
        self.tty = _isatty(sys.stderr)
        self.last = self.t0

    def update(self, done: int) -> None:
        now = time.perf_counter()
        pct = 100 * done // self.total
        if now - self.t0 <= 1.0:
            return
        text = f"{self.what}: {done}/{self.total} ({pct}%)"
        if self.tty:
            if pct // 10 != self.shown // 10:
                self.shown = pct
                end = "\n" if done == self.total else ""
                print(f"\r{text}", end=end, file=sys.stderr, flush=True)
        elif now - self.last >= self.EVERY_S or (done == self.total and self.shown >= 0):
            self.last, self.shown = now, pct
            print(text, file=sys.stderr, flush=True)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
