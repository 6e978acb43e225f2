from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import log, telemetry


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_fast_path_without_sdk() -> None:
    proc = _run(
        """
        import timeit
        from opentelemetry import trace
        from netcl.core import telemetry
        assert telemetry.tracing() is False
        t = telemetry.tracer("netcl.test", "netcl-core")
        with telemetry.span(t, "netcl.test.span") as s:
            assert s is None
        assert trace.get_current_span().get_span_context().is_valid is False
        n = 200_000
        per_call = min(timeit.repeat(telemetry.tracing, number=n, repeat=5)) / n
        assert per_call < 1e-6, f"tracing() costs {per_call * 1e9:.0f} ns"
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_spans_with_sdk(spans: InMemorySpanExporter) -> None:
    assert telemetry.tracing() is True
    t = telemetry.tracer("netcl.test", "netcl-core")
    with telemetry.span(t, "netcl.test.outer", {"netcl.test.n": 3}) as s:
        assert s is not None and s.is_recording()
    (finished,) = spans.get_finished_spans()
    assert finished.name == "netcl.test.outer"
    assert finished.attributes == {"netcl.test.n": 3}
    assert finished.instrumentation_scope.name == "netcl.test"


def test_library_logging_is_silent_when_unconfigured() -> None:
    proc = _run(
        """
        from netcl.core.log import get_logger
        get_logger("netcl.runtime.cache").warning("cache_entry_corrupt", path="/x", reason="bad")
        get_logger("netcl.runtime.cache").error("boom")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


def test_configure_logging_json_with_trace_ids() -> None:
    buf = io.StringIO()
    handler = log.configure_logging(logging.INFO, json=True, stream=buf)
    try:
        logger = log.get_logger("netcl.test.log")
        t = telemetry.tracer("netcl.test", "netcl-core")
        with t.start_as_current_span("netcl.test.log") as s:
            logger.warning("something_happened", path="/tmp/x", size=3)
        logger.debug("not_shown")
    finally:
        logging.getLogger("netcl").removeHandler(handler)
        logging.getLogger("netcl").setLevel(logging.NOTSET)
    (line,) = buf.getvalue().splitlines()
    event = json.loads(line)
    assert event["event"] == "something_happened"
    assert event["path"] == "/tmp/x" and event["size"] == 3
    assert event["level"] == "warning"
    assert event["logger"] == "netcl.test.log"
    assert event["trace_id"] == format(s.get_span_context().trace_id, "032x")
    assert event["span_id"] == format(s.get_span_context().span_id, "016x")


def test_configure_console_prints_one_line_per_span_and_metric() -> None:
    proc = _run(
        """
        import io, os
        for v in list(os.environ):
            if v.startswith("OTEL_"):
                del os.environ[v]
        from netcl.core import telemetry
        buf = io.StringIO()
        telemetry.configure(console_out=buf)
        assert telemetry.tracing() is True
        assert telemetry.configure() is telemetry.configure()  # idempotent
        t = telemetry.tracer("netcl.test", "netcl-core")
        with telemetry.span(t, "netcl.test.configured", {"netcl.test.k": 7}):
            pass
        telemetry.meter("netcl.test", "netcl-core").create_counter("netcl.test.count").add(2)
        telemetry.shutdown()
        print(buf.getvalue())
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    span_lines = [ln for ln in lines if ln.startswith("span netcl.test.configured ")]
    assert len(span_lines) == 1 and span_lines[0].endswith("netcl.test.k=7"), proc.stdout
    assert "metric netcl.test.count{} 2" in lines, proc.stdout
