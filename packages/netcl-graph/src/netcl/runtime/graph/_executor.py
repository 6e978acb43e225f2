"""GraphExecutor: runs a Graph's plan, intermediates in one pooled arena, outputs in own blocks."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import pyopencl as cl

from netcl.core import telemetry
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph._graph import Graph, TensorRef
from netcl.runtime.graph._plan import GraphPlan, build_plan
from netcl.runtime.graph.version import __version__

__all__ = ["GraphExecutor"]

_SCOPE = "netcl.runtime.graph"
_tracer = telemetry.tracer(_SCOPE, __version__)
_meter = telemetry.meter(_SCOPE, __version__)
_nodes_executed = _meter.create_counter(
    "netcl.graph.nodes_executed", unit="{node}", description="Graph ops whose fn was called"
)
_runs = _meter.create_histogram(
    "netcl.graph.run.duration",
    unit="s",
    description="Host time of GraphExecutor.run (enqueueing every op; the device may still run)",
    explicit_bucket_boundaries_advisory=telemetry.DURATION_BUCKETS_S,
)
_plans_built = _meter.create_counter(
    "netcl.graph.plans", unit="{plan}", description="Graph plans built (cache misses)"
)

_OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


class GraphExecutor:
    """Runs graphs with device memory from ``pool``.

    The first run of a graph (for a given set of outputs) plans it: topological order, lifetimes
    and an arena layout for the intermediates. Later runs reuse the plan until the graph changes.
    Each run takes one arena block from the pool for all intermediates, gives it back at the end,
    and allocates each requested output as a pool Tensor that the caller owns (release it with
    ``pool.release(tensor)``). External input Tensors are never released.

    Op functions must enqueue their work on ``out.queue`` (the pool's queue). On an out-of-order
    queue the executor puts a barrier after every op, so no op starts before its inputs are
    written and no arena bytes are rewritten while an earlier reader may still run.
    """

    def __init__(self, pool: BufferPool) -> None:
        if not isinstance(pool, BufferPool):
            raise TypeError(f"GraphExecutor: pool must be a BufferPool, got {pool!r}")
        self.pool = pool
        queue = pool.queue
        self._queue = queue
        self._context = queue.context
        # sub-buffer origins must be multiples of the device's base address alignment (in bits)
        self._alignment = max(int(queue.device.mem_base_addr_align) // 8, 1)
        self._out_of_order = bool(queue.properties & _OOO)
        self._lock = threading.Lock()
        self._plans: weakref.WeakKeyDictionary[Graph, dict[tuple[str, ...] | None, GraphPlan]]
        self._plans = weakref.WeakKeyDictionary()

    @property
    def alignment(self) -> int:
        """Bytes every value's size and arena offset is rounded to (the device's alignment)."""
        return self._alignment

    def plan(
        self, graph: Graph, outputs: Sequence[TensorRef | str] | None = None
    ) -> GraphPlan:
        """The plan a run of ``graph`` with these ``outputs`` uses (made now if not cached).

        Raises ValueError on a cycle, an unknown ref or output, or an empty graph.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphExecutor: graph must be a Graph, got {graph!r}")
        key = None if outputs is None else _output_names(outputs)
        with self._lock:
            per_graph = self._plans.get(graph)
            if per_graph is not None:
                cached = per_graph.get(key)
                if cached is not None and cached.graph_version == graph.version:
                    return cached
        plan = build_plan(graph, key, self._alignment, self.pool.block_bytes, self._context)
        _plans_built.add(1)
        with self._lock:
            per_graph = self._plans.get(graph)
            if per_graph is None or any(
                p.graph_version != graph.version for p in per_graph.values()
            ):
                per_graph = self._plans[graph] = {}
            per_graph[key] = plan
        return plan

    @overload
    def run(self, graph: Graph) -> Tensor: ...
    @overload
    def run(self, graph: Graph, outputs: None) -> Tensor: ...
    @overload
    def run(self, graph: Graph, outputs: Sequence[TensorRef | str]) -> list[Tensor]: ...

    def run(
        self, graph: Graph, outputs: Sequence[TensorRef | str] | None = None
    ) -> Tensor | list[Tensor]:
        """Run every op of ``graph`` in topological order.

        Returns the output of the last op run, or, when ``outputs`` names ops (TensorRefs or
        names), a list of their outputs in that order. Returned Tensors belong to the caller.
        An op that raises makes ``run`` raise RuntimeError naming the op, after every block this
        run took went back to the pool.
        """
        plan = self.plan(graph, outputs)
        t0 = time.perf_counter()
        if telemetry.tracing():
            with _tracer.start_as_current_span(
                "netcl.graph.run",
                attributes={
                    "netcl.graph.nodes": len(plan.order),
                    "netcl.pool.peak_bytes": plan.pool_peak_bytes,
                    "netcl.graph.arena_bytes": plan.arena_bytes,
                    "netcl.graph.lower_bound_bytes": plan.lower_bound,
                },
            ):
                result = self._execute(plan, traced=True)
        else:
            result = self._execute(plan, traced=False)
        _runs.record(time.perf_counter() - t0)
        _nodes_executed.add(len(plan.order))
        return result[0] if outputs is None else result

    def _execute(self, plan: GraphPlan, traced: bool) -> list[Tensor]:
        pool = self.pool
        queue = self._queue
        ooo = self._out_of_order
        arena = pool.allocate((plan.arena_bytes,), np.uint8) if plan.arena_bytes else None
        outs: list[Tensor] = []
        step = None
        try:
            values = self._table(plan, arena)
            if ooo:
                cl.enqueue_barrier(queue)  # earlier users of these blocks finish first
            # two copies of the per-op body: the untraced one stays free of a context manager
            if traced:
                for step in plan._steps:
                    with _tracer.start_as_current_span(
                        "netcl.graph.node",
                        attributes={
                            "netcl.node.name": step.name,
                            "netcl.node.shape": step.shape,
                            "netcl.node.dtype": step.dtype.name,
                        },
                    ):
                        if step.output:
                            values[step.slot] = out = pool.allocate(step.shape, step.dtype)
                            outs.append(out)
                        step.fn([values[i] for i in step.inputs], values[step.slot])
                        if ooo:
                            cl.enqueue_barrier(queue)
            else:
                for step in plan._steps:
                    if step.output:
                        values[step.slot] = out = pool.allocate(step.shape, step.dtype)
                        outs.append(out)
                    step.fn([values[i] for i in step.inputs], values[step.slot])
                    if ooo:
                        cl.enqueue_barrier(queue)
        except BaseException as exc:
            # give back everything this run took; blocks are reused only by commands enqueued
            # after these (in-order queue, or the barrier on an out-of-order one)
            if ooo:
                cl.enqueue_barrier(queue)
            pool.release_all(outs)
            if arena is not None:
                pool.release(arena)
            if isinstance(exc, Exception) and step is not None:
                raise RuntimeError(
                    f"GraphExecutor.run: op {step.name!r} raised {type(exc).__name__}: {exc}"
                ) from exc
            raise
        if arena is not None:
            pool.release(arena)
        return [values[i] for i in plan._out_slots]

    def _table(self, plan: GraphPlan, arena: Tensor | None) -> list[Any]:
        """The run's value table: external inputs, arena views of the intermediates, and a free
        slot per output. Views are made once per arena block and kept with the plan."""
        key = 0 if arena is None else arena.buffer.int_ptr
        cached = plan._table[0]
        if cached is not None and cached[0] == key:
            return list(cached[1])
        table: list[Any] = list(plan._externals)
        # A Buffer of our own on the pooled block (PooledBuffer has no get_sub_region). It retains
        # the cl_mem, so the handle (our cache key) cannot be reused while the views exist.
        base = None if arena is None else cl.Buffer.from_int_ptr(key, retain=True)
        for step in plan._steps:
            if step.output or base is None:
                table.append(None)
            else:
                lt = plan.lifetimes[step.name]
                assert lt.offset is not None
                sub = base.get_sub_region(lt.offset, lt.size)
                table.append(Tensor(sub, step.shape, step.dtype, self._queue))
        plan._table[0] = (key, table)
        return list(table)

    def __repr__(self) -> str:
        return f"GraphExecutor(pool={self.pool!r}, alignment={self._alignment})"


def _output_names(outputs: Sequence[TensorRef | str]) -> tuple[str, ...]:
    if isinstance(outputs, (str, TensorRef)) or not isinstance(outputs, Sequence):
        raise TypeError(
            f"GraphExecutor: outputs must be a sequence of TensorRef or op names, got {outputs!r}"
        )
    names: list[str] = []
    for i, o in enumerate(outputs):
        if isinstance(o, TensorRef):
            names.append(o.name)
        elif isinstance(o, str):
            names.append(o)
        else:
            raise TypeError(
                f"GraphExecutor: outputs[{i}] must be a TensorRef or an op name, got {o!r}"
            )
    return tuple(names)
