"""Spans and metrics of GraphExecutor.run (the names of docs/guides/graph.md, Telemetry), and the
no-SDK fast path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor, TensorRef


def _graph(queue: cl.CommandQueue, kernels: Any) -> Graph:
    x = Tensor.from_numpy(np.arange(12, dtype=np.float32), queue)
    g = Graph()
    a = g.add_op("add", kernels.add, [x, x], (12,), "float32")
    b = g.add_op("relu", kernels.relu, [a], (12,), "float32")
    g.add_op("relu2", kernels.relu, [b], (3, 4), "float32")
    return g


def test_run_and_node_spans(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any, spans: InMemorySpanExporter
) -> None:
    ex = GraphExecutor(pool)
    out = ex.run(_graph(queue, kernels))
    pool.release(out)
    done = spans.get_finished_spans()
    runs = [s for s in done if s.name == "netcl.graph.run"]
    nodes = [s for s in done if s.name == "netcl.graph.node"]
    assert len(runs) == 1 and len(nodes) == 3
    run = runs[0]
    plan = ex.plan(_graph(queue, kernels))
    assert run.attributes is not None
    assert run.attributes["netcl.graph.nodes"] == 3
    assert run.attributes["netcl.pool.peak_bytes"] == plan.pool_peak_bytes > 0
    assert run.attributes["netcl.graph.lower_bound_bytes"] == plan.lower_bound
    assert run.attributes["netcl.graph.strategy"] == plan.strategy
    # the bytes of the blocks that hold intermediates only (0 when every value is in an output's)
    arena = sum(b.size for b in plan.blocks if b.owner is None)
    assert run.attributes["netcl.graph.arena_bytes"] == plan.arena_bytes == arena
    assert [n.attributes["netcl.node.name"] for n in nodes if n.attributes] == [
        "add",
        "relu",
        "relu2",
    ]
    last = nodes[2].attributes
    assert last is not None
    assert tuple(last["netcl.node.shape"]) == (3, 4)  # type: ignore[arg-type]
    assert last["netcl.node.dtype"] == "float32"
    for n in nodes:
        assert n.parent is not None and n.parent.span_id == run.context.span_id
        assert n.context.trace_id == run.context.trace_id


def test_failing_node_span_records_the_error(
    queue: cl.CommandQueue, pool: BufferPool, spans: InMemorySpanExporter
) -> None:
    def bad(inputs: list[Tensor], out: Tensor) -> None:
        raise ValueError("nope")

    g = Graph()
    g.add_op("bad", bad, [], (4,), "float32")
    with pytest.raises(RuntimeError, match="op 'bad'"):
        GraphExecutor(pool).run(g)
    done = {s.name: s for s in spans.get_finished_spans()}
    node, run = done["netcl.graph.node"], done["netcl.graph.run"]
    assert node.status.status_code == StatusCode.ERROR
    assert any(e.name == "exception" for e in node.events)
    assert run.status.status_code == StatusCode.ERROR
    assert run.attributes is not None and run.attributes["error.type"] == "ValueError"
    assert pool.stats.bytes_in_use == 0


def test_metrics(
    queue: cl.CommandQueue,
    pool: BufferPool,
    kernels: Any,
    metric_points: Callable[[str], list[Any]],
) -> None:
    def total(name: str) -> float:
        return sum(getattr(p, "value", 0) or getattr(p, "count", 0) for p in metric_points(name))

    nodes0 = total("netcl.graph.nodes_executed")
    runs0 = total("netcl.graph.run.duration")
    plans0 = total("netcl.graph.plans")
    ex = GraphExecutor(pool)
    g = _graph(queue, kernels)
    for _ in range(2):
        pool.release(ex.run(g))
    assert total("netcl.graph.nodes_executed") - nodes0 == 6
    assert total("netcl.graph.run.duration") - runs0 == 2  # histogram count
    assert total("netcl.graph.plans") - plans0 == 1  # planned once, run twice


def test_no_sdk_fast_path_starts_no_span() -> None:
    """Without an SDK the executor never touches the tracer (checked in a fresh process)."""
    code = textwrap.dedent(
        """
        import numpy as np
        from netcl.core import device, telemetry
        from netcl.core.memory import BufferPool
        from netcl.core.tensor import Tensor
        from netcl.runtime.graph import Graph, GraphExecutor, _executor, _telemetry
        assert not telemetry.tracing()

        def forbidden(*a, **k):
            raise AssertionError("span work on the no-SDK path")

        class NoSpans:
            span = record_span = forbidden

        _telemetry.TEL.tracer.start_span = forbidden
        _executor.TEL = NoSpans()
        q = device.default_queue()
        x = Tensor.from_numpy(np.arange(8, dtype=np.float32), q)

        def double(inputs, out):
            out.write(inputs[0].to_numpy() * 2)

        g = Graph()
        a = g.add_op("a", double, [x], (8,), "float32")
        g.add_op("b", double, [a], (8,), "float32")
        out = GraphExecutor(BufferPool(q)).run(g)
        assert (out.to_numpy() == np.arange(8) * 4).all()
        print("ok")
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


