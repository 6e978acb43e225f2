"""The shipped dashboards against real servers: a real Prometheus scrapes the demo's steady
workload (``demo.py --soak``, device time on in summary mode, the soak's default: the kernel
panels live on its sampled per-command detail) and every query of the Grafana dashboard must
return finite, non-zero values; the console page must show a value in every cell and renders in
a real headless browser (Debian's chromium); the alerting rules pass promtool's checks and unit
tests.

``NETCL_WRITE_SCREENSHOTS=1`` also writes the browser's screenshot of the console page to
``observability/console.png`` (how the committed picture is made, with
``NETCL_DASHBOARD_SOAK_S=180`` so that its graphs have some history)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    from conftest import DemoUnderPrometheus, Scraped

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "observability"
DASHBOARD = OBS / "grafana/netcl.json"
SOAK_S = 600  # the demo's soak outlives the tests; the fixture stops it
# soak seconds before the queries (compiles, a recovery and re-captures done by then); a multiple
# of 10, the soak's report interval. Longer for a screenshot whose graphs show more history.
READY_AFTER_S = int(os.environ.get("NETCL_DASHBOARD_SOAK_S", "20"))

# Grafana's variables, as a dashboard user with the demo's job would have them.
VARIABLES = {"$__rate_interval": "1m", "$job": "netcl"}

PANELS = {  # every panel the dashboard promises, by title
    "Cache lookups by tier",
    "Cache hit ratio",
    "Compiles per second",
    "Compile time (successful builds)",
    "Cache recoveries",
    "Graph run time",
    "Graph nodes per second",
    "Replays and replayed launches",
    "Scheduler ops",
    "Scheduler runs and failures",
    "Host waits",
    "Pool bytes in use",
    "Pool peak",
    "Top kernels by device time",
    "Device busy",
    "Device time per replay",
    "Device time per graph node",
}


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _queries() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def _series(expr: str) -> set[str]:
    return set(re.findall(r"\b(netcl_[a-z0-9_]+)\{", expr))


def test_grafana_dashboard_is_importable() -> None:
    dash = _dashboard()
    assert dash["uid"] == "netcl-runtime" and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert {p["title"] for p in graphs} == PANELS
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in graphs:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        assert set(p["gridPos"]) == {"h", "w", "x", "y"}
        for t in p["targets"]:
            assert 'job=~"$job"' in t["expr"] and _series(t["expr"]), t["expr"]


def test_alerting_rules(tmp_path: Path, service_binary: Callable[[str, str], str]) -> None:
    promtool = service_binary("promtool", "apt-get install -y prometheus")
    check = subprocess.run(
        [promtool, "check", "rules", str(OBS / "alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and "SUCCESS: 3 rules found" in check.stdout, check
    text = (OBS / "alerts.yml").read_text()

    def expected(alert: str, summary: str, **labels: str) -> dict[str, Any]:
        block = text.split(f"- alert: {alert}\n")[1].split("- alert:")[0]
        (description,) = re.findall(r'^\s+description: (".*")$', block, re.M)
        return {
            "exp_labels": {"severity": "warning", "job": "netcl", **labels},
            "exp_annotations": {"summary": summary, "description": json.loads(description)},
        }

    series = "netcl_cache_compile_duration_seconds_count{job='netcl',instance='%s'}"
    tests = {
        "rule_files": [str(OBS / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series % "storm", "values": "0+60x30"},  # 1 compile/s for 30 min
                    {"series": series % "warm", "values": "0+1x30"},  # 1 compile/min: no storm
                    {
                        "series": "netcl_cache_recoveries_total{job='netcl',instance='disk',"
                        "netcl_cache_reason='truncated'}",
                        "values": "0 0 2 4 6 6 6",
                    },
                    {
                        "series": "netcl_scheduler_runs_total{job='netcl',instance='s',"
                        "netcl_scheduler_result='error'}",
                        "values": "0 0 1 1 1 1 1 1 1 1",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "NetclCompileStorm", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "NetclCompileStorm",
                        "exp_alerts": [
                            expected(
                                "NetclCompileStorm",
                                "netcl compiles 1 programs/s on storm",
                                instance="storm",
                            )
                        ],
                    },
                    {
                        "eval_time": "4m",
                        "alertname": "NetclCacheRecoverySpike",
                        "exp_alerts": [
                            expected(
                                "NetclCacheRecoverySpike",
                                "6 damaged netcl cache entries recovered on disk in 15 minutes",
                                instance="disk",
                            )
                        ],
                    },
                    {
                        "eval_time": "3m",
                        "alertname": "NetclSchedulerFailures",
                        "exp_alerts": [
                            expected(
                                "NetclSchedulerFailures",
                                "netcl Scheduler.run failed 1 times in 5 minutes on s",
                                instance="s",
                            )
                        ],
                    },
                    {"eval_time": "9m", "alertname": "NetclSchedulerFailures", "exp_alerts": []},
                ],
            }
        ],
    }
    (tmp_path / "alerts_test.yml").write_text(json.dumps(tests))  # JSON is YAML
    run = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "alerts_test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.fixture(scope="module")
def soaking_demo(
    tmp_path_factory: pytest.TempPathFactory, demo_under_prometheus: DemoUnderPrometheus
) -> Iterator[Scraped]:
    """The demo's steady workload (``--soak``, device time recorded) serving metrics, and
    Prometheus scraping it every second with the shipped config, rules and console templates,
    once the soak has run READY_AFTER_S seconds."""
    tmp = tmp_path_factory.mktemp("soak")
    args = ["--steps", "5", "--soak", str(SOAK_S)]
    with demo_under_prometheus(tmp, args) as (scraped, demo, demo_err):
        deadline = time.monotonic() + 300
        while f"soak: {READY_AFTER_S} s," not in demo_err.read_text():
            assert demo.poll() is None, demo_err.read_text()[-3000:]
            assert time.monotonic() < deadline, "the demo's soak did not get going in 300 s"
            time.sleep(1)
        time.sleep(3)  # a few scrapes of the latest values
        yield scraped
        assert demo.poll() is None, demo_err.read_text()[-3000:]  # still soaking at the end


# Series that are rightly zero on the demo's workload, and why.
IDLE = {("netcl_cache_result", "remote"): "the demo has no remote cache tier"}


def _values(result: list[dict[str, Any]]) -> list[float]:
    """The values of a query's series, without the series IDLE names."""
    return [
        float(r["value"][1]) for r in result if not any(r["metric"].get(k) == v for k, v in IDLE)
    ]


