from __future__ import annotations

import datetime
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from netcl.core import log, telemetry


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )


@pytest.fixture
def unconfigured() -> Iterator[None]:
    """Leaves the 'netcl' logger as a library leaves it, whatever the test configured."""
    yield
    netcl = logging.getLogger("netcl")
    for h in list(log._handler):
        netcl.removeHandler(h)
    log._handler.clear()
    netcl.setLevel(logging.NOTSET)


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


def test_fields_survive_plain_basic_config() -> None:
    proc = _run(
        """
        import logging
        logging.basicConfig()
        from netcl.core.log import get_logger
        get_logger("netcl.runtime.cache").warning(
            "cache_entry_corrupt", path="/tmp/a b/x.bin", key="abc123", reason="bad\\nmagic"
        )
        get_logger("netcl.runtime.cache").info("not_shown_at_warning")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        'WARNING:netcl.runtime.cache:cache_entry_corrupt path="/tmp/a b/x.bin" key=abc123 '
        'reason="bad\\nmagic"'
    ]


def test_fields_are_record_attributes(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="netcl.test.log"):
        log.get_logger("netcl.test.log").warning("disk_full", path="/x", errno=28)
    (record,) = caplog.records
    assert record.event == "disk_full"  # type: ignore[attr-defined]
    assert record.path == "/x" and record.errno == 28  # type: ignore[attr-defined]
    assert record.getMessage() == "disk_full path=/x errno=28"


def test_configure_logging_twice_prints_each_event_once(unconfigured: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    log.configure_logging(logging.INFO, stream=first)
    log.configure_logging(logging.INFO, stream=second)
    log.get_logger("netcl.test.log").warning("once", n=1)
    assert first.getvalue() == ""
    (line,) = second.getvalue().splitlines()
    assert "once" in line and "n=1" in line
    assert line.count("n=1") == 1  # the fields once, not again from the message


def test_configure_logging_json_with_trace_ids(unconfigured: None) -> None:
    buf = io.StringIO()
    log.configure_logging(logging.INFO, json=True, stream=buf)
    logger = log.get_logger("netcl.test.log")
    t = telemetry.Scope("netcl.test", "0")
    with t.span("netcl.test.log") as s:
        logger.warning("something_happened", path="/tmp/x", size=3)
    logger.debug("not_shown")
    (line,) = buf.getvalue().splitlines()
    event = json.loads(line)
    assert event["event"] == "something_happened"
    assert event["path"] == "/tmp/x" and event["size"] == 3
    assert event["level"] == "warning"
    assert event["logger"] == "netcl.test.log"
    assert event["trace_id"] == format(s.context.trace_id, "032x")
    assert event["span_id"] == format(s.context.span_id, "016x")
    # an ISO 8601 time in UTC, within the test
    stamped = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
    assert abs(stamped.timestamp() - time.time()) < 60, event["timestamp"]


@pytest.mark.parametrize("name", ["__wrapped__", "__deepcopy__", "__len__"])
def test_a_logger_has_no_special_attribute_it_does_not_define(name: str) -> None:
    """Tools probing a logger for a special attribute (``inspect.unwrap``, ``copy``) get a
    plain AttributeError naming it, and the probe does not build the structlog logger."""
    logger = log.get_logger("netcl.test.log").bind(step=1)
    with pytest.raises(AttributeError) as info:
        getattr(logger, name)
    assert info.value.args == (name,)
    assert repr(logger) == "<LazyLogger netcl.test.log context={'step': 1}>"
    assert logger._logger is None  # nothing of structlog made for the probe


def test_the_rest_of_structlogs_api_passes_through() -> None:
    """Methods of structlog's bound logger that the lazy logger does not define itself (``new``,
    ``unbind``) work on it, with its bound fields."""
    import structlog

    logger = log.get_logger("netcl.test.log").bind(step=1, phase="warmup")
    assert structlog.get_context(logger.unbind("phase")) == {"step": 1}
    assert structlog.get_context(logger.new(run=2)) == {"run": 2}
