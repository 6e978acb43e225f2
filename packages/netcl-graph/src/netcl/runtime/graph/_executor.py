"""GraphExecutor: runs a Graph's plan with the pool blocks its memory layout chose."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, overload

import numpy as np
import pyopencl as cl

from netcl.core import device, telemetry
from netcl.core.memory import BufferPool, Guard, MemoryCheckError, guard_byte, guard_bytes
from netcl.core.tensor import Gone, Shape, Tensor
from netcl.runtime.graph import _telemetry as tm
from netcl.runtime.graph._graph import Graph, Op, OpFn, TensorRef
from netcl.runtime.graph._telemetry import TEL

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from netcl.runtime.graph._plan import GraphPlan

__all__ = ["GraphExecutor"]


_VIEW_CACHE = 4  # pool blocks per plan block whose views are kept


@dataclass(frozen=True, slots=True)
class _ScheduledOp:
    """One op as a run executes it: take ``allocs`` blocks, call ``fn`` on the ``inputs`` slots
    of the value table writing slot ``slot``, then release ``frees`` blocks. In checked mode
    ``guard`` is the block, guard and description of its output."""

    name: str
    fn: OpFn
    inputs: tuple[int, ...]
    slot: int
    allocs: tuple[int, ...]
    frees: tuple[int, ...]
    attrs: dict[str, AttributeValue]  # attributes of its span
    guard: tuple[int, Guard, str] | None


@dataclass(frozen=True, slots=True)
class _View:
    """A value that lives inside a block at ``offset`` (a sub-buffer of ``size`` bytes)."""

    offset: int
    size: int
    shape: Shape
    dtype: np.dtype[Any]


@dataclass(frozen=True, slots=True)
class _BlockSpec:
    """How a run takes one block from the pool, and which values it holds; what the Tensor of
    each intermediate among them holds once the block goes back to the pool (or, in an output's
    block, once the run ends): ``gone`` for the owner, ``gones`` for the views."""

    nbytes: int
    shape: Shape  # of the Tensor the pool hands out: the owner's, or (nbytes,) uint8
    dtype: np.dtype[Any]
    owner: int  # value slot of the owning output, -1 for a block of intermediates
    views: tuple[_View, ...]  # the values in slots first_view, first_view + 1, ...
    first_view: int
    gone: Gone | None  # None: no owner, or an output
    gones: tuple[Gone, ...]


class _Views(NamedTuple):
    """The views of one pool block: Tensors, made once, with their buffers (given back to them
    as a run takes the block) and the stand-ins they hold once their run ended."""

    tensors: tuple[Tensor, ...]
    live: tuple[tuple[Tensor, Any], ...]
    ended: tuple[tuple[Tensor, Gone], ...]


class _PlannedRun:
    """The executor's private state for one (graph, outputs): the public plan, the schedule a run
    walks (ops over a value table that starts as ``template``: the external inputs, then a slot
    per op), and the sub-buffer views made for the blocks last seen (mutated under ``lock``)."""

    __slots__ = (
        "blocks",
        "kept",
        "lock",
        "ops",
        "out_slots",
        "plan",
        "run_attrs",
        "template",
        "views",
    )

    def __init__(self, plan: GraphPlan, graph: Graph, context: cl.Context, checked: bool) -> None:
        self.plan = plan
        order = [graph.op(name) for name in plan.order]
        slot: dict[int | str, int] = {}  # id of an external Tensor, or an op's name -> its slot
        externals: list[Tensor] = []
        for op in order:
            for pos, x in enumerate(op.inputs):
                if isinstance(x, Tensor) and id(x) not in slot:
                    if x.queue.context != context:
                        raise ValueError(
                            f"graph op {op.name!r}: input {pos} ({x!r}) lives in another OpenCL "
                            "context than the executor's pool"
                        )
                    slot[id(x)] = len(externals)
                    externals.append(x)
        self.template: tuple[Any, ...] = (*externals, *([None] * len(order)))
        guards: dict[str, tuple[int, Guard, str]] = {}  # checked mode: each op's output guard
        self.blocks = self._blocks(order, slot, _graph_name(graph), guards if checked else None)
        # outputs' blocks (the run does not release them) with intermediates: these end with it
        self.kept = tuple(
            k for k, b in enumerate(self.blocks) if b.gones and plan.blocks[k].last is None
        )
        self.ops = self._ops(order, slot, guards)
        self.out_slots = tuple(slot[n] for n in plan.outputs)
        self.run_attrs: dict[str, AttributeValue] = {
            tm.NODES: len(plan.order),
            tm.PEAK_BYTES: plan.pool_peak_bytes,
            tm.ARENA_BYTES: plan.arena_bytes,
            tm.LOWER_BOUND_BYTES: plan.lower_bound,
            tm.STRATEGY: plan.strategy,
        }
        self.lock = threading.Lock()
        # per block: {int_ptr of a pool block: its views, with their buffers and stand-ins}: the
        # pool hands a few blocks of a size class back in turn (LIFO), so several are kept
        self.views: list[dict[int, _Views]] = [{} for _ in self.blocks]

    def _blocks(
        self,
        order: Sequence[Op],
        slot: dict[int | str, int],
        graph: str,
        guards: dict[str, tuple[int, Guard, str]] | None,
    ) -> tuple[_BlockSpec, ...]:
        """The blocks, giving each value its slot: grouped by block (its owner, then its views),
        so that a run puts a block's views into the value table with one slice assignment; in
        checked mode each value's guard (after it, and before it in a view) into ``guards``."""
        from netcl.runtime.graph._plan import padding  # loaded: the plan was built

        plan = self.plan
        guard = None if guards is None else guard_bytes
        members: list[list[Op]] = [[] for _ in plan.blocks]
        for op in order:
            members[plan.lifetimes[op.name].block].append(op)
        specs: list[_BlockSpec] = []
        for b, ops in zip(plan.blocks, members, strict=True):
            shape: Shape = (b.nbytes,)
            dtype = np.dtype(np.uint8)
            owner = -1
            if b.owner is not None:
                op = next(op for op in ops if op.name == b.owner)
                shape, dtype, owner = op.shape, op.dtype, len(slot)
                slot[op.name] = owner
            first_view = len(slot)
            views = []
            gones: list[Gone] = []  # of the views (intermediates all)
            gone = None  # of the owner, an intermediate
            for op in ops:
                lt = plan.lifetimes[op.name]
                ended = None  # an output stays the caller's
                if not lt.is_output:
                    ended = Gone(
                        f"is intermediate {op.name!r} of {graph}: its run ended and its memory now "
                        f"holds other values; request it as an output (run(graph, outputs=[..., "
                        f"{op.name!r}])) or copy it inside the op"
                    )
                before = start = 0  # where the value starts in its block, after its guard
                if op.name == b.owner:
                    gone = ended
                else:
                    slot[op.name] = len(slot)
                    before = padding(op.nbytes, lt.is_output, plan.alignment, guard)[0]
                    start = lt.offset + before
                    views.append(_View(start, lt.size - before, op.shape, op.dtype))
                    gones.append(ended)  # type: ignore[arg-type]
                if guards is not None:
                    after = guard_bytes(op.nbytes)
                    what = (
                        f"its {'output' if lt.is_output else 'intermediate'} {op.name!r} "
                        f"(shape {op.shape}, {op.dtype}, {op.nbytes} bytes) of {graph}"
                    )
                    around = Guard(start, op.nbytes, before, after, guard_byte(op.index))
                    guards[op.name] = (len(specs), around, what)
            specs.append(
                _BlockSpec(
                    b.nbytes, shape, dtype, owner, tuple(views), first_view, gone, tuple(gones)
                )
            )
        return tuple(specs)

    def _ops(
        self,
        order: Sequence[Op],
        slot: dict[int | str, int],
        guards: dict[str, tuple[int, Guard, str]],
    ) -> tuple[_ScheduledOp, ...]:
        allocs: list[list[int]] = [[] for _ in order]
        frees: list[list[int]] = [[] for _ in order]
        for k, b in enumerate(self.plan.blocks):
            allocs[b.first].append(k)
            if b.last is not None:
                frees[b.last].append(k)
        dtype_names: dict[np.dtype[Any], str] = {}  # dtype.name takes microseconds
        scheduled = []
        for op, takes, gives in zip(order, allocs, frees, strict=True):
            if op.dtype not in dtype_names:
                dtype_names[op.dtype] = op.dtype.name
            attrs: dict[str, AttributeValue] = {
                tm.NODE_NAME: op.name,
                tm.NODE_SHAPE: op.shape,
                tm.NODE_DTYPE: dtype_names[op.dtype],
            }
            inputs = tuple(slot[x.name if isinstance(x, TensorRef) else id(x)] for x in op.inputs)
            guard = guards.get(op.name)
            node = _ScheduledOp(
                op.name, op.fn, inputs, slot[op.name], tuple(takes), tuple(gives), attrs, guard
            )
            scheduled.append(node)
        return tuple(scheduled)


