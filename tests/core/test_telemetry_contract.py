"""The tables of docs/observability.md hold every span and log event the tests cause (the
session's check in tests/conftest.py): here, telemetry unlike them is caught, with what is wrong."""

from __future__ import annotations

import pytest

from netcl.core import telemetry
from netcl.core.log import get_logger


def test_a_span_unlike_its_row_is_caught(telemetry_contract: list[str]) -> None:
    scope = telemetry.Scope("netcl.runtime.scheduler", "0")
    attributes = {
        "netcl.plan.index": 0,
        "netcl.plan.ops": 1,
        "netcl.plan.ordering": "sideways",
        "netcl.plan.colour": "red",
    }
    with scope.span("netcl.scheduler.plan", attributes):
        pass
    with scope.span("netcl.scheduler.made_up"):
        pass
    with pytest.raises(ValueError), scope.span("netcl.scheduler.plan", {"netcl.plan.index": 1}):
        raise ValueError("a failed span may lack its attributes")
    broken, telemetry_contract[:] = "\n".join(telemetry_contract), []
    assert "'netcl.scheduler.plan' lacks ['netcl.plan.description']" in broken
    assert "has undocumented ['netcl.plan.colour']" in broken
    assert "netcl.plan.ordering='sideways', not device / host / none" in broken
    assert "'netcl.scheduler.made_up' is not in docs/observability.md" in broken
    assert broken.count("\n") == 3  # four lines: the failed span broke nothing


def test_an_event_unlike_its_row_is_caught(telemetry_contract: list[str]) -> None:
    cache = get_logger("netcl.runtime.cache")
    cache.warning("cache_entry_corrupt", path="/x", key=None, reason="r")
    cache.info("cache_entry_corrupt", path="/x", key="k", reason="r")
    cache.warning("cache_lock_failed", key="k", lock="/x.lock")
    cache.warning("cache_write_failed", path="/x", key="k", errno=None, error="e")  # may be null
    cache.info("cache_made_up")
    get_logger("netcl.test.contract").warning("anything_goes", x=None)  # the tests' own loggers
    broken, telemetry_contract[:] = "\n".join(telemetry_contract), []
    assert "event 'cache_entry_corrupt': ['key'] None" in broken
    assert "event 'cache_entry_corrupt' at INFO" in broken
    assert "'cache_lock_failed' at WARNING from netcl.runtime.cache with ['key', 'lock']" in broken
    assert "event 'cache_made_up' of netcl.runtime.cache is not in docs" in broken
    assert broken.count("\n") == 3
