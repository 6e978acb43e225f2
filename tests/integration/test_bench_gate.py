"""The benchmark gate (benchmarks/tracking/gate.py, its table benchmarks/tracking/gate_checks.toml).

The gate's logic is checked on synthetic pytest-benchmark JSON; one real short run shows a
slowdown injected through ``NETCL_BENCH_SLOWDOWN`` caught, re-measured and named. The history
tools have their own tests (test_bench_history.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "tracking"))
import gate  # noqa: E402
import gate_table  # noqa: E402

POCL = {
    "platform": "Portable Computing Language",
    "vendor": "GenuineIntel",
    "device": "cpu-haswell-Intel(R) Xeon(R) CPU",
}
NVIDIA = {"platform": "NVIDIA CUDA", "vendor": "NVIDIA Corporation", "device": "NVIDIA H200"}

# the checks an injected slowdown must trip, with the benchmark each one times
PAIRED = {
    "capture replay vs bare enqueue loop": "test_launch_replay",
    "cache in-process hit vs dict lookup": "test_netcl_memory_hit",
    "graph run vs same fns by hand": "test_graph_overhead_executor_run[noop]",
    "pool allocate+release vs pyopencl MemoryPool": "test_pool_allocate_release",
}
CHECKED = [*PAIRED, "cache in-process hit", "graph pool vs true lower bound, chain"]


def _limit(check: str, cls: str = "pocl") -> float:
    limit = next(c for c in gate.CHECKS if c.name == check).limit(cls)
    assert limit is not None and limit.upper
    return limit.bound


def _clean() -> dict[str, tuple[float, dict[str, Any]]]:
    """Fastest rounds (s) and extra_info of a clean PoCL run: every paired figure 10% under its
    limit, so a 20% slowdown crosses it whatever the limits are tuned to."""
    runs: dict[str, tuple[float, dict[str, Any]]] = {
        "test_graph_memory_chain": (800e-6, {"worst_pool_over_lower_bound": 1.0})
    }
    for check, bench in PAIRED.items():
        extra: dict[str, Any] = {"paired_floor_s": 100e-6 / (_limit(check) / 1.1)}
        if bench == "test_netcl_memory_hit":
            extra["calls_per_round"] = 100  # 1 µs a hit
        runs[bench] = (100e-6, extra)
    return runs


def _doc(
    runs: dict[str, tuple[float, dict[str, Any]]],
    opencl: dict[str, str] | None,
    commit: str = "abc",
) -> dict[str, Any]:
    benches = [
        {
            "name": name,
            "group": "g",
            "extra_info": extra,
            "stats": {"min": t, "median": t * 1.2, "iterations": 1, "rounds": 50},
        }
        for name, (t, extra) in runs.items()
    ]
    machine: dict[str, Any] = {"node": "ci-host"}
    if opencl:
        machine["opencl"] = opencl
    return {
        "machine_info": machine,
        "commit_info": {"id": commit, "dirty": False},
        "benchmarks": benches,
        "datetime": f"2026-11-30T10:00:0{len(commit) % 10}",
    }


def _slowed(bench: str, factor: float = 1.2) -> dict[str, tuple[float, dict[str, Any]]]:
    runs = _clean()
    t, extra = runs[bench]
    runs[bench] = (t * factor, extra)
    return runs


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _gate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    only = [a for c in CHECKED for a in ("--only", c)]
    rc = gate.main([*args, *only])
    return rc, capsys.readouterr().out


def test_clean_synthetic_run_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _gate(capsys, str(_write(tmp_path / "r.json", _doc(_clean(), POCL))))
    assert rc == 0, out
    assert "(device class pocl)" in out
    limit = _limit("capture replay vs bare enqueue loop")
    assert (
        f"ok   capture replay vs bare enqueue loop: {limit / 1.1:.3f} (limit <= {limit:g}; "
        "target <= 1.15)"
    ) in out
    assert "ok   cache in-process hit: 1.000 µs (limit <= 2; target <= 2 µs)" in out


@pytest.mark.parametrize("check", list(PAIRED))
def test_a_20_percent_slowdown_fails_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], check: str
) -> None:
    rc, out = _gate(capsys, str(_write(tmp_path / "r.json", _doc(_slowed(PAIRED[check]), POCL))))
    assert rc == 1, out
    assert f"FAIL {check}:" in out
    assert out.rstrip().endswith(f"gate: REGRESSION in: {check}")


def test_limits_follow_the_device_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the limits differ per class (the table's data): a figure between them passes on one only
    check = "cache in-process hit vs dict lookup"
    pocl, nvidia = _limit(check), _limit(check, "nvidia")
    assert pocl < nvidia
    runs = _clean()
    t, extra = runs[PAIRED[check]]
    runs[PAIRED[check]] = (t, {**extra, "paired_floor_s": t / ((pocl + nvidia) / 2)})
    rc, out = _gate(capsys, str(_write(tmp_path / "n.json", _doc(runs, NVIDIA))))
    assert rc == 0 and "(device class nvidia)" in out, out
    rc, out = _gate(capsys, str(_write(tmp_path / "p.json", _doc(runs, POCL))))
    assert rc == 1 and "(device class pocl)" in out and f"FAIL {check}" in out, out
    rc, out = _gate(capsys, str(tmp_path / "p.json"), "--device-class", "nvidia")
    assert rc == 0, out


def test_unknown_device_and_missing_benchmark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _gate(capsys, str(_write(tmp_path / "u.json", _doc(_clean(), None))))
    assert rc == 2 and "--device-class pocl|nvidia" in out, out
    partial = {k: v for k, v in _clean().items() if k != "test_pool_allocate_release"}
    rc, out = _gate(capsys, str(_write(tmp_path / "m.json", _doc(partial, POCL))))
    assert rc == 1, out
    assert (
        "FAIL pool allocate+release vs pyopencl MemoryPool: benchmark(s) "
        "test_pool_allocate_release not in the results"
    ) in out


def test_runs_are_merged_on_their_fastest_rounds(tmp_path: Path) -> None:
    # a first run disturbed by load, then a re-measurement: the figure uses the fastest rounds
    check = "capture replay vs bare enqueue loop"
    results, _ = gate.load(
        [
            _write(tmp_path / "a.json", _doc(_slowed(PAIRED[check], 1.5), POCL)),
            _write(tmp_path / "b.json", _doc(_clean(), POCL)),
        ]
    )
    (verdict,) = gate.judge(results, [c for c in gate.CHECKS if c.name == check], "pocl")
    assert verdict.ok and verdict.value == pytest.approx(_limit(check) / 1.1)


def test_a_paired_figure_is_judged_within_each_run(tmp_path: Path) -> None:
    # fastest replay of one run and fastest normal step of another would make 160/36 = 4.4, a
    # figure no run measured; each run on its own gives 4.4 and 5.05: the best run counts
    check = next(c for c in gate.CHECKS if c.name == "capture step speed-up, pyopencl.array")
    bench = "test_step_replay[pyopencl_array]"
    a = {bench: (36e-6, {"paired_floor_s": 160e-6})}
    b = {bench: (46.8e-6, {"paired_floor_s": 236.4e-6})}
    results, _ = gate.load(
        [_write(tmp_path / "a.json", _doc(a, POCL)), _write(tmp_path / "b.json", _doc(b, POCL))]
    )
    (verdict,) = gate.judge(results, [check], "pocl")
    assert verdict.value == pytest.approx(236.4 / 46.8)


def test_the_step_replay_is_judged_against_its_launches_by_hand(tmp_path: Path) -> None:
    # one run holds both floors: the normal step (the speed-up's) and the launches by hand
    check = next(
        c for c in gate.CHECKS if c.name == "capture step replay vs the same launches by hand"
    )
    run = {
        "test_step_replay[python_ops]": (20e-6, {"paired_floor_s": 46e-6, "hand_floor_s": 13e-6})
    }
    results, _ = gate.load([_write(tmp_path / "a.json", _doc(run, POCL))])
    (verdict,) = gate.judge(results, [check], "pocl")
    assert verdict.value == pytest.approx(20 / 13) and verdict.ok
    # a run saved before that floor was recorded: the check is not measured, and says why
    older = {"test_step_replay[python_ops]": (20e-6, {"paired_floor_s": 46e-6})}
    results, _ = gate.load(
        [
            _write(tmp_path / "a.json", _doc(run, POCL)),
            _write(tmp_path / "b.json", _doc(older, POCL)),
        ]
    )
    assert not check.figure.measured(results)
    (verdict,) = gate.judge(results, [check], "pocl")
    assert verdict.value is None and not verdict.ok
    assert "not measured" in verdict.line() and "hand_floor_s" in verdict.line()


def test_the_table_is_parsed_once_into_typed_limits() -> None:
    for check in gate.CHECKS:
        assert check.figure.kind in gate_table.KINDS
        for cls in gate.DEVICE_CLASSES:
            limit = check.limit(cls)
            assert limit is None or (isinstance(limit, gate.Limit) and limit.bound >= 0)
    replay = next(c for c in gate.CHECKS if c.name == "capture replay vs bare enqueue loop")
    assert str(replay.limit("pocl")) == "<= 1.1" and replay.limit("pocl").ok(1.1)  # type: ignore[union-attr]
    speedup = next(c for c in gate.CHECKS if c.name == "capture step speed-up, pyopencl.array")
    assert str(speedup.limit("pocl")) == ">= 5" and not speedup.limit("pocl").ok(4.9)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ('figure = "ratio"\nof = ["a"]', "of = a list of 2 benchmark name(s)"),
        ('figure = "speed"\nof = ["a"]', "figure one of"),
        ('figure = "info"\nof = ["a"]', "'key' for figure 'info'"),
        ('figure = "paired"\nof = ["a"]\npocl = "<= 2"', "pocl = a number >= 0 (the limit)"),
        ('figure = "paired"\nof = ["a"]\nbetter = "faster"', "better = 'lower' or 'higher'"),
        ('figure = "paired"\nof = ["a"]\nlimit = 2', "keys among"),
    ],
)
def test_a_malformed_table_entry_is_named(tmp_path: Path, entry: str, expected: str) -> None:
    table = tmp_path / "checks.toml"
    table.write_text(
        f'[[check]]\nname = "ok"\nfigure = "time_us"\nof = ["x"]\n\n'
        f'[[check]]\nname = "broken one"\n{entry}\n'
    )
    with pytest.raises(ValueError, match="check 2 \\('broken one'\\)") as exc:
        gate_table.load_checks(table)
    assert expected in str(exc.value)


def test_the_readme_limits_table_is_the_gates() -> None:
    """benchmarks/results/README.md shows the limits `gate.py --limits` prints: regenerate it
    with `python3 benchmarks/tracking/gate.py --limits --update benchmarks/results/README.md`."""
    readme = (ROOT / "benchmarks/results/README.md").read_text()
    assert gate.readme_table(readme) == gate.limits_table(gate.CHECKS)


def test_the_readme_update_rewrites_only_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# before\n{gate.BEGIN}\n| stale | table |\n{gate.END}\nafter\n")
    assert gate.main(["--limits", "--update", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# before\n") and text.endswith(f"{gate.END}\nafter\n")
    assert gate.readme_table(text) == gate.limits_table(gate.CHECKS)
    assert "updated" in capsys.readouterr().out


def _noop_pair(graph_s: float, hand_s: float) -> dict[str, tuple[float, dict[str, Any]]]:
    return {
        "test_graph_overhead_executor_run[noop]": (graph_s, {"paired_floor_s": hand_s, "nodes": 64})
    }


def test_graph_overhead_per_node_comes_from_the_noop_pair(tmp_path: Path) -> None:
    # executor and by-hand timed in the same rounds: (fastest run - fastest floor) per node
    check = next(c for c in gate.CHECKS if c.name == "graph overhead per node")
    assert check.figure.needs == ("test_graph_overhead_executor_run[noop]",)
    results, _ = gate.load([_write(tmp_path / "a.json", _doc(_noop_pair(36e-6, 4.4e-6), POCL))])
    (verdict,) = gate.judge(results, [check], "pocl")
    assert verdict.ok and verdict.value == pytest.approx((36 - 4.4) / 64)


@pytest.mark.parametrize("name", ["graph overhead per node", "scheduler overhead per op"])
def test_a_negative_figure_fails_whatever_its_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # an overhead can only be negative when its two halves were measured apart: it must fail,
    # never pass as "far under the limit"
    runs = {
        **_noop_pair(4.0e-6, 4.4e-6),
        "test_scheduler_host_callables_plan_per_op": (20e-6, {}),
        "test_hand_host_callables": (22e-6, {}),
    }
    path = _write(tmp_path / "neg.json", _doc(runs, POCL))
    rc = gate.main([str(path), "--only", name])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"FAIL {name}: -" in out and "impossible: a gated figure is never negative" in out


def test_every_gated_figure_is_checked_for_sign(tmp_path: Path) -> None:
    """Whatever the kind, a figure below zero fails: the engine checks the sign, not the table."""
    for check in gate.CHECKS:
        fake = gate_table.Figure(
            check.figure.kind, check.figure.needs, lambda _r: -0.5, check.figure.timed
        )
        bent = gate.Check(check.name, fake, check.limits)
        results = {n: [{"stats": {"min": 1.0}, "extra_info": {}}] for n in fake.needs}
        (verdict,) = gate.judge(results, [bent], "pocl")
        assert not verdict.ok, check.name


def test_record_keeps_the_final_verdicts_in_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "0001_run.json", _doc(_clean(), POCL))
    rc = gate.main(
        [
            str(path),
            "--record",
            "--out",
            str(tmp_path / "gate"),
            "--only",
            "capture replay vs bare enqueue loop",
        ]
    )
    assert rc == 0, capsys.readouterr().out
    record = json.loads(path.read_text())["netcl_gate"]
    fig = record["checks"]["capture replay vs bare enqueue loop"]
    assert record["device_class"] == "pocl" and record["remeasured"] == 0
    assert fig["ok"] and fig["limit"] == "<= 1.1"
    assert fig["value"] == pytest.approx(_limit("capture replay vs bare enqueue loop") / 1.1)
    assert json.loads(path.read_text())["benchmarks"]  # the run itself is kept


@pytest.mark.timeout(660)  # its gate run may take 600 s
def test_real_run_catches_an_injected_replay_slowdown(tmp_path: Path) -> None:
    """The capture benchmarks run for real with replay slowed 50%: the gate fails after
    re-measuring and names the check."""
    env = {**os.environ, "NETCL_BENCH_SLOWDOWN": "capture_replay=0.5"}
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/tracking/gate.py"),
            "--run",
            "--retries",
            "1",
            "--out",
            str(tmp_path),
            "--only",
            "capture replay vs bare enqueue loop",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
        check=False,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "gate: NETCL_BENCH_SLOWDOWN injected: KernelCapture.replay +50%" in res.stdout
    assert "gate: re-measuring before failing" in res.stdout
    assert res.stdout.rstrip().endswith("gate: REGRESSION in: capture replay vs bare enqueue loop")
    saved = json.loads((tmp_path / "run-0.json").read_text())
    assert saved["machine_info"]["opencl"]["device"]
    assert saved["machine_info"]["netcl_slowdown_injected"] == ["KernelCapture.replay +50%"]