class OpFailedError(Exception):
    """An op's own error type (not a builtin): spans report it fully qualified."""


def test_error_type_is_the_ops_own_exception_fully_qualified(
    queue: cl.CommandQueue, pool: BufferPool, kernels: Any, spans: InMemorySpanExporter
) -> None:
    def bad(inputs: list[Tensor], out: Tensor) -> None:
        raise OpFailedError("nope")

    x = Tensor.from_numpy(np.arange(4, dtype=np.float32), queue)
    g = Graph()
    a = g.add_op("relu", kernels.relu, [x], (4,), "float32")
    g.add_op("bad", bad, [a], (4,), "float32")
    with pytest.raises(RuntimeError, match="op 'bad' raised OpFailedError") as info:
        GraphExecutor(pool).run(g)
    assert isinstance(info.value.__cause__, OpFailedError)
    want = f"{OpFailedError.__module__}.OpFailedError"
    done = spans.get_finished_spans()
    run = next(s for s in done if s.name == "netcl.graph.run")
    nodes = {
        s.attributes["netcl.node.name"]: s
        for s in done
        if s.name == "netcl.graph.node" and s.attributes
    }
    # the caller gets the executor's RuntimeError; both spans name the op's own exception
    assert run.attributes is not None and run.attributes["error.type"] == want
    failed = nodes["bad"]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == want
    assert nodes["relu"].status.status_code != StatusCode.ERROR
    assert pool.stats.bytes_in_use == 0


def test_a_failing_sdk_changes_nothing_a_run_returns(
    queue: cl.CommandQueue,
    pool: BufferPool,
    kernels: Any,
    spans: InMemorySpanExporter,
    hostile_sdk: Callable[[], None],
) -> None:
    """A span processor raising in on_start and on_end, and a metric reader raising on record
    and collect: runs return the right values, and a failing op the executor's own error."""
    ex = GraphExecutor(pool)
    g = _graph(queue, kernels)
    want = np.maximum(2 * np.arange(12, dtype=np.float32), 0).reshape(3, 4)
    for _ in range(3):
        out = ex.run(g)
        hostile_sdk()  # a collection now: raises inside the SDK
        np.testing.assert_array_equal(out.to_numpy(), want)
        pool.release(out)
    total, last = ex.run(g, ["add", "relu2"])
    np.testing.assert_array_equal(last.to_numpy(), want)
    np.testing.assert_array_equal(total.to_numpy(), 2 * np.arange(12, dtype=np.float32))
    pool.release_all([total, last])

    def bad(inputs: list[Tensor], out: Tensor) -> None:
        raise OpFailedError("still reported")

    g.add_op("bad", bad, [TensorRef("relu2")], (4,), "float32")
    with pytest.raises(RuntimeError, match="op 'bad' raised OpFailedError: still reported"):
        ex.run(g)
    assert pool.stats.bytes_in_use == 0
