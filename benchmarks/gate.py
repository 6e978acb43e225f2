"""The benchmark gate: judges figures computed from pytest-benchmark's own JSON against limits
per device class, and re-measures a failing figure before it fails the run.

How a figure is computed. Every timed figure comes from what pytest-benchmark stores in its
JSON for each benchmark, so the console table, ``bench:compare``, ``bench:report`` and the gate
all see the same numbers. The statistic is the fastest round (min-of-N; a round is one call, or
the mean of a round's loops): load from other processes only adds time, so the fastest round is
the least disturbed. Where two benchmarks timed one after the other drift apart under load, a
benchmark times its floor right before each of its own rounds (paired rounds) and the figure is
the ratio of the two fastest rounds of the same window. A failing check is not believed at once:
``--run`` re-runs only the failing checks' benchmarks (``pytest -k``, more rounds), takes each
benchmark's fastest round over all runs (a paired figure: the best run's figure), and fails only
when the check still fails.

Device classes. The benchmarks' conftest stores the OpenCL device in the JSON's
``machine_info["opencl"]``; the gate picks the limits of that class (``pocl``: PoCL's CPU device,
``nvidia``: NVIDIA's OpenCL) and prints the target beside each limit. A limit is never looser
than its target unless the target is out of reach on that device; then ``note`` says why.
Limits sit close enough to the measured figure that a 20% slowdown of the code a check covers
crosses them.

Adding a check: one entry in ``CHECKS``::

    Check("pool allocate+release vs pyopencl MemoryPool",  # what the console prints
          paired("test_pool_allocate_release"),              # how the figure is computed
          pocl="<= 15", nvidia="<= 15", target="")           # limit per device class, target

Figures:

- ``ratio(a, b)``: the fastest round of benchmark ``a`` over that of ``b`` (two benchmarks of
  one group);
- ``paired(a)``: the fastest round of ``a`` over the fastest of the floor ``a`` timed right
  before each of its rounds (benchmarks/paired.py); use it where two benchmarks' minimums drift
  apart under load;
- ``paired_speedup(a)``: the inverse, how many times faster ``a`` is than its paired floor;
- ``per_unit_us(a, b, n)``: ``(min(a) - min(b)) / n`` in µs, the overhead per op of ``a`` over
  its by-hand twin ``b``;
- ``time_us(a)``: the fastest round of ``a`` per call in µs (a round making
  ``extra_info["calls_per_round"]`` calls is divided by them), for absolute targets;
- ``info(a, key)``: a deterministic value from ``a``'s ``extra_info`` (bytes, counts);
- ``timed_info(a, key)``: a timing ``a`` measured itself (e.g. in a subprocess), the smallest
  over re-measurements.

Benchmark names are pytest-benchmark's (``test_x[param]``). A limit is ``"<= X"`` or
``">= X"``; ``None`` leaves the class ungated (the figure is still printed); ``note=`` explains
a limit that is looser than its target; ``quick=False`` keeps a slow check out of the short
pass. Set a limit about 10% over the figure measured on a loaded machine, then check both ways:
``python3 benchmarks/gate.py FILE`` passes on a clean run and fails with the code slowed
(``NETCL_BENCH_SLOWDOWN``, see benchmarks/conftest.py).

Usage::

    python3 benchmarks/gate.py [FILE.json] [--device-class pocl|nvidia] [--only TEXT] [--retries N]
    python3 benchmarks/gate.py --run [--retries N] [--out DIR] [-- PYTEST ARGS]
    python3 benchmarks/gate.py --limits    # the limits and targets as a markdown table

With no FILE, the newest JSON under ``.benchmarks/``. ``--run`` runs the benchmarks the checks
need (the short pass CI runs), then judges and re-measures; exit status 1 names what regressed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Results = dict[str, list[dict[str, Any]]]  # benchmark name -> its entries, one per run

DEVICE_CLASSES = ("pocl", "nvidia")


@dataclass(frozen=True)
class Figure:
    """How one checked number is computed from the stored results."""

    needs: tuple[str, ...]  # benchmark names
    compute: Callable[[Results], float]
    timed: bool  # a timing: re-measuring can change it
    unit: str = ""
    per_run: bool = False  # paired: judged run by run (the best run counts), never across runs


def _min(results: Results, name: str) -> float:
    return min(float(entry["stats"]["min"]) for entry in results[name])


def _calls(results: Results, name: str) -> int:
    """Calls a round makes itself (``extra_info["calls_per_round"]``), 1 when it loops not."""
    return int(results[name][-1].get("extra_info", {}).get("calls_per_round", 1))


def _smallest(results: Results, name: str, key: str) -> float:
    """The smallest ``extra_info[key]`` of benchmark ``name`` over the runs."""
    return min(float(entry["extra_info"][key]) for entry in results[name])


def ratio(a: str, b: str) -> Figure:
    """The fastest round of ``a`` over the fastest round of ``b``."""
    return Figure((a, b), lambda r: _min(r, a) / _min(r, b), True)


def paired(a: str, key: str = "paired_floor_s") -> Figure:
    """The fastest round of ``a`` over the fastest of the floor ``a`` timed before each of its
    rounds (``extra_info[key]``, seconds; see benchmarks/paired.py): both in the same window."""
    return Figure((a,), lambda r: _min(r, a) / _smallest(r, a, key), True, per_run=True)


def paired_speedup(a: str, key: str = "paired_floor_s") -> Figure:
    """How many times faster ``a`` is than the floor it timed before each of its rounds: the
    floor's fastest round over ``a``'s (the inverse of ``paired``)."""
    return Figure((a,), lambda r: _smallest(r, a, key) / _min(r, a), True, per_run=True)


def per_unit_us(a: str, b: str, n: int) -> Figure:
    """``(min(a) - min(b)) / n`` in µs: ``a``'s cost per op over its by-hand twin ``b``."""
    return Figure((a, b), lambda r: (_min(r, a) - _min(r, b)) / n * 1e6, True, " µs")


