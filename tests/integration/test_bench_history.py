"""The benchmark history (benchmarks/tracking/history.py): change detection that knows the
noise, where a change began, ``compare`` and its JSON, the report, and histograms.

Most tests build saved runs by hand (pytest-benchmark's JSON layout); the last one runs a few
real benchmarks three times clean and once with capture replay slowed, and checks that only the
slowed benchmark is flagged and that the report names the run where it began."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "tracking"))
import gate  # noqa: E402
import history  # noqa: E402
import history_report  # noqa: E402
import history_stats as hs  # noqa: E402

POCL = {
    "platform": "Portable Computing Language",
    "vendor": "GenuineIntel",
    "device": "cpu-haswell-Intel(R) Xeon(R) CPU",
}
BASE = {
    "test_launch_replay": 110e-6,
    "test_pool_allocate_release": 80e-6,
    "test_netcl_miss": 2.0,
    "test_tracing_check": 62e-9,
}
# run-to-run jitter of each clean run (a few %), as on a quiet machine
JITTER = [1.00, 1.03, 0.98, 1.02, 0.99, 1.01]


def _bench(name: str, t: float, spread: float = 1.01) -> dict[str, Any]:
    return {
        "name": name,
        "group": "g",
        "fullname": f"b.py::{name}",
        "extra_info": {},
        "stats": {
            "min": t,
            "median": t * spread,
            "q3": t * spread * 1.01,
            "rounds": 100,
            "iterations": 1,
        },
    }


def _run(
    store: Path,
    n: int,
    factors: dict[str, float],
    *,
    injected: bool = False,
    gate_record: dict[str, Any] | None = None,
) -> Path:
    machine: dict[str, Any] = {"node": "ci-host", "opencl": POCL}
    if injected:
        machine["netcl_slowdown_injected"] = ["KernelCapture.replay +50%"]
    doc: dict[str, Any] = {
        "machine_info": machine,
        "commit_info": {"id": f"{n:x}" * 40, "dirty": False},
        "datetime": f"2026-12-01T10:{n:02d}:00",
        "benchmarks": [
            _bench(name, t * factors.get(name, JITTER[n % len(JITTER)])) for name, t in BASE.items()
        ],
    }
    if gate_record:
        doc["netcl_gate"] = gate_record
    path = store / f"{n:04d}_{'c' * 8}_20261201_10{n:02d}00.json"
    path.write_text(json.dumps(doc))
    return path


def _storage(tmp_path: Path, clean: int = 4, injected: bool = True) -> Path:
    store = tmp_path / "store" / "Linux-CPython-3.11-64bit"
    store.mkdir(parents=True)
    for n in range(1, clean + 1):
        _run(store, n, {})
    if injected:
        record = {
            "device_class": "pocl",
            "remeasured": 1,
            "checks": {
                "capture replay vs bare enqueue loop": {
                    "value": 1.62,
                    "first": 1.48,
                    "ok": False,
                    "limit": "<= 1.1",
                    "unit": "",
                }
            },
        }
        _run(store, clean + 1, {"test_launch_replay": 1.5}, injected=True, gate_record=record)
    return tmp_path / "store"


def _compare_json(capsys: pytest.CaptureFixture[str], store: Path, *ids: str) -> dict[str, Any]:
    assert history.main(["compare", *ids, "--json", "--storage", str(store)]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _names(doc: dict[str, Any], key: str) -> list[str]:
    return [c["name"] for c in doc[key]]


def test_only_a_change_outside_the_noise_is_a_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _storage(tmp_path)
    doc = _compare_json(capsys, store, "0004", "0005")
    assert _names(doc, "regressions") == ["test_launch_replay"]
    assert doc["improvements"] == [] and doc["history_too_short"] == []
    assert sorted(_names(doc, "unchanged")) == sorted(set(BASE) - {"test_launch_replay"})
    (reg,) = doc["regressions"]
    assert reg["ratio"] == pytest.approx(1.5 / JITTER[4], rel=1e-3)
    low, high = reg["noise_band"]
    assert low < 1 < high < reg["ratio"]
    assert reg["began"]["id"] == "0005" and reg["began"]["date"] == "2026-12-01 10:05"
    assert doc["new"]["injected"] == ["KernelCapture.replay +50%"]
    assert doc["history"]["runs"] == ["0001", "0002", "0003", "0004"]


def test_clean_pairs_flag_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _storage(tmp_path, clean=5, injected=False)
    for pair in (("0002", "0003"), ("0003", "0004"), ("0004", "0005"), ("0002", "0005")):
        doc = _compare_json(capsys, store, *pair)
        assert doc["regressions"] == [] and doc["improvements"] == [], pair
        assert len(doc["unchanged"]) == len(BASE), pair


def test_a_noisy_benchmark_needs_a_bigger_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the same +30% is a regression for a quiet benchmark and noise for one whose rounds spread
    # widely (median 1.6x the fastest round): the run's own rounds widen its band
    store = _storage(tmp_path, clean=4, injected=False)
    path = _run(
        store / "Linux-CPython-3.11-64bit",
        5,
        {"test_pool_allocate_release": 1.3, "test_tracing_check": 1.3},
    )
    doc = json.loads(path.read_text())
    for b in doc["benchmarks"]:
        if b["name"] == "test_tracing_check":
            b["stats"]["median"] = b["stats"]["min"] * 1.6
    path.write_text(json.dumps(doc))
    doc = _compare_json(capsys, store, "0005")
    assert _names(doc, "regressions") == ["test_pool_allocate_release"]
    assert "test_tracing_check" in _names(doc, "unchanged")


def test_a_short_history_is_said_not_guessed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _storage(tmp_path, clean=1, injected=True)  # one clean run, then the slowed one
    doc = _compare_json(capsys, store, "0001", "0002")
    assert doc["regressions"] == doc["improvements"] == doc["unchanged"] == []
    assert sorted(_names(doc, "history_too_short")) == sorted(BASE)
    assert all(c["noise_band"] is None for c in doc["history_too_short"])
    assert history.main(["compare", "0001", "0002", "--storage", str(store)]) == 0
    out = capsys.readouterr().out
    assert "history too short to know the noise: 4" in out
    change = f"{1.5 / JITTER[1] - 1:+.1%}"
    assert re.search(rf"test_launch_replay .* \{change} \?", out), out


def test_compare_one_id_is_against_the_run_before_it_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _storage(tmp_path)
    doc = _compare_json(capsys, store, "0005")
    assert doc["old"]["id"] == "0004" and doc["new"]["id"] == "0005"
    assert doc["note"] == (
        "one run given: comparing 0005 with the run before it on the same machine, 0004"
    )
    assert history.main(["compare", "0005", "--storage", str(store)]) == 0
    out = capsys.readouterr().out
    assert "compare: one run given: comparing 0005 with the run before it" in out
    assert "REGRESSIONS: 1\n  test_launch_replay" in out
    assert "began at 0005" in out and "[injected: KernelCapture.replay +50%]" in out


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (["0002", "0002"], "a run cannot be compared with itself"),
        (["0001"], "0001 is the first saved run of ci-host"),
        (["0001", "0009"], "no saved run '0009'"),
    ],
)
def test_compare_refuses_what_it_cannot_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ids: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        history.main(["compare", *ids, "--storage", str(_storage(tmp_path))])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_compare_table_fits_120_columns_and_shows_the_gates_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert history.main(["compare", "0004", "0005", "--storage", str(_storage(tmp_path))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 120
    row = next(line for line in lines if line.startswith("test_launch_replay "))
    assert "108.900 µs" in row and "165.000 µs" in row and "+51.5% REGRESSION" in row, row
    row = next(line for line in lines if line.startswith("test_netcl_miss "))
    assert "1.980 s" in row and "2.020 s" in row and row.rstrip().endswith("%"), row  # unchanged
    row = next(line for line in lines if line.startswith("capture replay vs bare enqueue"))
    assert row.split()[-1] == "1.620!"  # the gate's final (re-measured) figure, failed


def test_a_paired_benchmark_is_judged_against_its_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the machine ran 1.6x slower during run 0005: a paired benchmark's floor moved with it, so
    # its ratio did not (unchanged, though its fastest round is 1.6x); in run 0006 only the
    # benchmark itself slowed, its floor did not: a regression, though within 1.5x of 0005
    store = _storage(tmp_path, clean=4, injected=False)
    folder = store / "Linux-CPython-3.11-64bit"
    floors = {n: 50e-6 * JITTER[n % len(JITTER)] for n in range(1, 7)}
    for n in range(1, 5):
        _pair_floor(folder, n, floors[n])
    _run(folder, 5, {"test_launch_replay": 1.6 * JITTER[5]})
    _pair_floor(folder, 5, 1.6 * floors[5])
    _run(folder, 6, {"test_launch_replay": 1.5 * JITTER[0]})
    _pair_floor(folder, 6, floors[6])
    doc = _compare_json(capsys, store, "0005")
    (change,) = [c for c in doc["unchanged"] if c["name"] == "test_launch_replay"]
    assert change["against_paired_floor"] and change["ratio"] == pytest.approx(1.0, abs=0.05)
    assert doc["history"]["paired_spread"] is not None
    doc = _compare_json(capsys, store, "0006")
    assert _names(doc, "regressions") == ["test_launch_replay"]
    (reg,) = doc["regressions"]
    assert reg["noise"]["rounds"] == 0.0  # the floor saw the rounds' load
    assert reg["began"]["id"] == "0006"


def _pair_floor(folder: Path, n: int, floor: float, median: float | None = None) -> None:
    """Give run ``n``'s test_launch_replay a paired floor of ``floor`` seconds (and a median
    per-round ratio to it)."""
    (path,) = folder.glob(f"{n:04d}_*.json")
    doc = json.loads(path.read_text())
    for b in doc["benchmarks"]:
        if b["name"] == "test_launch_replay":
            b["extra_info"]["paired_floor_s"] = floor
            if median is not None:
                b["extra_info"]["paired_ratio_median"] = median
    path.write_text(json.dumps(doc))


def test_a_paired_benchmark_is_judged_by_its_median_round_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the fastest rounds of replay and floor fell in different machine states in run 0003
    # (their ratio 1.3), while the median of the per-round ratios stayed at 1.0: no alarm, and
    # the history stays tight enough to see run 0005's x1.5 of the per-round ratio
    store = _storage(tmp_path, clean=4, injected=False)
    folder = store / "Linux-CPython-3.11-64bit"
    medians = [1.0, 1.01, 0.99, 1.005]
    for n in range(1, 5):
        floor = BASE["test_launch_replay"] * JITTER[n % len(JITTER)]
        _pair_floor(folder, n, floor / (1.3 if n == 3 else 1.0), medians[n - 1])
    _run(folder, 5, {})
    _pair_floor(folder, 5, BASE["test_launch_replay"] * JITTER[5], 1.5)
    doc = _compare_json(capsys, store, "0003")
    assert doc["history_too_short"][0]["name"] == "test_launch_replay"  # own spread: 3 runs
    doc = _compare_json(capsys, store, "0004")
    assert "test_launch_replay" in _names(doc, "unchanged")
    doc = _compare_json(capsys, store, "0005")
    assert _names(doc, "regressions") == ["test_launch_replay"]
    assert doc["regressions"][0]["ratio"] == pytest.approx(1.5 / 1.005, rel=1e-3)


def test_record_floor_stores_the_median_round_ratio(tmp_path: Path) -> None:
    """benchmarks/paired.py in a real pytest-benchmark run: the floor's fastest round and the
    median of each round over the floor timed right before it."""
    (tmp_path / "bench_pair.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "from paired import paired_floor, record_floor\n"
        "def test_pair(benchmark):\n"
        "    setup, floor = paired_floor(lambda: sum(range(20000)))\n"
        "    benchmark.pedantic(lambda: sum(range(60000)), setup=setup, rounds=60,\n"
        "                       warmup_rounds=3)\n"
        "    assert len(floor) == 63\n"
        "    record_floor(benchmark, floor)\n"
    )
    out = tmp_path / "out.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tmp_path / "bench_pair.py"),
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--benchmark-only",
            f"--benchmark-json={out}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (bench,) = json.loads(out.read_text())["benchmarks"]
    info = bench["extra_info"]
    assert 0 < info["paired_floor_s"] < bench["stats"]["min"]
    assert 2.0 < info["paired_ratio_median"] < 4.5  # three times the work


def test_where_a_step_began() -> None:
    flat = [1.0, 1.02, 0.99, 1.01, 1.0]
    assert hs.step_start(flat, math.log(1.2)) is None
    assert hs.step_start([*flat, 1.5], math.log(1.2)) == 5
    assert hs.step_start([1.0, 1.01, 1.5, 1.52, 1.49, 1.51], math.log(1.2)) == 2
    assert hs.step_start([1.0, None, 0.99, 1.5, None, 1.51], math.log(1.2)) == 3


def test_the_noise_band_grows_with_the_spread_and_shrinks_with_the_history() -> None:
    n = 40  # benchmarks compared
    assert hs.noise([1.0], 0.05, 0.0, 0.0, n).band is None  # one earlier run: unknown
    quiet = hs.noise([1.0, 1.01, 0.99, 1.0], 0.05, 0.0, 0.0, n).band
    noisy = hs.noise([1.0, 1.4, 0.8, 1.2], 0.05, 0.0, 0.0, n).band
    rounds = hs.noise([1.0, 1.01, 0.99, 1.0], 0.05, 0.5, 0.5, n).band
    assert quiet is not None and noisy is not None and rounds is not None
    assert hs.FLOOR <= quiet < noisy and quiet < rounds
    long_quiet = hs.noise([1.0, 1.01, 0.99, 1.0] * 5, 0.05, 0.0, 0.0, n).band
    assert long_quiet is not None and long_quiet < quiet  # its own spread outweighs the prior
    # a spread estimated from few runs is uncertain: the quantile is Student's, wider than the
    # normal's, and tends to it as the history grows
    assert hs.z_quantile(n, 3) > hs.z_quantile(n, 20) > hs.z_quantile(n) > 3


def test_report_summary_first_with_noise_units_and_injected_runs(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert history.main(["report", "--storage", str(_storage(tmp_path)), "--out", str(out)]) == 0
    page = out.read_text()
    assert len(page) < 100_000  # opens at once: inline SVG, no images
    summary = page.index("<h3>Summary: 0005")
    assert summary < page.index("<svg")  # the summary comes first
    regressions = page[page.index("Regressions: 1") : page.index("Improvements: 0")]
    assert "test_launch_replay" in regressions and "0005 " in regressions
    assert "2026-12-01 10:05" in regressions  # the run where it began, with its date
    assert re.search(r"<td>1\.515<td>0\.\d\d-1\.\d\d<td>0005", regressions), regressions
    # the gate's re-measured figure, with the first measurement beside it
    row = page[page.index("<td>capture replay vs bare enqueue loop") :][:400]
    assert "1.620" in row and "1.480" in row and "FAIL" in row
    # one plot per benchmark, in its own unit, y from zero, the noise band, injected run marked
    assert page.count("<svg") == len(gate.CHECKS) + len(BASE)
    assert "<title>test_netcl_miss</title>" in page and "test_netcl_miss (s)" in page
    assert "test_tracing_check (ns)" in page and "test_launch_replay (µs)" in page
    assert page.count('class="band"') == len(BASE)
    assert "(slowdown injected)" in page and ">0005*<" in page
    plot = page[page.index("<title>test_launch_replay</title>") :]
    plot = plot[: plot.index("</svg>")]
    assert re.search(r'class="y">0<', plot), plot


def test_report_axes_start_at_zero_with_round_ticks() -> None:
    for high in (0.9, 3.1, 47.0, 1234.0, 0.031):
        top, ticks = history_report.nice_ticks(high)
        assert ticks[0] == 0 and ticks[-1] == pytest.approx(top) and top >= high
        assert 3 <= len(ticks) <= 5
    assert history_report.unit_for([2.0, 2.5]) == ("s", 1.0)
    assert history_report.unit_for([62e-9]) == ("ns", 1e-9)


def test_benchmark_histogram_works(tmp_path: Path) -> None:
    """``--benchmark-histogram`` needs pygal and pygaljs, which the bench env installs."""
    pytest.importorskip("pygal", reason="pygal is not installed: the bench env has it")
    (tmp_path / "bench_tiny.py").write_text(
        "def test_tiny(benchmark):\n    benchmark(sum, range(10))\n"
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tmp_path / "bench_tiny.py"),
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--benchmark-only",
            f"--benchmark-histogram={tmp_path / 'hist'}",
            "--benchmark-max-time=0.01",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    svg = tmp_path / "hist.svg"
    assert svg.exists() and "<svg" in svg.read_text()


RESULTS = ROOT / "benchmarks" / "results"


def _saved_results() -> dict[Path, dict[str, Any]]:
    """The pytest-benchmark runs kept in benchmarks/results, by path."""
    docs = {p: json.loads(p.read_text()) for p in sorted(RESULTS.rglob("*.json"))}
    return {p: doc for p, doc in docs.items() if "benchmarks" in doc}


def test_saved_results_stay_small_and_hold_no_rounds() -> None:
    # what every clone downloads: each run's summary statistics, never its per-round timings
    # (an artefact of the run, under .benchmarks/); on disk as du counts it (4 KiB blocks)
    runs = _saved_results()
    assert len(runs) >= 8, "the saved runs are not where this test looks"
    with_rounds = sorted(
        {p.name for p, doc in runs.items() for b in doc["benchmarks"] if "data" in b["stats"]}
    )
    assert not with_rounds, f"per-round timings committed in {with_rounds}"
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    size = sum(-(-p.stat().st_size // 4096) * 4096 for p in files)
    assert size <= 1 << 20, (
        f"benchmarks/results holds {size >> 10} KiB, over 1 MiB: keep a gate run's verdict lines "
        "(without the notes benchmarks/tracking/gate_checks.toml holds), not its benchmark tables"
    )


def test_saved_results_are_what_the_gate_and_the_history_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # every check whose benchmarks a run holds gets its figure (the 2026-11-29 runs predate
    # the device record and the figures' extra_info)
    judged = []
    for path in _saved_results():
        results, machine = gate.load([path])
        if (device := gate.device_class(machine)) is None:
            continue
        # a run saved before a figure's floor was recorded does not hold it: not measured (a
        # benchmark that stopped recording one fails the live gate so, in .ci/run)
        held = [
            v for v in gate.judge(results, gate.CHECKS, device) if v.check.figure.measured(results)
        ]
        assert held and all(v.value is not None for v in held), [v.line() for v in held]
        judged.append(path)
    assert len(judged) >= 8
    evidence = RESULTS / "2026-12-01-pocl-history-evidence"
    cmp = _compare_json(capsys, evidence, "0004")
    assert "test_launch_replay" in _names(cmp, "regressions")
    assert {c["began"]["id"] for c in cmp["regressions"]} == {"0004"}
    assert len(cmp["unchanged"]) + len(cmp["regressions"]) == 44


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_runs_flag_only_the_injected_replay_slowdown(tmp_path: Path) -> None:
    """Three clean runs of a few real benchmarks (fewer rounds) and one with capture replay
    slowed 50%, another process keeping a core busy (benchmarks/tracking/history_evidence.py): clean
    pairs flag nothing, the slowed run flags the replay benchmark (and at most one other) and
    names itself as where it began; the report's summary says so too.

    The benchmarks are paired ones (each times its floor in the same windows as its rounds):
    in a run this short, a lone fastest round on a shared 2-core machine can sit wholly in one
    of the machine's slow spells (1.5-2x, seconds long), which no noise band learnt from three
    runs can tell from a regression; the full evidence (``bench:history-evidence``) runs all."""
    store = tmp_path / "store"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/tracking/history_evidence.py"),
            "--storage",
            str(store),
            "--no-gate",
            "--",
            "-k",
            "test_launch_replay or test_pool_allocate_release",
            "--benchmark-max-time=0.2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=840,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "evidence: held" in res.stdout
    assert re.search(
        r"0003 -> 0004: regressions test_launch_replay x[\d.]+ \(noise [\d.-]+, "
        r"began at 0004\)",
        res.stdout,
    ), res.stdout
    page = (store / "report.html").read_text()
    regressions = page.split("Regressions: ", 1)[1].split("Improvements", 1)[0]
    assert re.search(r"<td>test_launch_replay<td>[\d.]+<td>[\d.-]+<td>0004 ", regressions)
