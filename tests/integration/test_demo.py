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
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "NETCL_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
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
    assert "global cacher this run                       0 hit(s), 1 compile(s)" in out, out
    peak, bound = out.split("pool peak (plan) / lower bound")[1].split("\n")[0].split("/")
    assert int(peak.split()[0]) == int(bound.split()[0])
    # console telemetry: one line per span on stderr, replay spans among them
    assert "span netcl.capture.replay " in proc.stderr
    assert "metric netcl.capture.replays{} " in proc.stderr