def time_us(a: str) -> Figure:
    """The fastest round of ``a`` per call in µs (absolute: for targets stated in µs)."""
    return Figure((a,), lambda r: _min(r, a) / _calls(r, a) * 1e6, True, " µs")


def info(a: str, key: str) -> Figure:
    """``extra_info[key]`` of ``a`` (its latest run): a deterministic figure (bytes, counts)."""
    return Figure((a,), lambda r: float(r[a][-1]["extra_info"][key]), False)


def timed_info(a: str, key: str) -> Figure:
    """The smallest ``extra_info[key]`` of ``a`` over the runs: a timed figure the benchmark can
    only measure itself (e.g. in a subprocess with an SDK), re-measured like the others."""
    return Figure((a,), lambda r: _smallest(r, a, key), True)


@dataclass(frozen=True)
class Check:
    name: str
    figure: Figure
    pocl: str | None = None  # the limit on PoCL's CPU device: "<= X" or ">= X"
    nvidia: str | None = None  # the limit on NVIDIA's OpenCL
    target: str = ""
    note: str = ""  # why a limit is looser than the target, where it is
    quick: bool = True  # part of the short pass (--run); False: only judged on full runs

    def limit(self, device_class: str) -> str | None:
        return {"pocl": self.pocl, "nvidia": self.nvidia}.get(device_class)


