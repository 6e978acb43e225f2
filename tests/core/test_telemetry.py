from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import log, telemetry


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
    )


# An application: configure(), one parent and one failing child span, a counter, shutdown.
_APP = """
    import io, sys
    from netcl.core import telemetry
    p = telemetry.configure(console={console})
    t = telemetry.Scope("netcl.test", "0")
    with t.span("netcl.test.outer", {{"netcl.test.k": 7}}):
        with t.span("netcl.test.inner") as s:
            s.fail("line_two", "line one\\nline two")
            s.set("netcl.compile.log", "error: x\\n  at y")
    t.histogram("netcl.test.count", "1", "a test histogram").record(2)
    print("service.name=" + p["tracer_provider"].resource.attributes["service.name"])
    print("exporters=" + repr(p["exporters"]))
    telemetry.shutdown()
"""


def test_fast_path_without_sdk() -> None:
    proc = _run(
        """
        import timeit
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from netcl.core import telemetry
        assert telemetry.tracing() is False
        t = telemetry.Scope("netcl.test", "0")
        with t.span("netcl.test.span") as s:
            assert s.recording is False
        assert trace.get_current_span().get_span_context().is_valid is False
        n = 200_000
        per_call = min(timeit.repeat(telemetry.tracing, number=n, repeat=5)) / n
        assert per_call < 1e-6, f"tracing() costs {per_call * 1e9:.0f} ns"
        # a provider installed by hand after netcl ran is seen within a bounded number of calls
        trace.set_tracer_provider(TracerProvider())
        seen = next(i for i in range(10_000) if telemetry.tracing())
        assert seen <= 1024, seen
        assert all(telemetry.tracing() for _ in range(1000))  # latched
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_tracing_reads_no_private_api() -> None:
    source = inspect.getsource(sys.modules[telemetry.tracing.__module__])
    assert "_TRACER_PROVIDER" not in source and "trace._" not in source


def test_sdk_configurator_api_is_what_configure_uses() -> None:
    """configure() delegates to the SDK's private configurator (what opentelemetry-instrument
    runs): this fails first when a new SDK release changes it."""
    from opentelemetry.sdk._configuration import (
        _get_exporter_names,
        _initialize_components,
        _OTelSDKConfigurator,
    )

    params = inspect.signature(_initialize_components).parameters
    for name in (
        "trace_exporter_names",
        "metric_exporter_names",
        "resource_attributes",
        "exporter_args_map",
    ):
        assert name in params, name
    assert callable(_OTelSDKConfigurator().configure)
    assert list(inspect.signature(_get_exporter_names).parameters) == ["signal_type"]


def test_spans_with_sdk(spans: InMemorySpanExporter) -> None:
    assert telemetry.tracing() is True
    t = telemetry.Scope("netcl.test", "0")
    with t.span("netcl.test.outer", {"netcl.test.n": 3}) as s:
        assert s.recording
    (finished,) = spans.get_finished_spans()
    assert finished.name == "netcl.test.outer"
    assert finished.attributes == {"netcl.test.n": 3}
    assert finished.instrumentation_scope.name == "netcl.test"


def test_console_lines_carry_ids_and_status_on_one_line() -> None:
    proc = _run(_APP.format(console=True))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    outer = [ln for ln in lines if ln.startswith("span netcl.test.outer ")]
    inner = [ln for ln in lines if ln.startswith("span netcl.test.inner ")]
    assert len(outer) == 1 and len(inner) == 1, proc.stderr
    fields = dict(f.split("=", 1) for f in outer[0].split()[4:])
    assert len(fields["trace_id"]) == 32 and len(fields["span_id"]) == 16
    assert fields["parent_id"] == "-" and fields["status"] == "UNSET"
    assert fields["netcl.test.k"] == "7"
    assert f"trace_id={fields['trace_id']}" in inner[0]
    assert f"parent_id={fields['span_id']}" in inner[0]
    # multi-line values stay on the span's line, JSON-quoted
    assert 'status=ERROR status.description="line one\\nline two"' in inner[0]
    assert 'netcl.compile.log="error: x\\n  at y"' in inner[0]
    assert "metric netcl.test.count{} count=1 sum=2" in lines, proc.stderr
    assert "service.name=netcl" in proc.stdout


def test_standard_variables_turn_exporters_off() -> None:
    proc = _run(
        _APP.format(console=False), OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    # nothing configured at all: still nothing printed
    assert _run(_APP.format(console=False)).stderr == ""


def test_unknown_exporter_is_a_clear_error() -> None:
    proc = _run(
        """
        from netcl.core import telemetry
        try:
            telemetry.configure()
        except telemetry.ConfigError as exc:
            print(exc)
            assert isinstance(exc, ValueError) and exc.variable == "OTEL_TRACES_EXPORTER"
        assert telemetry.tracing() is False  # nothing half-installed
        """,
        OTEL_TRACES_EXPORTER="zipkin_json_typo",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1, proc.stdout  # one line
    assert proc.stdout.startswith("OTEL_TRACES_EXPORTER='zipkin_json_typo' is not valid: ")
    for name in ("otlp", "console", "chrome_trace", "none"):
        assert name in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("variable", "value", "accepts"),
    [
        ("OTEL_TRACES_EXPORTER", "consol", "a comma-separated list of otlp, chrome_trace, console"),
        ("OTEL_METRICS_EXPORTER", "console,prometheos", "prometheus"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpcc", "grpc or http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json", "grpc or http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s", "a number > 0 (seconds)"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "1.5", "an integer > 0 (milliseconds)"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "-1", "a number > 0 (milliseconds)"),
        ("OTEL_SDK_DISABLED", "yes", "true or false"),
        ("OTEL_TRACES_SAMPLER", "always_of", "one of always_off, always_on"),
        ("OTEL_TRACES_SAMPLER_ARG", "2", "a ratio from 0 to 1"),
    ],
)
def test_bad_otel_value_is_one_line(variable: str, value: str, accepts: str) -> None:
    """A value the SDK would reject with a traceback, or silently replace with its default,
    is one line naming the variable and what it accepts; nothing is installed."""
    env = {variable: value}
    if variable == "OTEL_TRACES_SAMPLER_ARG":
        env["OTEL_TRACES_SAMPLER"] = "traceidratio"
    proc = _run(
        """
        from netcl.core import telemetry
        try:
            telemetry.configure()
        except telemetry.ConfigError as exc:
            print(exc)
        assert telemetry.tracing() is False
        """,
        **env,
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"{variable}={value!r} is not valid: expected "), line
    assert accepts in line, line


def test_sdk_disabled_installs_nothing() -> None:
    proc = _run(
        """
        from netcl.core import telemetry
        p = telemetry.configure(console=True, prometheus_port=1)
        assert p["disabled"] is True and p["exporters"] == {"traces": [], "metrics": [], "logs": []}
        assert telemetry.tracing() is False
        with telemetry.Scope("netcl.test", "0").span("netcl.test.s") as s:
            assert not s.recording
        assert telemetry.shutdown() is True
        print("ok")
        """,
        OTEL_SDK_DISABLED="True",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n" and proc.stderr == ""


def test_console_exporter_chosen_by_variable_uses_one_line_format() -> None:
    proc = _run(_APP.format(console=False), OTEL_TRACES_EXPORTER="console")
    assert proc.returncode == 0, proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("span ")]) == 2
    assert "metric " not in proc.stderr


_EXPORTERS = {  # OTLP protocol -> the module of its trace exporter (netcl-core's `otel` extra)
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}


def _otlp(protocol: str) -> Any:
    """Skip the test, saying why, where the OTLP exporter for ``protocol`` is not installed (an
    optional extra: the rest of this file runs without it); else OTLP's trace service module."""
    reason = (
        f"the OTLP/{protocol} exporter is not installed (netcl-core's optional `otel` extra: "
        "pip install 'netcl-core[otel]')"
    )
    pytest.importorskip(_EXPORTERS[protocol], reason=reason)
    return pytest.importorskip(
        "opentelemetry.proto.collector.trace.v1.trace_service_pb2", reason=reason
    )


