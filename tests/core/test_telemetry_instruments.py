"""What a package's instruments put on the dashboards: an observable counter and gauge report
each ``(value, attributes)`` pair under their own name, a failing SDK is logged naming the
instrument that failed, and the counts behind them read 0 for a label never added to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from netcl.core import log, telemetry


def test_observable_instruments_report_values_with_their_attributes(
    metric_points: Callable[[str], list[Any]],
) -> None:
    scope = telemetry.Scope("netcl.test", "0")
    scope.observable_counter(
        "netcl.test.observed_total",
        lambda: [(3, {"netcl.test.k": "a"}), (5, {"netcl.test.k": "b"})],
        "1",
        "a test counter",
    )
    scope.observable_gauge(
        "netcl.test.observed_level", lambda: [(7, {"netcl.test.k": "c"})], "By", "a test gauge"
    )
    points = metric_points("netcl.test.observed_total")
    counted = {p.attributes["netcl.test.k"]: p.value for p in points}
    assert counted == {"a": 3, "b": 5}
    (level,) = metric_points("netcl.test.observed_level")
    assert (level.value, dict(level.attributes)) == (7, {"netcl.test.k": "c"})


def test_a_failing_histogram_is_logged_once_by_its_name(
    hostile_sdk: Callable[[], None],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log, "_warned", set())  # as in a fresh process: nothing reported yet
    histogram = telemetry.Scope("netcl.test", "0").histogram("netcl.test.failing", "s", "a test")
    with caplog.at_level("WARNING", logger="netcl.core.telemetry"):
        for _ in range(2):
            histogram.record(1.0, {"netcl.test.series": "a"})  # never raises
    (message,) = [r.getMessage() for r in caplog.records]
    assert "telemetry_failed" in message and "stage=metric:netcl.test.failing" in message
    assert "an OpenTelemetry SDK error, ignored; logged once" in message


def test_counts_of_a_label_never_added_to_are_zero() -> None:
    counts = telemetry.Counts("netcl.test.k")
    counts.add(2, "a")
    counts.set(5, "b")
    counts.discard("b")
    assert (counts.get("a"), counts.get("b"), counts.get("never")) == (2, 0, 0)
    assert counts.points() == [(2, {"netcl.test.k": "a"})]


def test_unlabelled_counts_read_back_without_a_label() -> None:
    """A single unlabelled number: ``add`` and ``set`` without a label, ``get()`` reads it."""
    counts = telemetry.Counts()
    assert counts.get() == 0
    counts.add()
    counts.add(2)
    assert counts.get() == 3
    counts.set(7)
    assert counts.get() == 7 and counts.points() == [(7, {})]


def _metric(reader: Any, name: str) -> Any:
    """The metric ``name`` as the reader collects it now (one scope's), or None."""
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    return m
    return None


@pytest.mark.parametrize(
    ("buckets", "bounds"),
    [((0.5, 2.0), (0.5, 2.0)), (None, None), ((), None)],  # None and (): the SDK's own
)
def test_a_histogram_reports_under_its_name_unit_description_and_buckets(
    buckets: tuple[float, ...] | None, bounds: tuple[float, ...] | None, metric_reader: Any
) -> None:
    """A package's histogram is on the dashboards under its name, with its unit, description
    and bucket boundaries (or the SDK's default boundaries when given none)."""
    name = f"netcl.test.histogram_{len(buckets) if buckets is not None else 'none'}"
    histogram = telemetry.Scope("netcl.test", "0").histogram(
        name, "By", "a test histogram", buckets
    )
    histogram.record(1.0, {"netcl.test.k": "a"})
    histogram.record(3.0, {"netcl.test.k": "a"})
    metric = _metric(metric_reader, name)
    assert metric is not None
    assert (metric.unit, metric.description) == ("By", "a test histogram")
    (point,) = [p for p in metric.data.data_points if p.attributes == {"netcl.test.k": "a"}]
    assert (point.count, point.sum) == (2, 4.0)
    if bounds is not None:
        assert tuple(point.explicit_bounds) == bounds
        assert list(point.bucket_counts) == [0, 1, 1]
    else:  # the SDK's default boundaries: 0, 5, 10, ... (not netcl's)
        assert tuple(point.explicit_bounds)[:3] == (0.0, 5.0, 10.0)


class _SetFailedError(RuntimeError):
    """What the broken span below raises (a type of its own: logged once per type)."""


class _BrokenSpan:
    """A span of an SDK whose attribute setting raises."""

    def set_attributes(self, attributes: Any) -> None:
        raise _SetFailedError("set_attributes exploded")


def test_an_attribute_the_sdk_fails_to_set_is_logged_once_never_raised(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting attributes on a span whose SDK raises never raises into the caller: the failure
    is logged once, naming the stage (``set_attribute``) and the error."""
    monkeypatch.setattr(log, "_warned", set())  # as in a fresh process: nothing reported yet
    span = telemetry.Span(_BrokenSpan(), None)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="netcl.core.telemetry"):
        span.set_many({"netcl.test.k": 1})
        span.set("netcl.test.k", 2)
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("telemetry_failed stage=set_attribute error=")
    assert "_SetFailedError('set_attributes exploded')" in message


class _FailFailedError(RuntimeError):
    """What the span below raises when marked failed."""


class _UnfailableSpan:
    """A span of an SDK whose status setting raises."""

    def set_attribute(self, key: str, value: Any) -> None:
        raise _FailFailedError("set_attribute exploded")


def test_a_failure_the_sdk_fails_to_record_is_logged_once_never_raised(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marking a span failed whose SDK raises never raises into the caller: logged once, naming
    the stage (``fail``) and the error."""
    monkeypatch.setattr(log, "_warned", set())
    span = telemetry.Span(_UnfailableSpan(), None)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="netcl.core.telemetry"):
        span.fail("it broke")
        telemetry.Span(_UnfailableSpan(), None).fail("again")  # type: ignore[arg-type]
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("telemetry_failed stage=fail error=")
    assert "_FailFailedError('set_attribute exploded')" in message


class _CurrentFailedError(RuntimeError):
    """What the broken ``get_current_span`` below raises."""


def test_current_span_of_a_failing_sdk_is_the_do_nothing_span_logged_once(
    spans: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK whose ``get_current_span`` raises: ``current_span`` gives the do-nothing span and
    logs the failure once, naming the stage (``current_span``) and the error."""
    from opentelemetry import trace

    works = trace.get_current_span
    calls: list[None] = []

    def broken_once() -> Any:  # once only: the log record of the failure asks for it too
        calls.append(None)
        if len(calls) == 1:
            raise _CurrentFailedError("no current span")
        return works()

    monkeypatch.setattr(log, "_warned", set())
    monkeypatch.setattr(trace, "get_current_span", broken_once)
    with caplog.at_level("WARNING", logger="netcl.core.telemetry"):
        assert telemetry.current_span() is telemetry.NO_SPAN
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("telemetry_failed stage=current_span error=")
    assert "_CurrentFailedError('no current span')" in message


def test_attributes_set_on_a_span_are_recorded(spans: Any) -> None:
    """``set`` and ``set_many`` put their attributes on the span the SDK records."""
    with telemetry.Scope("netcl.test", "0").span("netcl.test.step") as span:
        span.set_many({"netcl.test.k": 1, "netcl.test.j": "x"})
        span.set("netcl.test.i", 2.5)
    (finished,) = [s for s in spans.get_finished_spans() if s.name == "netcl.test.step"]
    assert dict(finished.attributes or {}) == {
        "netcl.test.k": 1,
        "netcl.test.j": "x",
        "netcl.test.i": 2.5,
    }
