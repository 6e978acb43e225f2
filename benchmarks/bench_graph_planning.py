"""netcl-graph planning time: a 10,000-op chain and a 10,000-op fan (one op read by all the
others), planned by a new executor each round (checks, order, lifetimes, every layout and its
pool simulation, the schedule). Target: at most 1 s each. The floor, timed right before each
round (paired rounds, see paired.py): the same ops ordered by the standard library's
``graphlib.TopologicalSorter`` and each tensor's last reader found, by hand, which any planner
must do; the ratio to it (``paired_ratio_median``) holds on a slow runner and a fast one.

Run: ``python3 -m pytest benchmarks/bench_graph_planning.py -p no:randomly --benchmark-only``.
"""

from __future__ import annotations

import graphlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor, TensorRef

sys.path.insert(0, str(Path(__file__).parent))
from paired import paired_floor, record_floor

N_OPS = 10_000


def _noop(inputs: list[Tensor], out: Tensor) -> None:
    pass


def _chain(n: int) -> tuple[Graph, dict[str, list[str]]]:
    g = Graph()
    deps: dict[str, list[str]] = {}
    prev: list[Tensor | TensorRef] = []
    for i in range(n):
        prev = [g.add_op(f"n{i}", _noop, prev, (256,), np.float32)]
        deps[f"n{i}"] = [f"n{i - 1}"] if i else []
    return g, deps


def _fan(n: int) -> tuple[Graph, dict[str, list[str]]]:
    g = Graph()
    src = g.add_op("src", _noop, [], (256,), np.float32)
    deps: dict[str, list[str]] = {"src": []}
    for i in range(n - 1):
        g.add_op(f"n{i}", _noop, [src], (256,), np.float32)
        deps[f"n{i}"] = ["src"]
    return g, deps


def _by_hand(deps: dict[str, list[str]]) -> Callable[[], None]:
    """The floor: an order of the ops and each output's last reader."""

    def plan() -> None:
        last: dict[str, int] = {}
        for step, name in enumerate(graphlib.TopologicalSorter(deps).static_order()):
            for dep in deps[name]:
                last[dep] = step

    return plan


@pytest.mark.benchmark(group="graph-planning")
@pytest.mark.parametrize("shape", [_chain, _fan], ids=["chain", "fan"])
def test_graph_planning(
    benchmark: Any,
    queue: cl.CommandQueue,
    shape: Callable[[int], tuple[Graph, dict[str, list[str]]]],
) -> None:
    """Planning 10,000 ops from scratch (a plan is made once per graph and reused by every run)."""
    graph, deps = shape(N_OPS)
    pool = BufferPool(queue)
    setup, floor = paired_floor(_by_hand(deps))
    plan = benchmark.pedantic(
        lambda: GraphExecutor(pool).plan(graph),
        setup=setup,
        rounds=1 if benchmark.disabled else 3,
        warmup_rounds=0,
    )
    record_floor(benchmark, floor)
    assert len(plan.order) == N_OPS
    assert plan.pool_device_bytes <= pool.block_bytes(plan.lower_bound)
    benchmark.extra_info.update(nodes=N_OPS, strategy=plan.strategy)