# Measured figures (min-of-N, 2-core Xeon with PoCL 3.0 under load from other processes, and an
# H200 with NVIDIA's OpenCL) are in benchmarks/results/README.md; a limit leaves ~10% of room
# over the measured figure so that noise passes and a 20% regression does not.
CHECKS: list[Check] = [
    Check("telemetry check vs no-op span",
          ratio("test_tracing_check", "test_noop_span_api"),
          pocl="<= 0.05", nvidia="<= 0.05", target="well under 1 µs a check; a no-op span ~5 µs"),
    Check("cache in-process hit",
          time_us("test_netcl_memory_hit"),
          pocl="<= 2", nvidia="<= 2", target="<= 2 µs"),
    Check("cache in-process hit vs dict lookup",
          paired("test_netcl_memory_hit"),
          pocl="<= 2.1", nvidia="<= 2.3"),
    Check("cache disk hit vs bare binary load",
          paired("test_netcl_disk_hit_fresh_instance"),
          pocl="<= 1.3", nvidia="<= 1.3", target="<= 1.3"),
    Check("cache disk hit vs pyopencl binary cache",
          ratio("test_netcl_disk_hit_fresh_instance", "test_pyopencl_binary_cache_hit"),
          pocl="<= 1.0", nvidia="<= 0.5", target="<= 0.5", quick=False,
          note="PoCL: pyopencl's hit is 1.3x a bare binary load; 0.5 would beat PoCL's own load"),
    Check("cache disk hit vs pyopencl default build",
          ratio("test_netcl_disk_hit_fresh_instance", "test_pyopencl_default_build"),
          pocl="<= 0.1", nvidia="<= 0.12", target="<= 0.1",
          note="NVIDIA: 0.095-0.098 measured, within noise of the target"),
    Check("cache miss vs bare compile + binary fetch",
          ratio("test_netcl_miss", "test_floor_bare_compile_and_binary"),
          pocl="<= 1.05", nvidia="<= 1.05", target="<= 1.05", quick=False),
    Check("capture replay vs bare enqueue loop",
          paired("test_launch_replay"),
          pocl="<= 1.1", nvidia="<= 1.1", target="<= 1.15"),
    Check("capture recording vs plain knl(...) launches",
          info("test_record_cost", "record_over_plain"),
          pocl="<= 4.5", nvidia="<= 3", target="<= 3",
          note="PoCL: 3.4-4.0 measured on a quiet 2-core host (2026-11-30), target missed there; "
               "NVIDIA: 1.74"),
    Check("capture step speed-up, Python ops",
          paired_speedup("test_step_replay[python_ops]"),
          pocl=">= 3", nvidia=">= 1.3", target=">= 5 on PoCL",
          note="PoCL: 4.7-10 before the leaner BufferPool made the normal step cheaper, 3.6 "
               "since (2026-11-30); NVIDIA: a launch costs ~7-9 µs there, so a lean Python op is "
               "only ~1.4-2x a launch"),
    Check("capture step speed-up, pyopencl.array",
          paired_speedup("test_step_replay[pyopencl_array]"),
          pocl=">= 5", nvidia=">= 3.6", target=">= 5 on PoCL"),
    Check("capture replay with SDK vs none",
          timed_info("test_replay_telemetry_overhead", "sdk_over_none_e2e_min"),
          pocl="<= 1.3", nvidia="<= 1.08", target="<= 1.05",
          note="PoCL: 1.01 on a quiet machine, 1.14-1.22 with another process keeping a core "
               "busy (the SDK's export thread then competes with PoCL's workers); a span per "
               "launch would cost 3x; NVIDIA: 1.04 (medians) measured"),
    Check("graph overhead per node",
          per_unit_us("test_graph_overhead_executor_run[relu_kernel]",
                      "test_graph_overhead_by_hand[relu_kernel]", 64),
          pocl="<= 10", nvidia="<= 10", target="<= 10 µs"),
    Check("graph run vs same fns by hand",
          paired("test_graph_overhead_executor_run[noop]"),
          pocl="<= 8.5", nvidia="<= 6",
          note="PoCL: 4.7-5.3 before the single per-op loop and planner layouts, 7.3 since "
               "(2026-11-30): a regression to win back; per-node overhead stays far under 10 µs"),
    Check("graph pool vs true lower bound, chain",
          info("test_graph_memory_chain", "worst_pool_over_lower_bound"),
          pocl="<= 1.016", nvidia="<= 1.016", target="lower bound + the pool's 1/64 rounding"),
    Check("graph pool vs true lower bound, 12 equal ops",
          info("test_graph_memory_equal_chain", "worst_pool_over_lower_bound"),
          pocl="<= 1.016", nvidia="<= 1.016", target="lower bound + the pool's 1/64 rounding"),
    Check("graph pool vs true lower bound, residual net",
          info("test_graph_memory_residual", "worst_pool_over_lower_bound"),
          pocl="<= 1.10", nvidia="<= 1.10", target="<= 1.10"),
    Check("graph pool vs true lower bound, demo MLP",
          info("test_graph_memory_demo_mlp", "worst_pool_over_lower_bound"),
          pocl="<= 1.016", nvidia="<= 1.016", target="lower bound + the pool's 1/64 rounding"),
    Check("graph pool vs true lower bound, 20 random DAGs",
          info("test_graph_memory_random_dags", "worst_pool_over_lower_bound"),
          pocl="<= 1.10", nvidia="<= 1.10", target="<= 1.10"),
    Check("pool allocate+release vs pyopencl MemoryPool",
          paired("test_pool_allocate_release"),
          pocl="<= 4.5", nvidia="<= 4.7", target="<= 2",
          note="3.8-4.0 measured on PoCL and the H200 host (2026-11-30): a new Tensor per "
               "allocation and two Python calls already cost ~2x the bare MemoryPool cycle"),
    Check("scheduler overhead per op",
          per_unit_us("test_scheduler_host_callables_plan_per_op", "test_hand_host_callables",
                      1000),
          pocl="<= 3.5", nvidia="<= 3", target="<= 3 µs",
          note="PoCL: 2.4-2.9 µs measured since the interrupt-safe bookkeeping (2026-11-30; "
               "1.3 before), an absolute figure that follows the CI machine's speed: room left "
               "so a slower runner does not fail a good commit"),
    Check("scheduler kernels vs by hand",
          ratio("test_scheduler_kernels_sync", "test_hand_kernels_sync"),
          pocl="<= 2.5", nvidia="<= 2",
          note="PoCL: 1.2-2.2 measured, depending on how fast the device drains under load"),
    Check("scheduler pipeline, device-ordered plans vs hand-chained events",
          info("test_pipeline_device_ordered_plans", "ratio_vs_hand_chained"),
          pocl="<= 1.3", nvidia="<= 1.15", target="1.0 (the same overlap as events wired by hand)"),
    Check("scheduler pipeline, device-ordered plans vs one queue (speed-up)",
          info("test_pipeline_device_ordered_plans", "speedup_vs_one_queue"),
          nvidia=">= 1.7", target=">= 1.7 on a GPU (no overlap is possible on a 2-core CPU)"),
]  # fmt: skip


