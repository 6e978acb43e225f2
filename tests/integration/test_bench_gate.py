"""The benchmark gate catches a real slowdown: the core benchmarks run for real in a subprocess
(no SDK), once as they are and once with a plugin that makes the telemetry fast path slow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SLOWDOWN = textwrap.dedent(
    """
    import time
    from netcl.core import telemetry

    _real = telemetry.tracing

    def _slow_tracing() -> bool:
        end = time.perf_counter_ns() + 3_000  # 3 µs: the cost of a careless span on a hot path
        while time.perf_counter_ns() < end:
            pass
        return _real()

    telemetry.tracing = _slow_tracing
    """
)


def _bench_then_gate(tmp_path: Path, *plugin: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    bench = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "benchmarks/bench_core.py"), "-q",
         "-p", "no:randomly", "-p", "no:cacheprovider", *plugin,
         "-k", "tracing_check or noop_span", "--benchmark-only", "--benchmark-max-time=0.05",
         "--benchmark-min-rounds=5", f"--benchmark-json={out}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gate.py"), str(out),
         "--only", "telemetry fast path"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_gate_passes_on_the_real_code(tmp_path: Path) -> None:
    gate = _bench_then_gate(tmp_path)
    assert gate.returncode == 0, gate.stdout
    assert "ok   telemetry fast path vs no-op span" in gate.stdout


def test_gate_catches_an_injected_slowdown(tmp_path: Path) -> None:
    (tmp_path / "netcl_slowdown.py").write_text(_SLOWDOWN)
    gate = _bench_then_gate(tmp_path, "-p", "netcl_slowdown")
    assert gate.returncode == 1, gate.stdout
    assert "FAIL telemetry fast path vs no-op span" in gate.stdout
