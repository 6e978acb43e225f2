"""A real Prometheus (Debian's package) scraping the demo through the shipped configuration: the
scrape config, the alerting rules and the console templates of ``observability/``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "observability"
STEPS = 30


@dataclass
class Scraped:
    """Ports of the demo's metrics endpoint and of the Prometheus scraping it."""

    metrics_port: int
    prom_port: int
    steps: int = STEPS  # replayed steps of the demo's run

    def query(self, promql: str) -> list[dict[str, object]]:
        """The result vector of an instant query (asserts the query is valid)."""
        url = f"http://127.0.0.1:{self.prom_port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def get(self, port: int, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return str(resp.read().decode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.contextmanager
def _demo_under_prometheus(
    binary: str, tmp: Path, demo_args: list[str]
) -> Iterator[tuple[Scraped, subprocess.Popen[bytes], Path]]:
    """The demo (run with ``demo_args``, serving metrics) and Prometheus scraping it every second
    with the shipped config, rules and console templates; yields the ports, the demo's process
    and the file its stderr goes to. Both processes are stopped on exit."""
    scraped = Scraped(_free_port(), _free_port())
    config = (OBS / "prometheus.yml").read_text()
    assert "127.0.0.1:9464" in config and "scrape_interval: 5s" in config
    config = config.replace("127.0.0.1:9464", f"127.0.0.1:{scraped.metrics_port}")
    config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")
    (tmp / "prometheus.yml").write_text(config)
    shutil.copy(OBS / "alerts.yml", tmp / "alerts.yml")
    demo_err = tmp / "demo.stderr"
    with demo_err.open("w") as err:
        demo = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "demo/demo.py"),
                *demo_args,
                "--prometheus-port",
                str(scraped.metrics_port),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "NETCL_CACHE_DIR": str(tmp / "cache")},
        )
    prom = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{scraped.prom_port}",
            f"--web.console.templates={OBS / 'consoles'}",
            f"--web.console.libraries={OBS / 'console_libraries'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield scraped, demo, demo_err
    finally:
        _stop(prom)
        _stop(demo)


DemoUnderPrometheus = Callable[
    [Path, list[str]],
    contextlib.AbstractContextManager[tuple[Scraped, "subprocess.Popen[bytes]", Path]],
]


@pytest.fixture(scope="session")
def demo_under_prometheus(service_binary: Callable[[str, str], str]) -> DemoUnderPrometheus:
    """``demo_under_prometheus(tmp, demo_args)``: a context manager starting the demo and a real
    Prometheus scraping it (skipped, or failed under CI=true, without the prometheus binary)."""

    def start(
        tmp: Path, demo_args: list[str]
    ) -> contextlib.AbstractContextManager[tuple[Scraped, subprocess.Popen[bytes], Path]]:
        binary = service_binary("prometheus", "apt-get install -y prometheus")
        return _demo_under_prometheus(binary, tmp, demo_args)

    return start


@pytest.fixture(scope="session")
def scraped_demo(
    tmp_path_factory: pytest.TempPathFactory, demo_under_prometheus: DemoUnderPrometheus
) -> Iterator[Scraped]:
    """The demo serving metrics (done with its run, lingering) and Prometheus scraping it every
    second with the shipped rules and console templates, after at least three scrapes."""
    tmp = tmp_path_factory.mktemp("prometheus")
    args = ["--steps", str(STEPS), "--linger", "300"]
    with demo_under_prometheus(tmp, args) as (scraped, demo, demo_err):
        deadline = time.monotonic() + 300
        while "serving metrics" not in demo_err.read_text():
            assert demo.poll() is None, demo_err.read_text()[-3000:]
            assert time.monotonic() < deadline, "the demo did not finish in 300 s"
            time.sleep(1)
        scrapes: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            try:
                # samples of the finished run's last value: at least three scrapes after it
                scrapes = scraped.query(
                    f"count_over_time((netcl_capture_replays_total >= {STEPS})[1m:1s])"
                )
            except OSError:  # Prometheus still starting
                scrapes = []
            if scrapes and float(scrapes[0]["value"][1]) >= 3:  # type: ignore[index]
                break
            time.sleep(1)
        assert scrapes, "Prometheus never scraped the demo's final values"
        yield scraped