# -- reading results ------------------------------------------------------------------------


def load(paths: Iterable[Path]) -> tuple[Results, dict[str, Any]]:
    """Benchmarks of one or more pytest-benchmark JSON files (runs of the same machine), and the
    machine info of the first."""
    results: Results = {}
    machine: dict[str, Any] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        machine = machine or doc.get("machine_info", {})
        for bench in doc.get("benchmarks", []):
            results.setdefault(bench["name"], []).append(bench)
    return results, machine


def device_class(machine_info: dict[str, Any]) -> str | None:
    """``pocl`` or ``nvidia`` from the OpenCL device the benchmarks conftest recorded."""
    ocl = machine_info.get("opencl") or {}
    text = " ".join(str(ocl.get(k, "")) for k in ("platform", "vendor", "device")).lower()
    if "nvidia" in text:
        return "nvidia"
    if "portable computing language" in text or "pocl" in text:
        return "pocl"
    return None


# -- judging --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    check: Check
    value: float | None  # None: a benchmark is missing
    limit: str | None
    ok: bool
    detail: str = ""

    def line(self) -> str:
        c = self.check
        if self.value is None:
            return f"FAIL {c.name}: {self.detail}"
        value = f"{self.value:.3f}{c.figure.unit}"
        limit = f"limit {self.limit}" if self.limit else "no limit here"
        target = f"; target {c.target}" if c.target else ""
        note = f"  [{c.note}]" if c.note else ""
        verdict = "ok  " if self.ok else "FAIL"
        return f"{verdict} {c.name}: {value} ({limit}{target}){self.detail}{note}"


