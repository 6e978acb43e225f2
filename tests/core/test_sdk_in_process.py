"""The SDK helpers an application meets, in this process (the configure tests run in
subprocesses, which the mutation run cannot see): each invalid ``OTEL_*`` value refused with
its message, a flush that runs past its deadline reported, export errors counted per exporter,
and the console exporter's line for a span."""

from __future__ import annotations

import io
import logging
import os
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import _sdk, telemetry


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("OTEL_SDK_DISABLED", "maybe", "true or false"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "udp", "grpc or http/protobuf"),
        ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "udp", "grpc or http/protobuf"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "1.5", "an integer > 0 (spans)"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "a number > 0 (seconds)"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "soon", "a number > 0 (milliseconds)"),
    ],
)
def test_configure_refuses_an_invalid_value_naming_it(
    variable: str, value: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sdk, "_configured", {})  # as in a process that never configured
    monkeypatch.setenv(variable, value)
    with pytest.raises(_sdk.ConfigError) as info:
        _sdk.configure()
    assert str(info.value) == f"{variable}={value!r} is not valid: expected {expected}"
    assert (info.value.variable, info.value.value) == (variable, value)


def test_configure_refuses_unknown_exporters_and_a_ratio_out_of_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_sdk, "_configured", {})
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,zipkin9")
    listed = r"a comma-separated list of otlp, .*console.*, none"
    with pytest.raises(
        _sdk.ConfigError,
        match=rf"^OTEL_TRACES_EXPORTER='console,zipkin9' is not "
        rf"valid: expected {listed}",
    ):
        _sdk.configure()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "2")
    with pytest.raises(
        _sdk.ConfigError,
        match=r"^OTEL_TRACES_SAMPLER_ARG='2' is not valid: "
        r"expected a ratio from 0 to 1$",
    ):
        _sdk.configure()


class _SlowProcessor(SpanProcessor):
    """A span processor whose flush waits (an exporter stuck on a slow collector)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.release.wait(5.0)


def test_a_flush_past_its_deadline_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    stuck = _SlowProcessor()
    slow, quick = TracerProvider(), MeterProvider()
    slow.add_span_processor(stuck)
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": slow, "meter_provider": quick})
    monkeypatch.setattr(_sdk, "_unfinished", [])
    monkeypatch.setattr(_sdk, "_failures", _sdk._ExportFailures())
    try:
        assert _sdk.flush(0.2) is False
        assert _sdk.export_failures() == [
            "traces: force_flush still exporting after 0.2 s, abandoned"
        ]
    finally:
        stuck.release.set()  # its thread ends
    monkeypatch.setattr(
        _sdk, "_configured", {"tracer_provider": TracerProvider(), "meter_provider": quick}
    )
    assert _sdk.flush(1.0) is True


def test_export_errors_are_counted_per_exporter_with_the_first_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures = _sdk._ExportFailures()
    monkeypatch.setattr(_sdk, "_failures", failures)
    monkeypatch.setattr(_sdk, "_unfinished", [])
    logger = logging.getLogger("opentelemetry.exporter.netcl-test")
    logger.addHandler(failures)
    monkeypatch.setattr(logger, "propagate", False)
    try:
        logger.error("Failed to export spans: UNAVAILABLE\ndetails")
        logger.error("Failed to export spans: again")
        logger.warning("Transient error, retrying")  # a retry: not an error
    finally:
        logger.removeHandler(failures)
    assert _sdk.export_failures() == [
        "2 export error(s), first: Failed to export spans: UNAVAILABLE"
    ]


def test_the_console_line_of_a_span(spans: InMemorySpanExporter) -> None:
    scope = telemetry.Scope("netcl.test", "0")
    with scope.span("netcl.test.outer"), scope.span("netcl.test.inner", {"netcl.test.n": 3}):
        pass
    inner, outer = spans.get_finished_spans()
    line = _sdk._span_line(inner)
    assert re.fullmatch(
        rf"span netcl\.test\.inner \d+\.\d{{3}} ms trace_id={inner.context.trace_id:032x} "
        rf"span_id={inner.context.span_id:016x} parent_id={outer.context.span_id:016x} "
        r"status=UNSET netcl\.test\.n=3\n",
        line,
    ), line
    assert " parent_id=- " in _sdk._span_line(outer)
    timed = TracerProvider().get_tracer("netcl.test").start_span("netcl.test.timed", start_time=0)
    timed.end(end_time=2_000_000_000)  # 2 s: the duration in ms, to the microsecond
    assert _sdk._span_line(timed).startswith("span netcl.test.timed 2000.000 ms trace_id=")


def test_a_flush_without_a_timeout_waits_as_long_as_the_export_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck = _SlowProcessor()
    slow = TracerProvider()
    slow.add_span_processor(stuck)
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": slow})
    monkeypatch.setattr(_sdk, "_unfinished", [])
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "300")  # ms: the larger of the two
    monkeypatch.setenv("OTEL_METRIC_EXPORT_TIMEOUT", "100")
    try:
        assert _sdk.flush() is False
        assert _sdk._unfinished == ["traces: force_flush still exporting after 0.3 s, abandoned"]
    finally:
        stuck.release.set()


@pytest.fixture
def empty_slots(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The OpenTelemetry API's provider slots emptied, as in a process where nothing installed
    an SDK yet, for ``configure`` to fill in this process; what it installed is shut down and
    the session's SDK put back after the test. Yields what ``configure`` returned (filled by the
    test's call)."""
    from opentelemetry import trace
    from opentelemetry.metrics import _internal as metrics_api
    from opentelemetry.util._once import Once

    configured: dict[str, Any] = {}
    monkeypatch.setattr(_sdk, "_configured", configured)
    for module, slot in ((trace, "_TRACER_PROVIDER"), (metrics_api, "_METER_PROVIDER")):
        monkeypatch.setattr(module, slot, None)
        monkeypatch.setattr(module, f"{slot}_SET_ONCE", Once())
    handlers = {name: list(logging.getLogger(name).handlers) for name in _sdk._EXPORT_LOGGERS}
    try:
        yield configured
    finally:
        for provider in ("tracer_provider", "meter_provider"):
            if (shutdown := getattr(configured.get(provider), "shutdown", None)) is not None:
                shutdown()
        for name, kept in handlers.items():
            logging.getLogger(name).handlers[:] = kept
        monkeypatch.undo()
        _sdk._recheck()  # the session's SDK again