@pytest.mark.slow
def test_every_dashboard_query_has_live_values(soaking_demo: Scraped) -> None:
    """Every query of every panel returns at least one series, and every series is a finite,
    non-zero number (but those IDLE names): a panel reading 0 or NaN on the live workload
    fails."""
    exposition = soaking_demo.get(soaking_demo.metrics_port, "/metrics")
    emitted = {
        ln.split("{")[0].split()[0]
        for ln in exposition.splitlines()
        if ln and not ln.startswith("#")
    }
    dead = []
    queries = _queries()
    for expr in queries:
        missing = _series(expr) - emitted
        assert not missing, f"{expr}: the demo emits no series {sorted(missing)}"
        promql = expr
        for var, value in VARIABLES.items():
            promql = promql.replace(var, value)
        values = _values(soaking_demo.query(promql))
        if not values or not all(math.isfinite(v) and v != 0 for v in values):
            dead.append(f"{promql} -> {values}")
    assert not dead, "queries without live values:\n" + "\n".join(dead)
    assert len(queries) >= 22, queries
    print(f"{len(queries)} queries returned finite, non-zero values")


def _png_pixels(data: bytes) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Decode an 8-bit RGB(A) PNG (what chromium writes) into a height x width x channels array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = bpp = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    out = np.zeros((height, stride), np.int32)
    prev = np.zeros(stride, np.int32)
    for y in range(height):  # undo the per-row filters (PNG spec, section 9)
        start = y * (stride + 1)
        kind = raw[start]
        cur = np.frombuffer(raw, np.uint8, stride, start + 1).astype(np.int32)
        if kind == 1:  # Sub: running sum per channel
            cur = np.cumsum(cur.reshape(width, bpp), axis=0).reshape(-1) & 255
        elif kind == 2:  # Up
            cur = (cur + prev) & 255
        elif kind in (3, 4):  # Average, Paeth: sequential along the row
            line = [int(v) for v in cur]
            up = [int(v) for v in prev]
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                if kind == 3:
                    line[i] = (line[i] + ((a + up[i]) >> 1)) & 255
                else:
                    b, c = up[i], (up[i - bpp] if i >= bpp else 0)
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                    line[i] = (line[i] + pred) & 255
            cur = np.array(line, np.int32)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp).astype(np.uint8)


@pytest.mark.slow
def test_console_page_renders_in_a_browser(
    soaking_demo: Scraped, service_binary: Callable[[str, str], str], tmp_path: Path
) -> None:
    chromium = service_binary("chromium", "apt-get install -y chromium")
    page = soaking_demo.get(soaking_demo.prom_port, "/consoles/netcl.html")
    assert "<h1>netcl runtime" in page
    # server-side values: every cell has one ("-" is a query without data)
    cells = re.findall(r'<td class="netcl-v">(.*?)</td>', page, re.S)
    assert len(cells) >= 15, page
    shown = [re.sub(r"<[^>]+>", "", c).split() for c in cells]
    assert all(v and "-" not in v for v in shown), shown
    assert "reported yet" not in page, page
    assert re.search(r">\d[\d.]*(e[+-]?\d+)? /s</a>", page), page
    assert re.search(r">\d[\d.]*[kM]?iB</td>", page), page
    shot = tmp_path / "console.png"
    run = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1280,2200",
            "--virtual-time-budget=8000",
            "--hide-scrollbars",
            f"http://127.0.0.1:{soaking_demo.prom_port}/consoles/netcl.html",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0 and shot.exists(), run.stderr[-3000:]
    pixels = _png_pixels(shot.read_bytes())
    assert pixels.shape[:2] == (2200, 1280)
    rgb = pixels[:, :, :3].reshape(-1, 3)
    colours = len(np.unique(rgb, axis=0))
    inked = float((rgb.min(axis=1) < 200).mean())  # share of clearly non-white pixels
    assert colours >= 50 and inked >= 0.005, (colours, inked)  # a blank page: 1 and 0.0
    if os.environ.get("NETCL_WRITE_SCREENSHOTS") == "1":
        shutil.copy(shot, OBS / "console.png")
