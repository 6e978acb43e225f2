"""Evidence that the gate is robust and sensitive: false alarms on clean passes while another
process keeps one core busy, and detection of an injected slowdown in each of capture replay,
cache hit, graph executor, pool allocation and the scheduler.

Each pass is the short gate CI runs (``gate.py --run``: the gated benchmarks, then
re-measurement of failing checks). Injected passes set ``NETCL_BENCH_SLOWDOWN`` (see
benchmarks/conftest.py). A pass counts as caught when the gate exits 1 and names the check that
covers the slowed code. The effective slowdown is the slowed benchmark's fastest round against
the median of the clean passes' fastest rounds.

    python3 benchmarks/tracking/gate_evidence.py [--clean 10] [--injected 10] [--fraction 0.2]
                                        [--targets capture_replay,...] [--no-busy]
                                        [--injected-scope full|check]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

# what each injected slowdown must make the gate name, and the benchmark it slows
EXPECTED = {
    "capture_replay": ("capture replay vs bare enqueue loop", "test_launch_replay"),
    "cache_hit": ("cache in-process hit vs dict lookup", "test_netcl_memory_hit"),
    "graph_executor": ("graph run vs same fns by hand", "test_graph_overhead_executor_run[noop]"),
    "pool_allocation": (
        "pool allocate+release vs pyopencl MemoryPool",
        "test_pool_allocate_release",
    ),
    "scheduler": (
        "scheduler run vs the same bookkeeping by hand",
        "test_scheduler_host_callables_plan_per_op",
    ),
}
GATE = Path(__file__).with_name("gate.py")


def _one_pass(
    out: Path, slowdown: str | None, only: str | None = None
) -> tuple[int, float, list[str], str]:
    env = dict(os.environ)
    env.pop("NETCL_BENCH_SLOWDOWN", None)
    if slowdown:
        env["NETCL_BENCH_SLOWDOWN"] = slowdown
    t0 = time.monotonic()
    cmd = [sys.executable, str(GATE), "--run", "--out", str(out)]
    if only:
        cmd += ["--only", only]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    (out / "gate.log").write_text(res.stdout + res.stderr)
    named: list[str] = []
    remeasured = ""
    for line in res.stdout.splitlines():
        if line.startswith("gate: REGRESSION in: "):
            named = line.removeprefix("gate: REGRESSION in: ").split("; ")
        if line.startswith("gate: ") and "checks within limits" in line:
            remeasured = line.removeprefix("gate: ")
    return res.returncode, took, named, remeasured


def _fastest(out: Path, bench: str) -> float | None:
    path = out / "run-0.json"
    if not path.exists():
        return None
    for b in json.loads(path.read_text())["benchmarks"]:
        if b["name"] == bench:
            return float(b["stats"]["min"])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clean", type=int, default=10)
    parser.add_argument("--injected", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--targets", default=",".join(EXPECTED))
    parser.add_argument("--no-busy", action="store_true", help="no busy process on a core")
    parser.add_argument("--out", type=Path, default=Path(".benchmarks/evidence"))
    parser.add_argument(
        "--injected-scope",
        choices=("full", "check"),
        default="full",
        help="injected passes: the whole short gate, or only the check that "
        "covers the slowed code (its benchmarks alone: faster)",
    )
    args = parser.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the busy process too
    busy = None
    if not args.no_busy:
        busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        print(f"evidence: busy process pid {busy.pid} keeps one core busy", flush=True)
    print(f"evidence: load average at start {os.getloadavg()}", flush=True)
    ok = True
    clean_fastest: dict[str, list[float]] = {}
    try:
        alarms = 0
        for i in range(args.clean):
            out = args.out / f"clean-{i}"
            out.mkdir(parents=True, exist_ok=True)
            rc, took, named, summary = _one_pass(out, None)
            alarms += rc != 0
            for _, bench in EXPECTED.values():
                t = _fastest(out, bench)
                if t is not None:
                    clean_fastest.setdefault(bench, []).append(t)
            print(
                f"clean {i + 1:2}/{args.clean}: exit {rc} in {took:5.1f} s: {summary}"
                + (f"; named {named}" if named else ""),
                flush=True,
            )
        print(f"evidence: {alarms} false alarm(s) in {args.clean} clean passes", flush=True)
        ok &= alarms == 0
        for target in targets:
            check, bench = EXPECTED[target]
            caught = 0
            slow: list[float] = []
            for i in range(args.injected):
                out = args.out / f"{target}-{i}"
                out.mkdir(parents=True, exist_ok=True)
                only = check if args.injected_scope == "check" else None
                rc, took, named, summary = _one_pass(out, f"{target}={args.fraction}", only)
                hit = rc == 1 and check in named
                caught += hit
                t = _fastest(out, bench)
                base = clean_fastest.get(bench)
                if t is not None and base:
                    slow.append(t / statistics.median(base) - 1)
                print(
                    f"{target} {i + 1:2}/{args.injected}: exit {rc} in {took:5.1f} s, "
                    f"{'caught' if hit else 'MISSED'}; named {named}",
                    flush=True,
                )
            eff = f"{statistics.median(slow):+.0%} (median)" if slow else "n/a"
            print(
                f"evidence: {target} +{args.fraction:.0%} injected (effective on {bench}: "
                f"{eff}): caught {caught} of {args.injected}",
                flush=True,
            )
            ok &= caught == args.injected
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print(f"evidence: load average at end {os.getloadavg()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
