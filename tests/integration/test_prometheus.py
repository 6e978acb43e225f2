"""A real Prometheus server (Debian's package) scrapes the demo through the shipped scrape config,
and the netcl metrics are read back through Prometheus's HTTP query API."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Scraped

pytestmark = pytest.mark.slow


def test_prometheus_scrapes_netcl_metrics(scraped_demo: Scraped) -> None:
    (replays,) = scraped_demo.query("netcl_capture_replays_total")
    assert float(replays["value"][1]) >= scraped_demo.steps  # type: ignore[index]
    assert replays["metric"]["job"] == "netcl"  # type: ignore[index]
    lookups = scraped_demo.query("sum by (netcl_cache_result) (netcl_cache_lookups_total)")
    by_result = {r["metric"]["netcl_cache_result"]: float(r["value"][1]) for r in lookups}  # type: ignore[index]
    for result in ("memory", "disk", "recovered"):
        assert by_result.get(result, 0) >= 1, by_result
    (nodes,) = scraped_demo.query("netcl_graph_nodes_executed_total")
    assert float(nodes["value"][1]) > 0  # type: ignore[index]
    peaks = scraped_demo.query("netcl_pool_peak_bytes")
    assert peaks and all(float(p["value"][1]) > 0 for p in peaks)  # type: ignore[index]
    (ops,) = scraped_demo.query("sum(netcl_scheduler_ops_total)")
    assert float(ops["value"][1]) >= 3 * scraped_demo.steps  # type: ignore[index]
    (recoveries,) = scraped_demo.query("sum(netcl_cache_recoveries_total)")
    assert float(recoveries["value"][1]) == 1  # the entry the demo damages on purpose