def test_configure_installs_the_exporters_the_variables_name_with_netcls_additions(
    empty_slots: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace

    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")
    for variable in (
        *_sdk._BOUNDED,
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_EXPORTER_PROMETHEUS_PORT",
        "OTEL_EXPORTER_PROMETHEUS_HOST",
    ):
        monkeypatch.delenv(variable, raising=False)
    out = io.StringIO()
    done = _sdk.configure(service_name="netcl-test", console=True, console_out=out)
    assert done is empty_slots and _sdk.configure() is done  # once per process
    assert done["exporters"] == {"traces": ["console"], "metrics": ["console"], "logs": []}
    assert done["disabled"] is False
    assert done["tracer_provider"] is trace.get_tracer_provider()
    assert done["tracer_provider"].resource.attributes["service.name"] == "netcl-test"
    assert _sdk.tracing()
    # netcl's bounded defaults were set only while the SDK read them
    assert not set(_sdk._BOUNDED) & set(os.environ)
    assert _sdk._failures in logging.getLogger(_sdk._EXPORT_LOGGERS[0]).handlers
    trace.get_tracer("netcl.test").start_span("netcl.test.configured").end()
    assert _sdk.flush(5.0) is True
    (line,) = [x for x in out.getvalue().splitlines() if x.startswith("span ")]
    assert line.startswith("span netcl.test.configured ") and "status=UNSET" in line


def test_configure_serves_prometheus_on_the_port_given(
    empty_slots: dict[str, Any], monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")
    monkeypatch.delenv("OTEL_EXPORTER_PROMETHEUS_HOST", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_PROMETHEUS_PORT", raising=False)
    done = _sdk.configure(prometheus_port=closed_port)
    assert done["exporters"] == {"traces": [], "metrics": ["prometheus"], "logs": []}
    with urllib.request.urlopen(f"http://127.0.0.1:{closed_port}/metrics", timeout=5) as answer:
        assert answer.status == 200
    assert "OTEL_EXPORTER_PROMETHEUS_PORT" not in os.environ  # set only while configuring


def test_configure_serves_prometheus_on_the_host_the_variable_names(
    empty_slots: dict[str, Any], monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    """OTEL_EXPORTER_PROMETHEUS_HOST set: metrics are served there, not on netcl's default
    127.0.0.1, and the variable is left as the user set it."""
    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.2")
    monkeypatch.delenv("OTEL_EXPORTER_PROMETHEUS_PORT", raising=False)
    _sdk.configure(prometheus_port=closed_port)
    with urllib.request.urlopen(f"http://127.0.0.2:{closed_port}/metrics", timeout=5) as answer:
        assert answer.status == 200
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{closed_port}/metrics", timeout=5)
    assert os.environ["OTEL_EXPORTER_PROMETHEUS_HOST"] == "127.0.0.2"


def test_configure_with_the_sdk_disabled_installs_nothing(
    empty_slots: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace

    monkeypatch.setenv("OTEL_SDK_DISABLED", " TRUE ")
    done = _sdk.configure(console=True)
    assert done["disabled"] is True
    assert done["exporters"] == {"traces": [], "metrics": [], "logs": []}
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_configure_with_an_sdk_installed_warns_that_the_port_is_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_sdk, "_configured", {})  # the session's SDK is installed
    with caplog.at_level(logging.WARNING, logger="netcl.core.telemetry"):
        done = _sdk.configure(prometheus_port=9)
    assert (done["exporters"], done["disabled"]) == ({}, False)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("telemetry_prom")]
    assert record.prometheus_port == 9  # type: ignore[attr-defined]
    reason = (
        "an OpenTelemetry SDK is already installed: set OTEL_METRICS_EXPORTER=prometheus "
        "and OTEL_EXPORTER_PROMETHEUS_PORT instead"
    )
    assert record.reason == reason  # type: ignore[attr-defined]
    assert record.levelno == logging.WARNING and record.name == "netcl.core.telemetry"
    assert record.getMessage() == (
        f'telemetry_prometheus_port_ignored prometheus_port=9 reason="{reason}"'
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="netcl.core.telemetry"):
        assert _sdk.configure() is done  # without a port: nothing to say
    assert not caplog.records


def test_an_otlp_endpoint_alone_chooses_otlp_for_traces_and_metrics(
    empty_slots: dict[str, Any], monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    for variable in (
        "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    # HTTP, not gRPC: gRPC's threads do not survive the fork of a later subprocess in this
    # process (seen as the interpreter crashing in a later test under mutmut's forked runner)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # a variable set wins over the endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    done = _sdk.configure(console_out=io.StringIO())
    assert done["exporters"] == {"traces": ["console"], "metrics": ["otlp_proto_http"], "logs": []}
    assert "OTEL_METRICS_EXPORTER" not in os.environ


class _Raising:
    """A provider whose flush and shutdown raise (a broken SDK plug-in)."""

    def force_flush(self) -> bool:
        raise RuntimeError("flush exploded")

    def shutdown(self) -> None:
        raise RuntimeError("shutdown exploded")


def test_a_provider_that_raises_is_logged_never_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": _Raising()})
    monkeypatch.setattr(_sdk, "_before_shutdown", [])
    with caplog.at_level(logging.WARNING, logger="netcl.core.telemetry"):
        assert _sdk.flush(1.0) is True  # it ended (by raising) within the deadline
        assert _sdk.shutdown(1.0) is True
    said = [(r.call, r.error) for r in caplog.records]  # type: ignore[attr-defined]
    assert said == [
        ("force_flush", "RuntimeError('flush exploded')"),
        ("shutdown", "RuntimeError('shutdown exploded')"),
    ]


class _Slow:
    """A provider whose flush takes 0.2 s and notes the thread it ran on (and whether that
    thread is a daemon, which cannot keep the application from exiting)."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.daemons: list[bool] = []

    def force_flush(self) -> bool:
        self.threads.append(threading.current_thread().name)
        self.daemons.append(threading.current_thread().daemon)
        time.sleep(0.2)
        return True


def test_a_flush_within_its_deadline_is_done_on_a_named_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow = _Slow()
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": slow, "meter_provider": slow})
    monkeypatch.setattr(_sdk, "_unfinished", [])
    assert _sdk.flush(5.0) is True  # 0.2 s each, side by side: well within 5 s
    assert sorted(slow.threads) == [
        "netcl-otel-force_flush-metrics",
        "netcl-otel-force_flush-traces",
    ]
    assert slow.daemons == [True, True]  # a stuck exporter never holds the process at exit
    assert _sdk._unfinished == []


def _exporters_accepted(signal: str) -> str:
    """What ``OTEL_<SIGNAL>_EXPORTER`` accepts, as the message lists it (the installed
    exporters between ``otlp`` and ``none``; this environment has the OTLP exporters)."""
    names = ", ".join(["otlp", *_sdk._names(f"opentelemetry_{signal}_exporter"), "none"])
    return f"a comma-separated list of {names}"


_OK = None  # a value the check accepts
_NUMBER_VARIABLES = {
    "OTEL_EXPORTER_OTLP_TIMEOUT": "a number > 0 (seconds)",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "a number > 0 (seconds)",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "a number > 0 (seconds)",
    "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "a number > 0 (seconds)",
    "OTEL_METRIC_EXPORT_TIMEOUT": "a number > 0 (milliseconds)",
    "OTEL_METRIC_EXPORT_INTERVAL": "a number > 0 (milliseconds)",
}
_INTEGER_VARIABLES = {
    "OTEL_BSP_EXPORT_TIMEOUT": "an integer > 0 (milliseconds)",
    "OTEL_BSP_SCHEDULE_DELAY": "an integer > 0 (milliseconds)",
    "OTEL_BSP_MAX_QUEUE_SIZE": "an integer > 0 (spans)",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "an integer > 0 (spans)",
}
_ENVIRONMENT_CASES: list[tuple[str, str, str | None]] = [
    *[("OTEL_SDK_DISABLED", v, _OK) for v in ("true", "false", "TRUE", " False ", "  ")],
    *[("OTEL_SDK_DISABLED", v, "true or false") for v in ("yes", "1", "truee")],
    *[
        (f"OTEL_EXPORTER_OTLP{s}_PROTOCOL", v, expected)
        for s in ("", "_TRACES", "_METRICS", "_LOGS")
        for v, expected in (
            ("grpc", _OK),
            ("http/protobuf", _OK),
            (" grpc ", _OK),
            ("udp", "grpc or http/protobuf"),
            ("GRPC", "grpc or http/protobuf"),
        )
    ],
    *[
        (f"OTEL_{signal.upper()}_EXPORTER", v, expected)
        for signal in ("traces", "metrics", "logs")
        for v, expected in (
            ("none", _OK),
            ("None", _OK),
            ("otlp", _OK),
            ("console", _OK),
            ("console, otlp", _OK),
            ("console,zipkin9", signal),
            ("zipkin9", signal),
            ("none,console", signal),
        )
    ],
    *[
        (variable, v, expected)
        for variable, accepts in _NUMBER_VARIABLES.items()
        for v, expected in (
            ("1", _OK),
            ("0.5", _OK),
            ("2.5e3", _OK),
            ("  ", _OK),
            ("0", accepts),
            ("-1", accepts),
            ("inf", accepts),
            ("nan", accepts),
            ("10s", accepts),
        )
    ],
    *[
        (variable, v, expected)
        for variable, accepts in _INTEGER_VARIABLES.items()
        for v, expected in (
            ("1", _OK),
            ("512", _OK),
            (" 7 ", _OK),
            ("0", accepts),
            ("-3", accepts),
            ("1.5", accepts),
            ("inf", accepts),
            ("x", accepts),
        )
    ],
    *[
        ("OTEL_TRACES_SAMPLER", v, _OK)
        for v in ("always_on", "always_off", "traceidratio", "parentbased_traceidratio")
    ],
    ("OTEL_TRACES_SAMPLER", "always_of", "samplers"),
]


@pytest.mark.parametrize(("variable", "value", "expected"), _ENVIRONMENT_CASES)
def test_every_checked_variable_accepts_its_good_values_and_names_a_bad_one(
    variable: str, value: str, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ``OTEL_*`` variable netcl checks before installing the SDK accepts every valid
    value (boundaries included) and refuses a bad one with the one-line message naming the
    variable, the value and exactly what it accepts."""
    monkeypatch.setenv(variable, value)
    if expected is None:
        _sdk._check_environment()
        return
    if expected in ("traces", "metrics", "logs"):
        expected = _exporters_accepted(expected)
    elif expected == "samplers":
        expected = "one of " + ", ".join(_sdk._names("opentelemetry_traces_sampler"))
    with pytest.raises(_sdk.ConfigError) as info:
        _sdk._check_environment()
    assert str(info.value) == f"{variable}={value!r} is not valid: expected {expected}"
    assert (info.value.variable, info.value.value, info.value.accepts) == (
        variable,
        value,
        expected,
    )


@pytest.mark.parametrize(
    ("sampler", "ratio", "refused"),
    [
        ("traceidratio", "0", False),
        ("traceidratio", "0.25", False),
        ("traceidratio", "1", False),
        ("traceidratio", "1.5", True),
        ("traceidratio", "2", True),
        ("traceidratio", "-0.1", True),
        ("traceidratio", "half", True),
        ("parentbased_traceidratio", "0.5", False),
        ("parentbased_traceidratio", "3", True),
        ("always_on", "3", False),  # the ratio is read only by the ratio samplers
        (None, "3", False),
    ],
)
def test_the_sampler_ratio_is_checked_only_for_a_ratio_sampler(
    sampler: str | None, ratio: str, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_TRACES_SAMPLER_ARG`` must be a ratio from 0 to 1 (both included) when the
    sampler reads it, and is ignored otherwise."""
    if sampler is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
    if not refused:
        _sdk._check_environment()
        return
    with pytest.raises(_sdk.ConfigError) as info:
        _sdk._check_environment()
    assert str(info.value) == (
        f"OTEL_TRACES_SAMPLER_ARG={ratio!r} is not valid: expected a ratio from 0 to 1"
    )


def test_without_the_otlp_exporters_the_message_says_which_extra_installs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the OTLP exporters are not installed, an unknown exporter's message lists what
    is and says that OTLP needs ``netcl-core[otel]``; where they are, it says nothing more."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "zipkin9")
    with pytest.raises(_sdk.ConfigError) as info:
        _sdk._check_environment()
    assert str(info.value).endswith(", none"), str(info.value)
    monkeypatch.setattr(_sdk, "_names", lambda group: ["console"])
    with pytest.raises(_sdk.ConfigError) as info:
        _sdk._check_environment()
    assert str(info.value) == (
        "OTEL_METRICS_EXPORTER='zipkin9' is not valid: expected a "
        "comma-separated list of otlp, console, none; OTLP needs "
        "netcl-core[otel]"
    )


def test_the_console_lines_of_metrics() -> None:
    """The console exporter writes one line per point: a counter's value, a histogram's count
    and sum, each with its attributes."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("netcl.test")
    meter.create_counter("netcl.test.count").add(3, {"netcl.test.kind": "a", "netcl.test.n": 2})
    hist = meter.create_histogram("netcl.test.seconds")
    hist.record(0.25)
    hist.record(1.5)
    data = reader.get_metrics_data()
    assert data is not None
    assert _sdk._metric_lines(data) == (
        "metric netcl.test.count{netcl.test.kind=a,netcl.test.n=2} 3\n"
        "metric netcl.test.seconds{} count=2 sum=1.75\n"
    )


class _Stopping:
    """A provider whose shutdown takes 0.3 s and notes that it was asked to stop."""

    def __init__(self) -> None:
        self.stopped = 0

    def shutdown(self) -> None:
        self.stopped += 1
        time.sleep(0.3)


def test_shutdown_collects_pending_device_time_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """telemetry.shutdown() collects the device time still pending (waiting up to 1 s), then
    stops the providers within the timeout given, saying which one it left still exporting."""
    import pyopencl as cl

    from netcl.core import device, profiling

    provider = _Stopping()
    monkeypatch.setattr(_sdk, "_configured", {"tracer_provider": provider})
    monkeypatch.setattr(_sdk, "_unfinished", [])
    queue = cl.CommandQueue(
        device.default_context(), properties=cl.command_queue_properties.PROFILING_ENABLE
    )
    unit = profiling.collector().watch("commands", [cl.enqueue_marker(queue)], queue=queue)
    assert _sdk.shutdown(0.1) is False  # the provider takes 0.3 s
    assert unit.done and unit.duration is not None and unit.duration >= 0
    assert provider.stopped == 1
    assert _sdk._unfinished == ["traces: shutdown still exporting after 0.1 s, abandoned"]


def test_an_otlp_traces_endpoint_alone_chooses_otlp_for_traces_with_its_own_timeout(
    empty_slots: dict[str, Any], monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    """A traces endpoint alone sends spans over OTLP; a per-signal timeout the user set counts
    as set, so netcl's own default (OTEL_EXPORTER_OTLP_TIMEOUT=2) is not added for the rest."""
    for variable in (
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        *_sdk._BOUNDED,
    ):
        monkeypatch.delenv(variable, raising=False)
    for signal in ("METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # see above
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "7")
    seen: dict[str, str | None] = {}
    from opentelemetry.sdk import _configuration

    real = _configuration._OTelSDKConfigurator.configure

    def configure(self: Any, **kwargs: Any) -> None:
        seen["timeout"] = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
        real(self, **kwargs)

    monkeypatch.setattr(_configuration._OTelSDKConfigurator, "configure", configure)
    done = _sdk.configure(console_out=io.StringIO())
    assert done["exporters"] == {"traces": ["otlp_proto_http"], "metrics": [], "logs": []}
    assert seen == {"timeout": None}
    assert "OTEL_TRACES_EXPORTER" not in os.environ


def test_the_console_line_of_a_failed_span_and_of_one_without_times() -> None:
    """A failed span's console line carries its status and description (quoted when it has
    spaces) before its attributes; a span that has no times reads 0.000 ms."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, Status, StatusCode

    failed = (
        TracerProvider()
        .get_tracer("netcl.test")
        .start_span(
            "netcl.test.failed",
            start_time=1_000,
            attributes={"netcl.test.n": 2, "netcl.test.s": "a b"},
        )
    )
    failed.set_status(Status(StatusCode.ERROR, "kernel failed"))
    failed.end(end_time=1_501_000)
    ctx = failed.get_span_context()
    assert _sdk._span_line(failed) == (  # type: ignore[arg-type]
        f"span netcl.test.failed 1.500 ms trace_id={ctx.trace_id:032x} "
        f"span_id={ctx.span_id:016x} parent_id=- status=ERROR "
        'status.description="kernel failed" netcl.test.n=2 netcl.test.s="a b"\n'
    )
    timeless = ReadableSpan(
        name="netcl.test.timeless",
        context=SpanContext(0xA, 0xB, False),
        parent=SpanContext(0xA, 0xC, False),
    )
    assert _sdk._span_line(timeless) == (
        f"span netcl.test.timeless 0.000 ms trace_id={0xA:032x} span_id={0xB:016x} "
        f"parent_id={0xC:016x} status=UNSET\n"
    )


def test_configure_defaults_name_the_service_netcl_and_print_nothing(
    empty_slots: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """configure() with no arguments names the service ``netcl``, adds no console exporter and
    returns the providers it installed."""
    from opentelemetry import metrics

    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")
    for variable in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(variable, raising=False)
    done = _sdk.configure()
    assert done["exporters"] == {"traces": [], "metrics": [], "logs": []}
    assert done["meter_provider"] is metrics.get_meter_provider()
    assert done["tracer_provider"].resource.attributes["service.name"] == "netcl"
    done["tracer_provider"].get_tracer("netcl.test").start_span("netcl.test.quiet").end()
    assert _sdk.flush(5.0) is True
    assert "netcl.test.quiet" not in capsys.readouterr().err


def test_configure_with_console_prints_to_stderr_by_default(
    empty_slots: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``configure(console=True)`` without ``console_out`` prints each span on stderr."""
    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    done = _sdk.configure(console=True)
    assert done["exporters"] == {"traces": ["console"], "metrics": ["console"], "logs": []}
    done["tracer_provider"].get_tracer("netcl.test").start_span("netcl.test.loud").end()
    assert _sdk.flush(5.0) is True
    assert "span netcl.test.loud " in capsys.readouterr().err
