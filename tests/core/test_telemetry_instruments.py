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
    scope.observable_counter("netcl.test.observed_total", lambda: [(3, {"netcl.test.k": "a"}),
                             (5, {"netcl.test.k": "b"})], "1", "a test counter")  # fmt: skip
    scope.observable_gauge("netcl.test.observed_level", lambda: [(7, {"netcl.test.k": "c"})],
                           "By", "a test gauge")  # fmt: skip
    points = metric_points("netcl.test.observed_total")
    counted = {p.attributes["netcl.test.k"]: p.value for p in points}
    assert counted == {"a": 3, "b": 5}
    (level,) = metric_points("netcl.test.observed_level")
    assert (level.value, dict(level.attributes)) == (7, {"netcl.test.k": "c"})


def test_a_failing_histogram_is_logged_once_by_its_name(
    hostile_sdk: Callable[[], None], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
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