class GraphExecutor:
    """Runs graphs with device memory from ``pool``.

    The first run of a graph (for a given set of outputs) plans it (:class:`GraphPlan`); later
    runs reuse the plan until the graph changes. Each requested output is a pool Tensor the
    caller owns (``pool.release(tensor)``); external inputs are never released. Op functions
    must enqueue their work on ``out.queue`` (the pool's queue).
    """

    def __init__(self, pool: BufferPool) -> None:
        if not isinstance(pool, BufferPool):
            raise TypeError(f"GraphExecutor: pool must be a BufferPool, got {pool!r}")
        self.pool = pool
        self._queue = queue = pool.queue
        # sub-buffer origins must be multiples of the device's base address alignment (in bits)
        self._alignment = max(int(queue.device.mem_base_addr_align) // 8, 1)
        self._out_of_order = device.out_of_order(queue)
        # a queue's properties never change: the one device-time check, made here
        self._collector = device.watcher(queue)
        self._checked = pool.check_memory  # checked mode is the pool's (guide)
        self._lock = threading.Lock()
        self._runs: weakref.WeakKeyDictionary[Graph, dict[tuple[str, ...] | None, _PlannedRun]]
        self._runs = weakref.WeakKeyDictionary()
        # views retain their block's memory: drop them when the pool frees its held blocks
        pool.on_free_held(self._forget_views)

    @property
    def alignment(self) -> int:
        """Bytes every value's size and offset is rounded to (the device's alignment)."""
        return self._alignment

    def plan(self, graph: Graph, outputs: Sequence[TensorRef | str] | None = None) -> GraphPlan:
        """The plan a run of ``graph`` with these ``outputs`` uses (made now if not cached).

        Raises ValueError on a cycle, an unknown ref or output, or an empty graph.
        """
        return self._run_state(graph, outputs).plan

    def _run_state(self, graph: Graph, outputs: Sequence[TensorRef | str] | None) -> _PlannedRun:
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphExecutor: graph must be a Graph, got {graph!r}")
        key = None if outputs is None else _output_names(outputs)
        with self._lock:
            cached = self._runs.get(graph, {}).get(key)
        if cached is not None and cached.plan.graph_version == graph.version:
            return cached
        from netcl.runtime.graph._plan import build_plan  # the planner loads with a first plan

        guard = guard_bytes if self._checked else None
        plan = build_plan(graph, key, self._alignment, self.pool.block_bytes, guard)
        run = _PlannedRun(plan, graph, self._queue.context, self._checked)
        tm.PLANS_BUILT.add(1)
        with self._lock:
            if (per_graph := self._runs.get(graph)) is None or any(
                r.plan.graph_version != graph.version for r in per_graph.values()
            ):
                per_graph = self._runs[graph] = {}
            per_graph[key] = run
        return run

    def _forget_views(self) -> None:
        with self._lock:
            runs = [r for per_graph in self._runs.values() for r in per_graph.values()]
        for r in runs:
            with r.lock:
                r.views = [{} for _ in r.views]

    @overload
    def run(self, graph: Graph, outputs: None = None) -> Tensor: ...
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
        result = self._traced(state) if telemetry.tracing() else self._execute(state, False)
        tm.RUN_DURATION.record(time.perf_counter() - t0)
        tm.NODES_EXECUTED.add(len(state.ops))
        return result[0] if outputs is None else result

    def _traced(self, state: _PlannedRun) -> list[Tensor]:
        with TEL.span(tm.RUN_SPAN, state.run_attrs) as span:
            try:
                return self._execute(state, True)
            except BaseException as exc:
                # the caller gets an error that wraps the op's own: the span reports the op's
                span.fail(exc.__cause__ if exc.__cause__ is not None else exc)
                raise

    def _execute(self, state: _PlannedRun, traced: bool) -> list[Tensor]:
        pool, queue, ooo = self.pool, self._queue, self._out_of_order
        collector, checked = self._collector, self._checked
        values = list(state.template)
        taken: list[Tensor | None] = [None] * len(state.blocks)
        ending: list[tuple[tuple[Tensor, Gone], ...]] = [()] * len(state.blocks)  # per view
        node, allocating, span = None, -1, telemetry.NO_SPAN
        # after the fn, spans, device time and checked mode share one flag (one test per op)
        hooked = traced or collector is not None or checked
        try:
            if ooo:
                cl.enqueue_barrier(queue)  # earlier users of these blocks finish first
            # a marker, or a plain queue's stamp on its side queue
            marker = collector.stamp(queue) if collector is not None else None
            # The one per-op loop: take the op's blocks, call its fn, release the blocks whose
            # last reader it was. Span and device-time work only behind `hooked`; no call or
            # loop for an op that takes or releases nothing (most of them).
            for node in state.ops:
                if traced:
                    span = TEL.span(tm.NODE_SPAN, node.attrs)
                if node.allocs:
                    for allocating in node.allocs:
                        self._take(state, allocating, taken, values, ending)
                    allocating = -1
                if checked:  # the output's guards, filled as its life starts (the bytes may
                    k, guard, _ = node.guard  # type: ignore[misc]  # have held dead values)
                    guard.fill(queue, taken[k].buffer)  # type: ignore[union-attr]
                ins = node.inputs
                # a one-element list directly: cheaper than a comprehension on Python < 3.12
                node.fn(
                    [values[ins[0]]] if len(ins) == 1 else [values[i] for i in ins],
                    values[node.slot],
                )
                if ooo:
                    cl.enqueue_barrier(queue)
                if hooked:
                    if checked:
                        k, guard, what = node.guard  # type: ignore[misc]
                        where = f"GraphExecutor.run: op {node.name!r}"
                        guard.check(queue, taken[k].buffer, where, what)  # type: ignore[union-attr]
                    if collector is not None and marker is not None:
                        # node k's device time: from the marker before it to one enqueued now
                        after = collector.stamp(queue)
                        collector.watch_markers(
                            "graph.node", marker, after, name=node.name, parent=span, queue=queue
                        )
                        marker = after
                    span.end()
                    span = telemetry.NO_SPAN
                if node.frees:
                    for k in node.frees:  # its intermediates end here: the views before another
                        for t, gone in ending[k]:  # run can take the block and give them back
                            t.revoke(gone)
                        block, taken[k] = taken[k], None
                        pool.release(block)  # type: ignore[arg-type]
                        if (ended := state.blocks[k].gone) is not None:  # after: the pool
                            block.revoke(ended)  # type: ignore[union-attr]  # takes its buffer
        except BaseException as exc:
            span.end(exc)  # the node span still open, if any
            self._give_back(state, taken, ending)
            if node is None or isinstance(exc, MemoryCheckError):
                raise  # nothing ran yet, or the error names the op already
            _raise_for_op(state, node, allocating, exc)
        for k in state.kept:  # the intermediates in outputs' blocks end with the run
            for t, gone in ending[k]:
                t.revoke(gone)
        return [values[i] for i in state.out_slots]

    def _give_back(
        self,
        state: _PlannedRun,
        taken: list[Tensor | None],
        ending: list[tuple[tuple[Tensor, Gone], ...]],
    ) -> None:
        """A failed run: give back every block it took. They are reused only by commands
        enqueued after these (in-order queue, or the barrier on an out-of-order one)."""
        if self._out_of_order:
            cl.enqueue_barrier(self._queue)
        held = [(k, t) for k, t in enumerate(taken) if t is not None]
        for k, _ in held:
            for t, gone in ending[k]:
                t.revoke(gone)
        try:
            self.pool.release_all([t for _, t in held])
        finally:
            for k, t in held:
                if (ended := state.blocks[k].gone) is not None:
                    t.revoke(ended)

    def _take(
        self,
        state: _PlannedRun,
        k: int,
        taken: list[Tensor | None],
        values: list[Any],
        ending: list[tuple[tuple[Tensor, Gone], ...]],
    ) -> None:
        """Allocate block ``k`` and put it (its owner's Tensor) and its views in the table."""
        spec = state.blocks[k]
        taken[k] = block = self.pool.allocate(spec.shape, spec.dtype, _nbytes=spec.nbytes)
        if spec.owner >= 0:
            values[spec.owner] = block
        if not spec.views:
            return
        # the views are made once per pool block (the pool hands the same block back run after
        # run) and kept until the pool frees its held blocks
        ptr = block.buffer.int_ptr
        if (views := state.views[k].get(ptr)) is None:
            # a Buffer of our own on the pooled block (PooledBuffer has no get_sub_region)
            base = cl.Buffer.from_int_ptr(ptr, retain=True)
            bufs = [base.get_sub_region(v.offset, v.size) for v in spec.views]
            tensors = tuple(
                Tensor(b, v.shape, v.dtype, self._queue)
                for b, v in zip(bufs, spec.views, strict=True)
            )
            views = _Views(
                tensors,
                tuple(zip(tensors, bufs, strict=True)),
                tuple(zip(tensors, spec.gones, strict=True)),
            )
            with state.lock:
                cache = state.views[k]
                if len(cache) >= _VIEW_CACHE:
                    cache.clear()
                cache[ptr] = views
        else:
            for t, buf in views.live:  # a run that ended took their buffers: back they go
                t.lend(buf)
        ending[k] = views.ended
        values[spec.first_view : spec.first_view + len(views.tensors)] = views.tensors

    def __repr__(self) -> str:
        return f"GraphExecutor(pool={self.pool!r}, alignment={self._alignment})"


def _graph_name(graph: Graph) -> str:
    """A short name of a graph for messages: its first op names (a repr lists all of them)."""
    names = [op.name for op in graph.ops[:3]]
    return f"Graph({len(graph)} ops: {', '.join(names)}{', ...' if len(graph) > 3 else ''})"


def _block_role(plan: GraphPlan, k: int) -> str:
    block = plan.blocks[k]
    held = [lt.name for lt in plan.lifetimes.values() if lt.block == k and lt.name != block.owner]
    also = f", also holding {', '.join(held)} before it" if held else ""
    if block.last is None:
        return f"the block of output {block.owner!r}{also}"
    return f"the block of {', '.join([block.owner] if block.owner else held)}"


def _output_names(outputs: Sequence[TensorRef | str]) -> tuple[str, ...]:
    """The op names ``outputs`` (TensorRefs or names) asks for: the key of a cached plan."""
    if isinstance(outputs, (str, TensorRef)) or not isinstance(outputs, Sequence):
        raise TypeError(
            f"GraphExecutor: outputs must be a sequence of TensorRef or op names, got {outputs!r}"
        )
    for i, o in enumerate(outputs):
        if not isinstance(o, (TensorRef, str)):
            raise TypeError(
                f"GraphExecutor: outputs[{i}] must be a TensorRef or an op name, got {o!r}"
            )
    return tuple(o.name if isinstance(o, TensorRef) else o for o in outputs)


def _raise_for_op(
    state: _PlannedRun, node: _ScheduledOp, allocating: int, exc: BaseException
) -> NoReturn:
    """Re-raise what op ``node`` raised as an error that names it (an allocation of its block
    that failed names the block); an interrupt (KeyboardInterrupt, SystemExit) goes on as it is."""
    if allocating >= 0 and isinstance(exc, MemoryError):
        raise MemoryError(
            f"GraphExecutor.run: op {node.name!r} needs a block of "
            f"{state.blocks[allocating].nbytes} bytes "
            f"({_block_role(state.plan, allocating)}) that cannot be allocated: {exc}"
        ) from exc
    if isinstance(exc, Exception):
        raise RuntimeError(
            f"GraphExecutor.run: op {node.name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    raise exc