def _within(value: float, limit: str) -> bool:
    m = re.fullmatch(r"\s*(<=|>=)\s*([0-9.eE+-]+)\s*", limit)
    if not m:
        raise ValueError(f"gate: limit {limit!r} is not '<= X' or '>= X'")
    bound = float(m.group(2))
    return value <= bound if m.group(1) == "<=" else value >= bound


def _value(figure: Figure, results: Results, limit: str | None) -> float:
    """The figure over every run: fastest rounds merged across runs, except a paired figure,
    whose numerator and floor belong to one run: the best run's figure counts."""
    runs = min(len(results[n]) for n in figure.needs)
    if not figure.per_run or runs == 1:
        return figure.compute(results)
    values = [figure.compute({n: [results[n][i]] for n in figure.needs}) for i in range(runs)]
    return max(values) if limit is not None and limit.strip().startswith(">=") else min(values)


def judge(results: Results, checks: Sequence[Check], device: str) -> list[Verdict]:
    verdicts = []
    for c in checks:
        missing = [n for n in c.figure.needs if n not in results]
        limit = c.limit(device)
        if missing:
            verdicts.append(Verdict(c, None, limit, False,
                                    f"benchmark(s) {', '.join(missing)} not in the results"))
            continue
        try:
            value = _value(c.figure, results, limit)
        except (KeyError, ZeroDivisionError) as exc:
            verdicts.append(Verdict(c, None, limit, False, f"cannot compute: {exc!r}"))
            continue
        ok = limit is None or (math.isfinite(value) and _within(value, limit))
        verdicts.append(Verdict(c, value, limit, ok))
    return verdicts


# -- running and re-measuring ---------------------------------------------------------------


def _k_expression(names: Iterable[str]) -> str:
    # -k matches words of the test id; parameters ([...]) cannot be spelled there, so the base
    # name selects every parameter of a test (a few extra benchmarks, never a missing one)
    return " or ".join(sorted({n.split("[", 1)[0] for n in names}))


# the console table: fastest round (what the gate uses), median, rounds, loops per round
TABLE = ("--benchmark-group-by=group", "--benchmark-name=short",
         "--benchmark-columns=min,median,rounds,iterations")
# calibrate sub-µs benchmarks to loops of >= 100 µs a round, so the timer's own cost is noise
MIN_TIME = "--benchmark-min-time=0.0001"


def _pytest(out: Path, names: Iterable[str], max_time: float, min_rounds: int,
            extra: Sequence[str]) -> int:
    bench_dir = Path(__file__).resolve().parent
    cmd = [sys.executable, "-m", "pytest", str(bench_dir), "-q", "-p", "no:randomly",
           "-p", "no:cacheprovider", "--benchmark-only", f"--benchmark-json={out}",
           f"--benchmark-max-time={max_time}", f"--benchmark-min-rounds={min_rounds}",
           MIN_TIME, *TABLE, "-k", _k_expression(names), *extra]
    print("gate: running", " ".join(cmd[1:4]), "... -k", repr(cmd[cmd.index("-k") + 1]),
          flush=True)
    return subprocess.run(cmd, check=False).returncode


