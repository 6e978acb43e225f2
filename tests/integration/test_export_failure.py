"""Telemetry that fails politely, seen from the demo: a dead or silent OTLP collector costs a
200-step run at most 5 s more than none, and the summary says the export failed; a bad OTEL_*
value is one line and exit status 2; OTEL_SDK_DISABLED is reported as it is."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRA_S = 5.0


def _demo(tmp: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "demo/demo.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**clean, "NETCL_CACHE_DIR": str(tmp / "cache"), **env},
    )
    return proc, time.monotonic() - t0


@pytest.mark.slow
def test_a_dead_collector_costs_seconds_not_minutes(
    tmp_path: Path, silent_port: int, closed_port: int
) -> None:
    """Each exporter's run against the larger of the plain runs right before and after it (the
    machine's load moves both); one over the limit is measured once more before failing, as the
    benchmark gate re-measures (a slow spell of a shared runner once made a silent collector's
    run read 7 s over while the plain runs around it read 4.7 s)."""
    _demo(tmp_path, "--steps", "1")  # the global cache's compile, out of the measured runs
    base, t_before = _demo(tmp_path, "--steps", "200")
    assert base.returncode == 0, base.stderr[-3000:]
    assert "export FAILED" not in base.stdout
    extras: dict[str, list[float]] = {}
    for what, port, protocol in [
        ("refusing", closed_port, "grpc"),
        ("silent", silent_port, "grpc"),
        ("silent", silent_port, "http/protobuf"),
    ]:
        runs = extras[f"{what} {protocol}"] = []
        for _ in range(2):  # a second run only where the first was over the limit
            proc, seconds = _demo(
                tmp_path,
                "--steps",
                "200",
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert "export FAILED: " in proc.stdout, proc.stdout
            assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
            _, t_after = _demo(tmp_path, "--steps", "200")
            runs.append(seconds - max(t_before, t_after))
            t_before = t_after
            if runs[-1] <= EXTRA_S:
                break
    slow = {k: v for k, v in extras.items() if min(v) > EXTRA_S}
    assert not slow, extras
    print({k: [round(x, 2) for x in v] for k, v in extras.items()}, "s over the plain runs")


def test_bad_otel_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc, _ = _demo(tmp_path, "--steps", "1", OTEL_TRACES_EXPORTER="consol")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("demo.py: error: OTEL_TRACES_EXPORTER='consol' is not valid: "), line
    assert "console" in line and "otlp" in line, line


def test_sdk_disabled_is_reported_as_it_is(tmp_path: Path) -> None:
    proc, _ = _demo(tmp_path, "--steps", "2", "--console-spans", OTEL_SDK_DISABLED="true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "telemetry: off (OTEL_SDK_DISABLED=true)" in proc.stdout, proc.stdout
    assert "stderr, one line each" not in proc.stdout
    assert "span netcl." not in proc.stderr and "metric netcl." not in proc.stderr
