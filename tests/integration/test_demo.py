"""The main job runs end to end on the default device and checks its own results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_and_prints_its_table(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "demo/demo.py"), "--steps", "6"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "NETCL_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for row in (
        "program cache: cold compile",
        "program cache: disk hit (new instance)",
        "replay speed-up over normal step",
        "pool peak (plan) / lower bound",
        "steps checked against numpy                  7",
    ):
        assert row in out, out
    # the global cacher compiled into the private cache dir: a first run misses
    assert "global cacher this run                       0 hits, 1 compile" in out, out
    peak, bound = out.split("pool peak (plan) / lower bound")[1].split("\n")[0].split("/")
    assert int(peak.split()[0]) == int(bound.split()[0])
    # a short report: the table, a per-span-name summary, where telemetry went; no span lines
    lines = out.splitlines()
    assert len(lines) <= 80 and max(len(ln) for ln in lines) <= 100, out
    spans = {ln.split()[0]: ln.split() for ln in lines if ln.startswith("netcl.")}
    for name in ("netcl.cache.get_program", "netcl.graph.run", "netcl.capture.replay"):
        assert name in spans, out
    assert int(spans["netcl.capture.replay"][1]) == 6 + 20  # count: scheduled + timed replays
    assert "traces:  not exported" in out and "--console-spans" in out
    assert "span netcl." not in proc.stderr


def test_demo_console_spans_on_request(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "demo/demo.py"), "--steps", "2", "--console-spans"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "NETCL_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    replays = [ln for ln in proc.stderr.splitlines() if ln.startswith("span netcl.capture.replay ")]
    assert len(replays) == 2 + 20, proc.stderr[-3000:]
    assert all(" trace_id=" in ln and " parent_id=" in ln and " status=" in ln for ln in replays)
    assert "metric netcl.capture.replays{} 22" in proc.stderr
    assert "traces:  stderr, one line each" in proc.stdout