def run_and_judge(checks: Sequence[Check], out: Path, retries: int, device: str | None,
                  extra: Sequence[str], first: Path | None = None) -> int:
    """Run the checks' benchmarks (or take ``first``, a run made already), judge, re-run the
    failing checks' benchmarks up to ``retries`` times (more rounds each time), and judge them
    on every run together."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("run-*.json"):
        old.unlink()
    runs = [first or out / "run-0.json"]
    if first is None:
        rc = _pytest(runs[0], [n for c in checks for n in c.figure.needs], 0.2, 5, extra)
        if not runs[0].exists():
            print(f"gate: pytest wrote no results (exit {rc})")
            return 1
    results, machine = load(runs)
    device = device or device_class(machine)
    if device is None:
        print("gate: unknown OpenCL device class; pass --device-class", "|".join(DEVICE_CLASSES))
        return 1
    verdicts = judge(results, checks, device)
    for attempt in range(1, retries + 1):
        failing = [v for v in verdicts if not v.ok and v.check.figure.timed and v.value is not None]
        if not failing:
            break
        print("gate: re-measuring before failing:", "; ".join(v.line() for v in failing))
        runs.append(out / f"run-{attempt}.json")
        _pytest(runs[-1], [n for v in failing for n in v.check.figure.needs],
                0.5 * attempt, 10 * attempt, extra)
        results, _ = load(p for p in runs if p.exists())
        again = {id(v.check): v for v in judge(results, [v.check for v in failing], device)}
        verdicts = [again.get(id(v.check), v) for v in verdicts]
    return report(verdicts, runs, device, machine, len(runs) - 1)


def report(verdicts: Sequence[Verdict], paths: Sequence[Path], device: str,
           machine: dict[str, Any], remeasured: int = 0) -> int:
    print(f"gate: {', '.join(str(p) for p in paths)} (device class {device})")
    if machine.get("netcl_slowdown_injected"):
        print("gate: NETCL_BENCH_SLOWDOWN injected:", ", ".join(machine["netcl_slowdown_injected"]))
    for v in verdicts:
        print(v.line())
    failed = [v for v in verdicts if not v.ok]
    again = f", after {remeasured} re-measurement(s)" if remeasured else ""
    print(f"gate: {len(verdicts) - len(failed)} of {len(verdicts)} checks within limits{again}")
    if failed:
        print("gate: REGRESSION in:", "; ".join(v.check.name for v in failed))
        return 1
    return 0


def limits_table(checks: Sequence[Check]) -> str:
    """The checks as a markdown table: limit per device class beside the target."""
    rows = ["| check | PoCL limit | NVIDIA limit | target | short pass | note |",
            "|---|---|---|---|---|---|"]
    for c in checks:
        cells = [c.name, c.pocl or "-", c.nvidia or "-", c.target or "-",
                 "yes" if c.quick else "no", c.note]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _newest(root: Path) -> Path:
    files = sorted(root.glob("**/*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise SystemExit(f"gate: no pytest-benchmark JSON under {root}; run the benchmarks first")
    return files[-1]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path,
                        help="pytest-benchmark JSON file(s) of one machine (judged together)")
    parser.add_argument("--device-class", choices=DEVICE_CLASSES,
                        help="limits to use (default: from the JSON's machine_info)")
    parser.add_argument("--only", action="append", default=[], help="checks whose name has this")
    parser.add_argument("--limits", action="store_true",
                        help="print the checks' limits per device class and targets (markdown)")
    parser.add_argument("--run", action="store_true",
                        help="run the checks' benchmarks first, re-measure failures")
    parser.add_argument("--retries", type=int, default=None,
                        help="re-measurements of failing checks (--run: 4 by default; "
                             "with FILE: none unless given)")
    parser.add_argument("--out", type=Path, default=Path(".benchmarks/gate"),
                        help="where --run writes its JSON files")
    args = parser.parse_args(argv)
    checks = [c for c in CHECKS if not args.only or any(o in c.name for o in args.only)]
    if not checks:
        parser.error(f"no check matches {args.only}")
    if args.limits:
        print(limits_table(checks))
        return 0
    if args.run:
        if not args.only:
            checks = [c for c in checks if c.quick]
        retries = 4 if args.retries is None else args.retries
        return run_and_judge(checks, args.out, retries, args.device_class, extra)
    paths = args.results or [_newest(Path(".benchmarks"))]
    if args.retries and len(paths) == 1:
        return run_and_judge(checks, args.out, args.retries, args.device_class, extra, paths[0])
    results, machine = load(paths)
    device = args.device_class or device_class(machine)
    if device is None:
        print(f"gate: {paths[0]} does not name an OpenCL device (runs before the benchmarks' "
              f"conftest recorded it); pass --device-class {'|'.join(DEVICE_CLASSES)}")
        return 2
    return report(judge(results, checks, device), paths, device, machine)


if __name__ == "__main__":
    sys.exit(main())
