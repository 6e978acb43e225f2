"""The benchmark ratio gate: reads pytest-benchmark JSON and fails when an in-run ratio crosses
its threshold.

Absolute times move with the machine; ratios of two benchmarks measured in the same run do not
(much). Each ``Ratio`` divides the median of one benchmark by the median of another from the same
JSON file. Thresholds are set for a noisy shared 2-core CPU with PoCL: generous against noise,
tight enough that a real regression (say, a span per replayed launch) crosses them.

    python benchmarks/gate.py [RESULTS.json]    # default: newest file under .benchmarks/
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Ratio:
    name: str
    numerator: str  # benchmark name (the test function name, with parameters if any)
    denominator: str
    max: float
    why: str


RATIOS: list[Ratio] = [
    Ratio(
        "telemetry fast path vs no-op span",
        "test_tracing_check",
        "test_noop_span_api",
        0.05,
        "the no-SDK check must stay far below what a no-op span costs",
    ),
]


def _load(path: Path) -> dict[str, dict[str, Any]]:
    data = json.loads(path.read_text())
    return {b["name"]: b for b in data["benchmarks"]}


def _newest(root: Path) -> Path:
    files = sorted(root.glob("**/*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise SystemExit(f"gate: no pytest-benchmark JSON under {root}; run the benchmarks first")
    return files[-1]


def check(results: dict[str, dict[str, Any]], ratios: list[Ratio]) -> list[str]:
    """One line per ratio; lines of failed ratios start with 'FAIL'."""
    lines = []
    for r in ratios:
        missing = [n for n in (r.numerator, r.denominator) if n not in results]
        if missing:
            lines.append(f"FAIL {r.name}: benchmark(s) {', '.join(missing)} not in the results")
            continue
        value = results[r.numerator]["stats"]["median"] / results[r.denominator]["stats"]["median"]
        verdict = "ok  " if value <= r.max else "FAIL"
        lines.append(
            f"{verdict} {r.name}: {r.numerator} / {r.denominator} = {value:.3f} "
            f"(limit {r.max:g}; {r.why})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, help="pytest-benchmark JSON file")
    parser.add_argument("--only", action="append", default=[], help="check ratios whose name has this")
    args = parser.parse_args(argv)
    path = args.results or _newest(Path(".benchmarks"))
    ratios = [r for r in RATIOS if not args.only or any(o in r.name for o in args.only)]
    lines = check(_load(path), ratios)
    print(f"gate: {path}")
    print("\n".join(lines))
    failed = sum(line.startswith("FAIL") for line in lines)
    print(f"gate: {len(lines) - failed} of {len(lines)} ratios within limits")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
