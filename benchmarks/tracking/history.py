"""Benchmark history: saved pytest-benchmark runs compared, with their noise, and reported.

Runs are the files ``bench:run`` saves (``--benchmark-autosave``):
``.benchmarks/<os-python-bits>/NNNN_<commit>_<date>[_uncommitted-changes].json``; each holds
the commit, the machine (host, CPU, and the OpenCL device the benchmarks' conftest records), any
slowdown injected on purpose, and the gate's final verdicts (``gate.py --record``). Runs are
grouped by machine (host + OpenCL device) and ordered by time. Times are each benchmark's
fastest round, as the gate uses. A change counts only outside the benchmark's noise band
(benchmarks/tracking/history_stats.py says how the band comes from the history and the rounds).

    python3 benchmarks/tracking/history.py compare NEW    # against the run before it, saying so
    python3 benchmarks/tracking/history.py compare OLD NEW [--json]
    python3 benchmarks/tracking/history.py report [--out .benchmarks/report.html]

``compare`` exits 2 naming an id that is not saved, or a run compared with itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history_report
import history_text
from history_runs import (
    Run,
    compare_runs,
    comparison_doc,
    fail,
    machine_runs,
    resolve,
    saved_runs,
)

__all__ = ["Run", "compare_runs", "comparison_doc", "main", "saved_runs"]


def _pair(storage: Path, ids: list[str]) -> tuple[list[Run], str]:
    """The runs to compare; one id: that run and the one before it on its machine (said)."""
    runs = resolve(storage, ids)
    if len({r.path for r in runs}) != len(runs):
        raise fail(f"a run cannot be compared with itself ({' '.join(ids)}); name two runs")
    if len(runs) > 1:
        return runs, ""
    before = machine_runs(saved_runs(storage), runs[0])[:-1]
    if not before:
        raise fail(
            f"{runs[0].id} is the first saved run of {runs[0].machine}; nothing to "
            "compare it with (name two runs)"
        )
    note = (
        f"one run given: comparing {runs[0].id} with the run before it on the same "
        f"machine, {before[-1].id}"
    )
    return [before[-1], runs[0]], note


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--storage",
        type=Path,
        default=Path(".benchmarks"),
        help="pytest-benchmark's storage folder",
    )
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", parents=[common], help="compare saved runs by id")
    cmp.add_argument("ids", nargs="+", help="NEW, or OLD NEW (more: the first and last)")
    cmp.add_argument("--json", action="store_true", help="one JSON document on stdout")
    rep = sub.add_parser("report", parents=[common], help="write the HTML history report")
    rep.add_argument("--out", type=Path, default=Path(".benchmarks/report.html"))
    args = parser.parse_args(argv)
    if args.command == "compare":
        runs, note = _pair(args.storage, args.ids)
        result = compare_runs(runs[0], runs[-1], saved_runs(args.storage))
        if args.json:
            print(json.dumps(comparison_doc(result, note), indent=2))
            return 0
        return int(history_text.print_comparison(result, runs, note))
    runs = saved_runs(args.storage)
    if not runs:
        print(
            f"report: no saved runs under {args.storage}; run `hatch run bench:run` first",
            file=sys.stderr,
        )
        return 2
    return int(history_report.write(runs, args.out))


if __name__ == "__main__":
    sys.exit(main())
