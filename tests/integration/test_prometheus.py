"""Dashboards: a real Prometheus server (Debian's package) scrapes the demo through the shipped
scrape config, and the netcl metrics are read back through Prometheus's HTTP query API."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(port: int, promql: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def scraped_demo(tmp_path: Path, service_binary: Callable[[str, str], str]) -> Iterator[int]:
    """Start the demo serving metrics and Prometheus scraping it; yield Prometheus's port."""
    binary = service_binary("prometheus", "apt-get install prometheus")
    metrics_port, prom_port = _free_port(), _free_port()
    config = (ROOT / "observability/prometheus.yml").read_text()
    assert "127.0.0.1:9464" in config
    config = config.replace("127.0.0.1:9464", f"127.0.0.1:{metrics_port}")
    config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")
    (tmp_path / "prometheus.yml").write_text(config)
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "demo/demo.py"), "--steps", str(STEPS), "--no-console",
         "--prometheus-port", str(metrics_port), "--linger", "60"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    prom = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield prom_port
    finally:
        _stop(prom)
        _stop(demo)


def test_prometheus_scrapes_netcl_metrics(scraped_demo: int) -> None:
    deadline = time.monotonic() + 90
    replays: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            replays = _query(scraped_demo, "netcl_capture_replays_total")
        except OSError:  # Prometheus still starting
            replays = []
        if replays and float(replays[0]["value"][1]) >= STEPS:  # type: ignore[index]
            break
        time.sleep(1)
    assert replays, "Prometheus never scraped netcl_capture_replays_total from the demo"
    assert float(replays[0]["value"][1]) >= STEPS  # type: ignore[index]
    assert replays[0]["metric"]["job"] == "netcl"  # type: ignore[index]

    lookups = _query(scraped_demo, "sum by (netcl_cache_result) (netcl_cache_lookups_total)")
    by_result = {r["metric"]["netcl_cache_result"]: float(r["value"][1]) for r in lookups}  # type: ignore[index]
    assert by_result.get("memory", 0) >= 1 and by_result.get("disk", 0) >= 1, by_result
    (nodes,) = _query(scraped_demo, "netcl_graph_nodes_executed_total")
    assert float(nodes["value"][1]) > 0  # type: ignore[index]
    (peak,) = _query(scraped_demo, "netcl_pool_peak_bytes")
    assert float(peak["value"][1]) > 0  # type: ignore[index]
    (ops,) = _query(scraped_demo, "sum(netcl_scheduler_ops_total)")
    assert float(ops["value"][1]) >= 3 * STEPS  # type: ignore[index]
