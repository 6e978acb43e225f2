"""Evidence that the history names only real regressions, and where they began: clean runs and
one run with an injected slowdown, while another process keeps one core busy.

Each run is what ``bench:run`` does (every benchmark, autosaved, then the gate with
re-measurement, its verdicts recorded in the run), into ``--storage``. Then each run is compared
with the one before it (``history.py compare NEW --json``) and the report is written. The
evidence holds when every clean pair flags no regression and the injected run flags the slowed
benchmark (at most ``--others`` more), with the run where its step began being the injected one.

    python3 benchmarks/tracking/history_evidence.py [--clean 3] [--slowdown capture_replay=0.5]
        [--expect test_launch_replay] [--storage .benchmarks/history-evidence] [--no-busy]
        [--no-gate] [-- PYTEST ARGS]   # e.g. -k "launch or pool" --benchmark-max-time=0.2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
RUN = [
    "-p",
    "no:randomly",
    "--benchmark-only",
    "--benchmark-autosave",
    "--benchmark-min-time=0.0001",
    "--benchmark-group-by=group",
    "--benchmark-name=short",
    "--benchmark-columns=min,median,rounds,iterations",
]


def _bench_run(storage: Path, slowdown: str | None, extra: list[str], gate: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NETCL_BENCH_SLOWDOWN"}
    if slowdown:
        env["NETCL_BENCH_SLOWDOWN"] = slowdown
    before = set(storage.glob("*/*.json"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(BENCHMARKS),
            "-q",
            *RUN,
            f"--benchmark-storage={storage}",
            *extra,
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (saved,) = set(storage.glob("*/*.json")) - before
    verdict = "saved"
    if gate:  # the gate's own re-measurements run the benchmarks it needs, whatever -k chose
        res = subprocess.run(
            [
                sys.executable,
                str(HERE / "gate.py"),
                str(saved),
                "--retries",
                "2",
                "--record",
                "--out",
                str(storage / "gate"),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        verdict = res.stdout.strip().splitlines()[-1]
    print(f"evidence: {saved.name}{' with ' + slowdown if slowdown else ''}: {verdict}", flush=True)


def _compare(storage: Path, run_id: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "history.py"),
            "compare",
            run_id,
            "--json",
            "--storage",
            str(storage),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _line(doc: dict[str, Any]) -> str:
    regs = (
        ", ".join(
            f"{c['name']} x{c['ratio']:.2f} (noise {c['noise_band'][0]:.2f}-"
            f"{c['noise_band'][1]:.2f}, began at "
            f"{c['began']['id'] if c['began'] else 'no step'})"
            for c in doc["regressions"]
        )
        or "none"
    )
    return (
        f"{doc['old']['id']} -> {doc['new']['id']}: regressions {regs}; improvements "
        f"{len(doc['improvements'])}; unchanged {len(doc['unchanged'])}; history too short "
        f"{len(doc['history_too_short'])}"
    )


def _runs(args: argparse.Namespace, extra: list[str]) -> None:
    busy = None if args.no_busy else subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        for slowdown in [None] * args.clean + [args.slowdown]:
            _bench_run(args.storage, slowdown, extra, not args.no_gate)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clean", type=int, default=3)
    parser.add_argument("--slowdown", default="capture_replay=0.5")
    parser.add_argument(
        "--expect", default="test_launch_replay", help="the benchmark the injected run must flag"
    )
    parser.add_argument("--others", type=int, default=1, help="other flags allowed there")
    parser.add_argument("--storage", type=Path, default=Path(".benchmarks/history-evidence"))
    parser.add_argument("--no-busy", action="store_true", help="no process keeping a core busy")
    parser.add_argument("--no-gate", action="store_true", help="runs without the gate")
    parser.add_argument(
        "--judge-only",
        action="store_true",
        help="no new runs: compare and report the runs in --storage",
    )
    args = parser.parse_args(argv)
    if not args.judge_only:
        _runs(args, extra)
    ids = sorted(p.name[:4] for p in args.storage.glob("*/[0-9][0-9][0-9][0-9]_*.json"))
    docs = [_compare(args.storage, i) for i in ids[-args.clean :]]
    ok = True
    for doc in docs:
        print("evidence:", _line(doc), flush=True)
        flagged = [c["name"] for c in doc["regressions"]]
        if doc["new"]["injected"]:
            began = {c["name"]: (c["began"] or {}).get("id") for c in doc["regressions"]}
            ok &= began.get(args.expect) == doc["new"]["id"]
            ok &= len(flagged) <= 1 + args.others
        else:
            ok &= not flagged
    report = args.storage / "report.html"
    subprocess.run(
        [
            sys.executable,
            str(HERE / "history.py"),
            "report",
            "--storage",
            str(args.storage),
            "--out",
            str(report),
        ],
        check=True,
    )
    print(f"evidence: {'held' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
