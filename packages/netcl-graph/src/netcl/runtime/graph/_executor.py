"""GraphExecutor: runs a Graph's plan with the pool blocks its memory layout chose."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, overload

import pyopencl as cl

from netcl.core import profiling, telemetry
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph._graph import Graph, TensorRef
from netcl.runtime.graph._plan import GraphPlan, build_plan
from netcl.runtime.graph._schedule import Schedule, Step
from netcl.runtime.graph._telemetry import (
    ARENA_BYTES,
    LOWER_BOUND_BYTES,
    NODE_SPAN,
    NODES,
    NODES_EXECUTED,
    PEAK_BYTES,
    PLANS_BUILT,
    RUN_DURATION,
    RUN_SPAN,
    STRATEGY,
    TEL,
)

__all__ = ["GraphExecutor"]

_OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE

_VIEW_CACHE = 4  # pool blocks per plan block whose views are kept


class _Run:
    """The executor's private state for one (graph, outputs): the public plan, the schedule,
    and the sub-buffer views made for the blocks last seen (mutated under ``lock``)."""

    __slots__ = ("lock", "plan", "run_attrs", "schedule", "views")

    def __init__(self, plan: GraphPlan, schedule: Schedule) -> None:
        self.plan = plan
        self.schedule = schedule
        self.run_attrs: Mapping[str, Any] = {
            NODES: len(plan.order),
            PEAK_BYTES: plan.pool_peak_bytes,
            ARENA_BYTES: plan.arena_bytes,
            LOWER_BOUND_BYTES: plan.lower_bound,
            STRATEGY: plan.strategy,
        }
        self.lock = threading.Lock()
        # per block: {int_ptr of a pool block: its views}: the pool hands a few blocks of a
        # size class back in turn (LIFO), so several are kept
        self.views: list[dict[int, tuple[Tensor, ...]]] = [{} for _ in schedule.blocks]

    def forget(self) -> None:
        with self.lock:
            self.views = [{} for _ in self.views]


class GraphExecutor:
    """Runs graphs with device memory from ``pool``.

    The first run of a graph (for a given set of outputs) plans it: topological order, lifetimes
    and a memory layout (see :class:`GraphPlan`); later runs reuse the plan until the graph
    changes. A run takes its pool blocks when the first value in them is produced and gives the
    intermediates' blocks back after their last reader; each requested output is a pool Tensor
    the caller owns (release it with ``pool.release(tensor)``). External inputs are never
    released.

    Op functions must enqueue their work on ``out.queue`` (the pool's queue). On an out-of-order
    queue the executor puts a barrier after every op, so no op starts before its inputs are
    written and no block is rewritten while an earlier reader may still run.
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
        # a queue's properties never change: the one profiling check, made here
        self._profiled = profiling.enabled(queue)
        self._lock = threading.Lock()
        self._runs: weakref.WeakKeyDictionary[Graph, dict[tuple[str, ...] | None, _Run]]
        self._runs = weakref.WeakKeyDictionary()
        # views retain their block's memory: drop them when the pool frees its held blocks
        pool._add_free_held_hook(self._forget_views)

    @property
    def alignment(self) -> int:
        """Bytes every value's size and offset is rounded to (the device's alignment)."""
        return self._alignment

    def plan(
        self, graph: Graph, outputs: Sequence[TensorRef | str] | None = None
    ) -> GraphPlan:
        """The plan a run of ``graph`` with these ``outputs`` uses (made now if not cached).

        Raises ValueError on a cycle, an unknown ref or output, or an empty graph.
        """
        return self._run_state(graph, outputs).plan

    def _run_state(self, graph: Graph, outputs: Sequence[TensorRef | str] | None) -> _Run:
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphExecutor: graph must be a Graph, got {graph!r}")
        key = None if outputs is None else _output_names(outputs)
        with self._lock:
            per_graph = self._runs.get(graph)
            if per_graph is not None:
                cached = per_graph.get(key)
                if cached is not None and cached.plan.graph_version == graph.version:
                    return cached
        run = _Run(
            *build_plan(graph, key, self._alignment, self.pool.block_bytes, self._context)
        )
        PLANS_BUILT.add(1)
        with self._lock:
            per_graph = self._runs.get(graph)
            if per_graph is None or any(
                r.plan.graph_version != graph.version for r in per_graph.values()
            ):
                per_graph = self._runs[graph] = {}
            per_graph[key] = run
        return run

    def _forget_views(self) -> None:
        with self._lock:
            runs = [r for per_graph in self._runs.values() for r in per_graph.values()]
        for r in runs:
            r.forget()

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
        An op that raises makes ``run`` raise RuntimeError naming the op; a block that cannot be
        allocated raises MemoryError naming the op that needed it. Either way every block this
        run took went back to the pool first.
        """
        state = self._run_state(graph, outputs)
        t0 = time.perf_counter()
        traced = telemetry.tracing()
        if traced:
            result = self._traced(state)
        elif self._profiled:
            result = self._execute(state, False, True)
        else:
            result = self._execute(state, False)
        RUN_DURATION.record(time.perf_counter() - t0)
        NODES_EXECUTED.add(len(state.schedule.steps))
        return result[0] if outputs is None else result

    def _traced(self, state: _Run) -> list[Tensor]:
        with TEL.span(RUN_SPAN, state.run_attrs) as span:
            try:
                return self._execute(state, True, self._profiled)
            except BaseException as exc:
                # the caller gets an error that wraps the op's own: the span reports the op's
                span.fail(exc.__cause__ if exc.__cause__ is not None else exc)
                raise

    def _execute(self, state: _Run, traced: bool, profiled: bool = False) -> list[Tensor]:
        pool = self.pool
        queue = self._queue
        ooo = self._out_of_order
        values = list(state.schedule.template)
        taken: list[Tensor | None] = [None] * len(state.schedule.blocks)
        step = None
        allocating = -1
        span = telemetry.NO_SPAN
        # spans and device time share one flag, so a plain run tests one bool per op, as before
        hooked = traced or profiled
        marker: cl.Event | None = None
        try:
            if ooo:
                cl.enqueue_barrier(queue)  # earlier users of these blocks finish first
            if profiled:
                # node k's device time: from the marker before it to the one after it
                marker = cl.enqueue_marker(queue)
            # The one per-op loop: take the step's blocks, call its fn, release the blocks whose
            # last reader it was. Span and device-time work only behind `hooked`; no call or
            # loop for a step that takes or releases nothing (most of them).
            for step in state.schedule.steps:
                if traced:
                    span = TEL.span(NODE_SPAN, step.attrs)
                if step.allocs:
                    for allocating in step.allocs:
                        self._take(state, allocating, taken, values)
                    allocating = -1
                ins = step.inputs
                # a one-element list directly: cheaper than a comprehension on Python < 3.12
                step.fn(
                    [values[ins[0]]] if len(ins) == 1 else [values[i] for i in ins],
                    values[step.slot],
                )
                if ooo:
                    cl.enqueue_barrier(queue)
                if hooked:
                    if marker is not None:
                        marker = _watch_node(queue, marker, step.name, span)
                    span.end()
                    span = telemetry.NO_SPAN
                if step.frees:
                    for k in step.frees:
                        pool.release(taken[k])  # type: ignore[arg-type]
                        taken[k] = None
        except BaseException as exc:
            span.end(exc)  # the node span still open, if any
            self._unwind(state, taken, step, allocating, exc)
            raise
        return [values[i] for i in state.schedule.out_slots]

    def _unwind(
        self,
        state: _Run,
        taken: list[Tensor | None],
        step: Step | None,
        allocating: int,
        exc: BaseException,
    ) -> None:
        """After a failed step: give back every block this run took, and raise the error that
        names the op (returns only for an exception to re-raise as is)."""
        # blocks are reused only by commands enqueued after these (in-order queue, or the
        # barrier on an out-of-order one)
        if self._out_of_order:
            cl.enqueue_barrier(self._queue)
        self.pool.release_all([t for t in taken if t is not None])
        if step is not None and allocating >= 0 and isinstance(exc, MemoryError):
            what = _block_role(state.plan, allocating)
            raise MemoryError(
                f"GraphExecutor.run: op {step.name!r} needs a block of "
                f"{state.schedule.blocks[allocating].nbytes} bytes ({what}) that cannot be "
                f"allocated: {exc}"
            ) from exc
        if isinstance(exc, Exception) and step is not None:
            raise RuntimeError(
                f"GraphExecutor.run: op {step.name!r} raised {type(exc).__name__}: {exc}"
            ) from exc

    def _take(self, state: _Run, k: int, taken: list[Tensor | None], values: list[Any]) -> None:
        """Allocate block ``k`` and put it (its owner's Tensor) and its views in the table."""
        spec = state.schedule.blocks[k]
        taken[k] = block = self.pool.allocate(spec.shape, spec.dtype, _nbytes=spec.nbytes)
        if spec.owner >= 0:
            values[spec.owner] = block
        if spec.views:
            views = state.views[k].get(block.buffer.int_ptr)
            if views is None:
                views = self._views(state, k, block)
            values[spec.first_view : spec.first_view + len(views)] = views

    def _views(self, state: _Run, k: int, block: Tensor) -> tuple[Tensor, ...]:
        """The views of block ``k``'s values on a pool block: made once per pool block (the
        pool hands the same block back run after run) and kept until the pool frees its held
        blocks."""
        ptr = block.buffer.int_ptr
        # A Buffer of our own on the pooled block (PooledBuffer has no get_sub_region)
        base = cl.Buffer.from_int_ptr(ptr, retain=True)
        made = tuple(
            Tensor(base.get_sub_region(v.offset, v.size), v.shape, v.dtype, self._queue)
            for v in state.schedule.blocks[k].views
        )
        with state.lock:
            cache = state.views[k]
            if len(cache) >= _VIEW_CACHE:
                cache.clear()
            cache[ptr] = made
        return made

    def __repr__(self) -> str:
        return f"GraphExecutor(pool={self.pool!r}, alignment={self._alignment})"


def _watch_node(
    queue: cl.CommandQueue, before: cl.Event, name: str, span: telemetry.Span
) -> cl.Event:
    """Hand a node's device time (``before`` to a marker enqueued now) to the collector under
    the node's span; return the new marker (the next node's ``before``)."""
    after = cl.enqueue_marker(queue)
    profiling.watch_markers(profiling.GRAPH_NODE, before, after, name=name, parent=span)
    return after


def _block_role(plan: GraphPlan, k: int) -> str:
    block = plan.blocks[k]
    held = [lt.name for lt in plan.lifetimes.values() if lt.block == k and lt.name != block.owner]
    also = f", also holding {', '.join(held)} before it" if held else ""
    if block.last is None:
        return f"the block of output {block.owner!r}{also}"
    return f"the block of {', '.join([block.owner] if block.owner else held)}"


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
