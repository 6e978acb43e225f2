"""Device time of graph nodes on a profiling queue (real kernels on the default device): one
device time per node, under the node's span, in ``netcl.graph.node.device_duration`` by node
name; nothing watched on a plain queue."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core import profiling
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor

from .conftest import Kernels

_PROFILING = cl.command_queue_properties.PROFILING_ENABLE
_OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
N = 1 << 14


def _chain(k: Kernels, x: Tensor, y: Tensor) -> Graph:
    g = Graph()
    s = g.add_op("sum", k.add, [x, y], shape=(N,), dtype="float32")
    r = g.add_op("relu", k.relu, [s], shape=(N,), dtype="float32")
    g.add_op("sum2", k.add, [r, x], shape=(N,), dtype="float32")
    return g


def _run(queue: cl.CommandQueue) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    k = Kernels(queue.context)
    a = np.linspace(-1, 1, N, dtype=np.float32)
    b = np.linspace(1, -2, N, dtype=np.float32)
    x, y = Tensor.from_numpy(a, queue), Tensor.from_numpy(b, queue)
    pool = BufferPool(queue)
    out = GraphExecutor(pool).run(_chain(k, x, y))
    got = out.to_numpy()
    pool.release(out)
    return got, np.maximum(a + b, 0) + a


def _node_points(metric_points: Callable[[str], list[Any]]) -> dict[str, int]:
    return {
        p.attributes["netcl.node.name"]: p.count
        for p in metric_points("netcl.graph.node.device_duration")
        if p.attributes.get("netcl.node.name") in {"sum", "relu", "sum2"}
    }


@pytest.mark.parametrize("props", [_PROFILING, _PROFILING | _OOO], ids=["in_order", "ooo"])
def test_a_profiled_run_records_one_device_time_per_node(
    ctx: cl.Context,
    props: int,
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    try:
        queue = cl.CommandQueue(ctx, properties=props)
    except cl.Error:
        pytest.skip("the device has no out-of-order queues")
    before = _node_points(metric_points)
    watched = profiling.collector().stats().watched
    got, want = _run(queue)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert profiling.flush(10.0) == 0
    assert profiling.collector().stats().watched - watched == 3
    after = _node_points(metric_points)
    assert {n: after[n] - before.get(n, 0) for n in after} == {"sum": 1, "relu": 1, "sum2": 1}
    finished = spans.get_finished_spans()
    nodes = {s.context.span_id: s for s in finished if s.name == "netcl.graph.node"}
    device = [s for s in finished if s.name == "netcl.device.node"]
    assert sorted(s.attributes["netcl.node.name"] for s in device) == ["relu", "sum", "sum2"]
    for d in device:
        assert d.parent is not None and d.parent.span_id in nodes
        host = nodes[d.parent.span_id]
        assert host.attributes["netcl.node.name"] == d.attributes["netcl.node.name"]
        assert d.attributes["netcl.device.duration"] > 0
        assert d.end_time >= d.start_time


def test_a_plain_queue_watches_nothing(queue: cl.CommandQueue) -> None:
    assert not profiling.enabled(queue)
    watched = profiling.collector().stats().watched
    got, want = _run(queue)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert profiling.collector().stats().watched == watched


def test_a_plain_queue_in_summary_mode_stamps_each_node_on_a_side_queue(
    ctx: cl.Context, spans: InMemorySpanExporter
) -> None:
    collector = profiling.collector()
    saved = collector.mode
    collector.mode = "summary"
    try:
        queue = cl.CommandQueue(ctx)
        watched = collector.stats().watched
        got, want = _run(queue)
        assert profiling.flush(10.0) == 0
    finally:
        collector.mode = saved
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert collector.stats().watched - watched == 3
    finished = spans.get_finished_spans()
    nodes = {s.context.span_id: s for s in finished if s.name == "netcl.graph.node"}
    device = [s for s in finished if s.name == "netcl.device.node"]
    assert sorted(s.attributes["netcl.node.name"] for s in device) == ["relu", "sum", "sum2"]
    for d in device:  # under its node's span, one after the other
        assert (
            d.parent is not None
            and nodes[d.parent.span_id].attributes["netcl.node.name"]
            == d.attributes["netcl.node.name"]
        )
    ends = sorted((d.start_time, d.end_time) for d in device)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ends))


def test_device_time_is_collected_with_and_without_an_sdk(ctx: cl.Context, otel_mode: str) -> None:
    queue = cl.CommandQueue(ctx, properties=_PROFILING)
    count = profiling.collector().stats().by_kind.get(profiling.GRAPH_NODE, (0, 0.0))[0]
    got, want = _run(queue)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert profiling.flush(10.0) == 0
    n, seconds = profiling.collector().stats().by_kind[profiling.GRAPH_NODE]
    assert n - count == 3 and seconds > 0
