"""netcl-graph planning time: a 10,000-op chain and a 10,000-op fan (one op read by all the
others), planned by a new executor each round (checks, order, lifetimes, every layout and its
pool simulation, the schedule). Target: at most 1 s each.

Run: ``python3 -m pytest benchmarks/bench_graph_planning.py -p no:randomly --benchmark-only``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor, TensorRef

N_OPS = 10_000


def _noop(inputs: list[Tensor], out: Tensor) -> None:
    pass


def _chain(n: int) -> Graph:
    g = Graph()
    prev: list[Tensor | TensorRef] = []
    for i in range(n):
        prev = [g.add_op(f"n{i}", _noop, prev, (256,), np.float32)]
    return g


def _fan(n: int) -> Graph:
    g = Graph()
    src = g.add_op("src", _noop, [], (256,), np.float32)
    for i in range(n - 1):
        g.add_op(f"n{i}", _noop, [src], (256,), np.float32)
    return g


@pytest.mark.benchmark(group="graph-planning")
@pytest.mark.parametrize("shape", [_chain, _fan], ids=["chain", "fan"])
def test_graph_planning(
    benchmark: Any, queue: cl.CommandQueue, shape: Callable[[int], Graph]
) -> None:
    """Planning 10,000 ops from scratch (a plan is made once per graph and reused by every run)."""
    graph = shape(N_OPS)
    pool = BufferPool(queue)
    plan = benchmark.pedantic(
        lambda: GraphExecutor(pool).plan(graph),
        rounds=1 if benchmark.disabled else 3,
        warmup_rounds=0,
    )
    assert len(plan.order) == N_OPS
    assert plan.pool_device_bytes <= pool.block_bytes(plan.lower_bound)
    benchmark.extra_info.update(nodes=N_OPS, strategy=plan.strategy)
