"""Importing netcl loads only what the first use needs: structlog (and rich, which its console
renderer pulls in) only once an event is logged at an enabled level or logging is configured."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

_LAZY = ("structlog", "rich")
_MODULES = [
    "netcl.core.memory",
    "netcl.core.device",
    "netcl.core.log",
    "netcl.core.cli",
    "netcl.runtime.cache",
    "netcl.runtime.graph",
    "netcl.runtime.capture",
    "netcl.runtime.scheduler",
]


def _loaded_after(code: str) -> list[str]:
    """The modules of _LAZY that a fresh interpreter holds after running ``code``."""
    check = f"\nimport sys\nprint(' '.join(m for m in {_LAZY!r} if m in sys.modules))"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + check],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize("module", _MODULES)
def test_importing_a_package_loads_no_structlog(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    assert _loaded_after(f"import {module}") == []


def test_importing_capture_loads_no_step_machinery() -> None:
    """capture_step (its modules and pyopencl.array) loads on first use, and then works."""
    code = """
        import sys
        import netcl.runtime.capture as c
        print(' '.join(m for m in ('netcl.runtime.capture._step', 'pyopencl.array')
                       if m in sys.modules))
        from netcl.runtime.capture import capture_step, CapturedStep
        print(isinstance(capture_step(lambda: None), CapturedStep), 'capture_step' in vars(c))
        """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["", "True True"], proc.stdout


def test_netcl_info_loads_no_structlog() -> None:
    code = """
        import contextlib, io
        from netcl.core import cli
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(["info"])
        """
    assert _loaded_after(code) == []


def test_events_below_the_level_load_no_structlog() -> None:
    code = """
        from netcl.core.log import get_logger
        log = get_logger("netcl.runtime.cache").bind(key="abc")
        log.debug("cache_hit", n=1)
        log.info("cache_stats_saved", path="/x")  # the stdlib default level is WARNING
        """
    assert _loaded_after(code) == []


def test_structlog_loads_for_an_event_that_passes_and_for_configure_logging() -> None:
    warn = """
        from netcl.core.log import get_logger
        get_logger("netcl.runtime.cache").warning("cache_dir_unusable", path="/proc/x")
        """
    assert "structlog" in _loaded_after(warn)
    assert "structlog" in _loaded_after("from netcl.core.log import configure_logging\n"
                                        "configure_logging()")  # fmt: skip


def test_a_bound_logger_keeps_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    from netcl.core.log import get_logger

    log = get_logger("netcl.test.lazy").bind(plan="p1").bind(op=3)
    with caplog.at_level("INFO", logger="netcl.test.lazy"):
        log.info("op_done", seconds=0.5)
        log.debug("not_shown")
        try:
            raise KeyError("k")
        except KeyError:
            log.exception("op_failed")
    done, failed = caplog.records
    assert done.getMessage() == "op_done plan=p1 op=3 seconds=0.5"
    assert failed.levelname == "ERROR" and failed.exc_info and failed.exc_info[0] is KeyError
    assert log.new(x=1) is not None  # the rest of structlog's API is passed through
