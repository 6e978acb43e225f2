"""The benchmark ratio gate: reads pytest-benchmark JSON and fails when an in-run ratio crosses
its threshold.

Absolute times move with the machine; ratios measured in the same run do not (much). A check
reads either the ratio of two benchmarks' medians from the same JSON file, or a ratio a benchmark
measured itself (contenders timed alternately) and stored in its ``extra_info``. Limits are set
for a noisy shared 2-core CPU with PoCL: generous against noise, tight enough that a real
regression (a span per replayed launch, a lost fast path, a planner that stops reusing memory)
crosses them. The issue targets are quoted beside each limit.

    python benchmarks/gate.py [RESULTS.json] [--only TEXT]   # default: newest under .benchmarks/
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Check:
    name: str
    benchmark: str  # the benchmark's name as pytest-benchmark stores it (with [params])
    value: str  # "/other_benchmark" (ratio of medians) or an extra_info key
    max: float | None = None
    min: float | None = None
    target: str = ""

    def measure(self, results: dict[str, dict[str, Any]]) -> float:
        bench = results[self.benchmark]
        if self.value.startswith("/"):
            other = results[self.value[1:]]
            return float(bench["stats"]["median"] / other["stats"]["median"])
        return float(bench["extra_info"][self.value])

    def needs(self) -> list[str]:
        return [self.benchmark] + ([self.value[1:]] if self.value.startswith("/") else [])


CHECKS: list[Check] = [
    Check("telemetry fast path vs no-op span", "test_tracing_check", "/test_noop_span_api",
          max=0.05, target="well under 1 µs a check, a no-op span costs ~5 µs"),
    Check("cache in-process hit (µs)", "test_netcl_memory_hit", "median_us", max=2.0,
          target="<= 2 µs"),
    Check("cache disk hit vs bare binary load + file read", "test_netcl_disk_hit_fresh_instance",
          "ratio_to_floor", max=1.5, target="<= 1.3"),
    Check("cache disk hit vs pyopencl binary cache", "test_netcl_disk_hit_fresh_instance",
          "ratio_to_pyopencl_binary", max=1.0, target="<= 0.5 (missed on PoCL: see README)"),
    Check("cache disk hit vs pyopencl default build", "test_netcl_disk_hit_fresh_instance",
          "ratio_to_pyopencl_default", max=0.1, target="<= 0.1"),
    Check("cache miss vs bare compile + binary fetch", "test_netcl_miss",
          "ratio_to_bare_compile_binary", max=1.3, target="<= 1.05 of the bare compile"),
    Check("capture replay vs bare enqueue loop", "test_launch_replay", "replay_over_bare",
          max=1.3, target="<= 1.15"),
    Check("capture recording vs plain knl(...) launches", "test_record_cost",
          "record_over_plain", max=3.0, target="<= 3"),
    Check("capture step speed-up, Python ops", "test_step_replay[python_ops]",
          "normal_over_replay", min=2.0, target=">= 5 on PoCL"),
    Check("capture step speed-up, pyopencl.array", "test_step_replay[pyopencl_array]",
          "normal_over_replay", min=3.0, target=">= 5 on PoCL"),
    Check("capture replay with SDK vs none", "test_replay_telemetry_overhead",
          "sdk_over_none_e2e", max=1.15, target="<= 1.05"),
    Check("graph overhead per node (µs)", "test_graph_overhead_executor_run[relu_kernel]",
          "overhead_us_per_node", max=10.0, target="<= 10 µs"),
    Check("graph run vs same fns by hand", "test_graph_overhead_executor_run[relu_kernel]",
          "graph_over_by_hand", max=1.5),
    Check("graph pool vs true lower bound, chain", "test_graph_memory_chain",
          "worst_pool_over_lower_bound", max=1.016, target="lower bound + 1/64 rounding"),
    Check("graph pool vs true lower bound, 12 equal ops", "test_graph_memory_equal_chain",
          "worst_pool_over_lower_bound", max=1.016, target="lower bound + 1/64 rounding"),
    Check("graph pool vs true lower bound, residual", "test_graph_memory_residual",
          "worst_pool_over_lower_bound", max=1.10, target="<= 1.10"),
    Check("graph pool vs true lower bound, demo MLP", "test_graph_memory_demo_mlp",
          "worst_pool_over_lower_bound", max=1.016, target="lower bound + 1/64 rounding"),
    Check("graph pool vs true lower bound, 20 random DAGs", "test_graph_memory_random_dags",
          "worst_pool_over_lower_bound", max=1.10, target="<= 1.10"),
    Check("pool allocate+release vs pyopencl MemoryPool", "test_pool_allocate_release",
          "pool_over_memorypool", max=4.0, target="<= 2 (not reached on PoCL: 2.2-3.4)"),
    Check("scheduler overhead per op (µs)", "test_scheduler_host_callables_plan_per_op",
          "overhead_us_per_op", max=3.0, target="<= 3 µs"),
    Check("scheduler kernels vs by hand", "test_scheduler_kernels_sync", "ratio_vs_hand",
          max=2.0),
    Check("scheduler pipeline, device-ordered plans vs hand-chained events",
          "test_pipeline_device_ordered_plans", "ratio_vs_hand_chained", max=1.3,
          target="1.0 (equal; on a GPU also >= 1.7x one queue)"),
]  # fmt: skip


def _newest(root: Path) -> Path:
    files = sorted(root.glob("**/*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise SystemExit(f"gate: no pytest-benchmark JSON under {root}; run the benchmarks first")
    return files[-1]


def check(results: dict[str, dict[str, Any]], checks: list[Check]) -> list[str]:
    """One line per check; lines of failed checks start with 'FAIL'."""
    lines = []
    for c in checks:
        missing = [n for n in c.needs() if n not in results]
        if missing:
            lines.append(f"FAIL {c.name}: benchmark(s) {', '.join(missing)} not in the results")
            continue
        value = c.measure(results)
        ok = (c.max is None or value <= c.max) and (c.min is None or value >= c.min)
        bounds = []
        if c.min is not None:
            bounds.append(f">= {c.min:g}")
        if c.max is not None:
            bounds.append(f"<= {c.max:g}")
        limit = " and ".join(bounds)
        target = f"; target {c.target}" if c.target else ""
        lines.append(f"{'ok  ' if ok else 'FAIL'} {c.name}: {value:.3f} (limit {limit}{target})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, help="pytest-benchmark JSON file")
    parser.add_argument("--only", action="append", default=[], help="checks whose name has this")
    args = parser.parse_args(argv)
    path = args.results or _newest(Path(".benchmarks"))
    checks = [c for c in CHECKS if not args.only or any(o in c.name for o in args.only)]
    results = {b["name"]: b for b in json.loads(path.read_text())["benchmarks"]}
    lines = check(results, checks)
    print(f"gate: {path}")
    print("\n".join(lines))
    failed = sum(line.startswith("FAIL") for line in lines)
    print(f"gate: {len(lines) - failed} of {len(lines)} checks within limits")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