class _Traces:
    """What an OTLP/gRPC trace service received."""

    def __init__(self) -> None:
        self.requests: list[Any] = []  # trace_service_pb2.ExportTraceServiceRequest


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[int, _Traces]]:
    """A real OTLP/gRPC trace receiver on loopback."""
    pb2 = _otlp("grpc")
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    traces = _Traces()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: object) -> Any:  # noqa: N802 (the service's)
            traces.requests.append(request)
            return pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, traces
    server.stop(None)


@pytest.fixture
def http_receiver() -> Iterator[tuple[int, list[tuple[str, bytes]]]]:
    """A real OTLP/HTTP receiver on loopback: records (path, body) of every POST."""
    posts: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            posts.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], posts
    server.shutdown()


def _resource_attrs(request: Any) -> dict[str, str]:  # an ExportTraceServiceRequest
    (rs,) = request.resource_spans
    return {a.key: a.value.string_value for a in rs.resource.attributes}


def test_otlp_grpc_by_protocol_variable(grpc_receiver: tuple[int, _Traces]) -> None:
    port, traces = grpc_receiver
    proc = _run(
        _APP.format(console=False),
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_METRICS_EXPORTER="none",
        OTEL_RESOURCE_ATTRIBUTES="service.name=from-attributes,deployment.environment=test",
    )
    assert proc.returncode == 0, proc.stderr
    assert "service.name=from-attributes" in proc.stdout
    assert "exporters={'traces': ['otlp_proto_grpc'], 'metrics': [], 'logs': []}" in proc.stdout
    names = {
        s.name
        for r in traces.requests
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    assert names == {"netcl.test.outer", "netcl.test.inner"}, proc.stderr
    attrs = _resource_attrs(traces.requests[0])
    assert attrs["service.name"] == "from-attributes"
    assert attrs["deployment.environment"] == "test"


def test_otlp_http_by_protocol_variable(http_receiver: tuple[int, list[tuple[str, bytes]]]) -> None:
    trace_service_pb2 = _otlp("http/protobuf")
    port, posts = http_receiver
    proc = _run(
        _APP.format(console=False),
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_SERVICE_NAME="from-service-name",
    )
    assert proc.returncode == 0, proc.stderr
    assert "service.name=from-service-name" in proc.stdout
    assert "'traces': ['otlp_proto_http'], 'metrics': ['otlp_proto_http']" in proc.stdout
    paths = {path for path, _ in posts}
    assert paths == {"/v1/traces", "/v1/metrics"}, (paths, proc.stderr)
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(next(body for path, body in posts if path == "/v1/traces"))
    assert _resource_attrs(request)["service.name"] == "from-service-name"


def test_configure_leaves_an_installed_sdk_alone() -> None:
    proc = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from netcl.core import telemetry
        mine = TracerProvider()
        trace.set_tracer_provider(mine)
        assert telemetry.configure()["tracer_provider"] is mine
        assert telemetry.configure() is telemetry.configure()  # idempotent
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok" and "Overriding" not in proc.stderr


def test_scope_span_survives_a_failing_sdk(
    spans: InMemorySpanExporter,
    hostile_sdk: Callable[[], None],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A span processor raising in on_start/on_end and a metric reader raising never reach the
    caller; each kind of failure is logged once."""
    # the once-per-kind memory is process-wide: start from none reported, as a fresh process does
    monkeypatch.setattr(log, "_warned", set())
    t = telemetry.Scope("netcl.test", "0")
    histogram = t.histogram("netcl.test.hostile", "1", "a test histogram")
    with caplog.at_level("WARNING", logger="netcl.core.telemetry"):
        for _ in range(3):
            with t.span("netcl.test.hostile", {"netcl.test.n": 1}) as s:
                s.set("netcl.test.m", 2)
                histogram.record(1, {"netcl.test.series": "a"})
            hostile_sdk()
    stages = [r.getMessage().split()[1] for r in caplog.records]
    assert len(stages) == len(set(stages)), stages  # once per kind
    assert any("start" in m for m in stages) and any("metric" in m for m in stages), stages


def test_scope_span_records_failure_and_reraises(spans: InMemorySpanExporter) -> None:
    t = telemetry.Scope("netcl.test", "0")
    with pytest.raises(KeyError), t.span("netcl.test.fails"):
        raise KeyError("k")
    (span,) = spans.get_finished_spans()
    assert span.attributes is not None and span.attributes["error.type"] == "KeyError"
    assert span.status.status_code.name == "ERROR"


def test_error_type_is_fully_qualified() -> None:
    class LocalError(Exception):
        pass

    assert telemetry.error_type(ValueError()) == "ValueError"
    assert telemetry.error_type(LocalError()) == (
        f"{__name__}.test_error_type_is_fully_qualified.<locals>.LocalError"
    )
    assert telemetry.error_type("discarded") == "discarded"


def test_record_span_with_explicit_times_under_a_parent(spans: InMemorySpanExporter) -> None:
    t = telemetry.Scope("netcl.test", "0")
    with t.span("netcl.test.host") as host:
        t.record_span("netcl.test.device", 1_000, 5_000, {"netcl.test.k": 1}, parent=host)
    device, parent = spans.get_finished_spans()
    assert (device.start_time, device.end_time) == (1_000, 5_000)
    assert device.parent is not None and device.parent.span_id == parent.context.span_id


_EXPORTING_APP = """
    import time
    from netcl.core import telemetry
    telemetry.configure()
    t = telemetry.Scope("netcl.test", "0")
    for _ in range(2000):
        with t.span("netcl.test.s"):
            pass
    t.histogram("netcl.test.count", "1", "a test histogram").record(1)
    t0 = time.monotonic()
    done = telemetry.shutdown()
    print(f"shutdown {time.monotonic() - t0:.2f} s done={done}")
    for line in telemetry.export_failures():
        print("failure", line)
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("endpoint", ["refusing", "silent"])
def test_shutdown_is_bounded_when_the_collector_is_dead(
    silent_port: int, closed_port: int, protocol: str, endpoint: str
) -> None:
    _otlp(protocol)
    port = silent_port if endpoint == "silent" else closed_port
    proc = _run(
        _EXPORTING_APP,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
    )
    assert proc.returncode == 0, proc.stderr
    seconds = float(proc.stdout.split("shutdown ")[1].split()[0])
    assert seconds <= 2.5, proc.stdout  # the 2 s default per signal, side by side
    assert "failure " in proc.stdout, proc.stdout  # the application can tell
    assert "Traceback" not in proc.stderr, proc.stderr  # kept, not printed retry by retry


def test_user_timeouts_win_over_netcl_defaults(silent_port: int) -> None:
    _otlp("http/protobuf")  # OTLP's default protocol
    proc = _run(
        _EXPORTING_APP,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{silent_port}",
        OTEL_EXPORTER_OTLP_TIMEOUT="0.3",
        OTEL_BSP_EXPORT_TIMEOUT="500",
        OTEL_METRIC_EXPORT_TIMEOUT="500",
    )
    assert proc.returncode == 0, proc.stderr
    seconds = float(proc.stdout.split("shutdown ")[1].split()[0])
    assert seconds <= 0.9, proc.stdout
