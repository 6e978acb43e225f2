"""From a Graph to an executable plan: checks, topological order, lifetimes, arena offsets."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core.tensor import Shape, Tensor
from netcl.runtime.graph._graph import Graph, Op, OpFn, TensorRef
from netcl.runtime.graph._planner import Interval, lower_bound, place

__all__ = ["GraphPlan", "Lifetime", "build_plan"]


@dataclass(frozen=True, slots=True)
class Lifetime:
    """Where and when one op's output lives.

    ``step`` is the op's position in the execution order, ``last_use`` the step of its last reader
    (``step`` when nothing reads it; the end of the run for outputs). ``size`` is ``nbytes``
    rounded up to the device's base-address alignment. ``offset`` is its place in the run's arena,
    None for outputs (their own pool blocks, owned by the caller).
    """

    name: str
    step: int
    last_use: int
    nbytes: int
    size: int
    offset: int | None

    @property
    def is_output(self) -> bool:
        return self.offset is None


@dataclass(frozen=True, slots=True)
class _Step:
    name: str
    fn: OpFn
    inputs: tuple[int, ...]  # slots of the run's value table
    slot: int
    output: bool
    shape: Shape
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class GraphPlan:
    """The plan of one graph for one set of outputs: made once, used by every run.

    Bytes are device bytes after alignment (see :class:`Lifetime`), so they compare directly:

    * ``arena_bytes``: the one pool block a run takes for all intermediates, at the offsets in
      ``lifetimes``; ``temp_lower_bound``: the most intermediate bytes alive at one step, the least
      any placement needs.
    * ``output_bytes``: the outputs' bytes (separate blocks the caller owns and releases).
    * ``peak_bytes`` = ``arena_bytes + output_bytes``: the most a run holds at once;
      ``lower_bound`` = ``temp_lower_bound + output_bytes``. ``peak_bytes == lower_bound`` means the
      placement is optimal.
    * ``pool_peak_bytes``: ``peak_bytes`` in the pool's block bytes (its size classes round a block
      up by at most 1/64): what ``BufferPool.stats.bytes_in_use`` grows by during a run.
    * ``no_reuse_bytes``: what a run would take with a buffer of its own for every op.
    """

    order: tuple[str, ...]
    outputs: tuple[str, ...]
    lifetimes: Mapping[str, Lifetime]
    alignment: int
    arena_bytes: int
    temp_lower_bound: int
    output_bytes: int
    lower_bound: int
    peak_bytes: int
    pool_peak_bytes: int
    no_reuse_bytes: int
    strategy: str
    graph_version: int
    _steps: tuple[_Step, ...] = field(repr=False, compare=False)
    _externals: tuple[Tensor, ...] = field(repr=False, compare=False)
    _out_slots: tuple[int, ...] = field(repr=False, compare=False)  # value slots of ``outputs``
    # (arena int_ptr, value table template) of the last arena seen: sub-buffers are made once
    # per arena block, and the pool hands the same block back run after run.
    _table: list[Any] = field(default_factory=lambda: [None], repr=False, compare=False)

    def describe(self) -> str:
        """A human-readable table of the plan: one line per op, in execution order."""
        rows = [
            f"plan: {len(self.order)} ops, peak {self.peak_bytes} B (lower bound "
            f"{self.lower_bound} B, no reuse {self.no_reuse_bytes} B), arena {self.arena_bytes} B "
            f"by {self.strategy}, alignment {self.alignment} B"
        ]
        for name in self.order:
            lt = self.lifetimes[name]
            where = "output" if lt.offset is None else f"arena@{lt.offset}"
            rows.append(
                f"  [{lt.step:>3}..{lt.last_use:>3}] {name}: {lt.nbytes} B ({lt.size} B) {where}"
            )
        return "\n".join(rows)


def _align(n: int, alignment: int) -> int:
    n = max(n, 1)  # OpenCL has no 0-byte buffers
    return -(-n // alignment) * alignment


def _topological_order(graph: Graph) -> list[Op]:
    """Kahn's algorithm, ties broken by insertion order (so an acyclic graph added in dependency
    order runs in that order). Raises ValueError naming the ops of a cycle."""
    ops = graph.ops
    by_name = {op.name: op for op in ops}
    indegree = {op.name: 0 for op in ops}
    users: dict[str, list[Op]] = {op.name: [] for op in ops}
    for op in ops:
        preds = {x.name for x in op.inputs if isinstance(x, TensorRef)}
        for pos, x in enumerate(op.inputs):
            if isinstance(x, TensorRef) and x.name not in by_name:
                raise ValueError(
                    f"graph op {op.name!r}: input {pos} refers to unknown op {x.name!r} "
                    f"(known ops: {', '.join(sorted(by_name)) or 'none'})"
                )
        indegree[op.name] = len(preds)
        for p in preds:
            users[p].append(op)
    ready = [(op.index, op.name) for op in ops if indegree[op.name] == 0]
    heapq.heapify(ready)
    order: list[Op] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(by_name[name])
        for user in users[name]:
            indegree[user.name] -= 1
            if indegree[user.name] == 0:
                heapq.heappush(ready, (user.index, user.name))
    if len(order) < len(ops):
        raise ValueError(f"graph has a cycle: {' -> '.join(_find_cycle(graph, indegree))}")
    return order


def _find_cycle(graph: Graph, indegree: Mapping[str, int]) -> list[str]:
    """One cycle among the ops Kahn's algorithm could not order (each has an unordered input)."""
    stuck = [op for op in graph.ops if indegree[op.name] > 0]
    seen: dict[str, int] = {}
    path: list[str] = []
    name = stuck[0].name
    while name not in seen:
        seen[name] = len(path)
        path.append(name)
        op = graph.op(name)
        # follow the first input that is itself stuck: one always exists
        name = next(
            x.name for x in op.inputs if isinstance(x, TensorRef) and indegree[x.name] > 0
        )
    cycle = path[seen[name] :]
    cycle.reverse()  # we walked from readers to producers; report in data-flow order
    return [*cycle, cycle[0]]


def build_plan(
    graph: Graph,
    outputs: Sequence[str] | None,
    alignment: int,
    block_bytes: Callable[[int], int],
    context: cl.Context,
) -> GraphPlan:
    """Check ``graph``, order it, work out lifetimes and place intermediates in one arena."""
    if len(graph) == 0:
        raise ValueError("GraphExecutor: the graph has no ops")
    order = _topological_order(graph)
    step_of = {op.name: i for i, op in enumerate(order)}
    if outputs is None:
        out_names: tuple[str, ...] = (order[-1].name,)
    else:
        out_names = tuple(outputs)
        for name in out_names:
            if name not in step_of:
                raise ValueError(
                    f"GraphExecutor: requested output {name!r} is not an op of the graph"
                )
        dup = {n for n in out_names if out_names.count(n) > 1}
        if dup:
            raise ValueError(f"GraphExecutor: output(s) {sorted(dup)} requested more than once")
        if not out_names:
            raise ValueError("GraphExecutor: outputs must name at least one op")
    is_out = set(out_names)
    last_step = len(order) - 1

    last_use = {op.name: i for i, op in enumerate(order)}
    externals: list[Tensor] = []
    ext_slot: dict[int, int] = {}
    for i, op in enumerate(order):
        for pos, x in enumerate(op.inputs):
            if isinstance(x, TensorRef):
                last_use[x.name] = max(last_use[x.name], i)
            elif id(x) not in ext_slot:
                if x.queue.context != context:
                    raise ValueError(
                        f"graph op {op.name!r}: input {pos} ({x!r}) lives in another OpenCL "
                        "context than the executor's pool"
                    )
                ext_slot[id(x)] = len(externals)
                externals.append(x)

    temps = [op for op in order if op.name not in is_out]
    intervals = [
        Interval(step_of[op.name], last_use[op.name], _align(op.nbytes, alignment))
        for op in temps
    ]
    placement = place(intervals)
    offset_of = {op.name: placement.offsets[k] for k, op in enumerate(temps)}

    lifetimes: dict[str, Lifetime] = {}
    for i, op in enumerate(order):
        out = op.name in is_out
        lifetimes[op.name] = Lifetime(
            op.name,
            i,
            last_step if out else last_use[op.name],
            op.nbytes,
            _align(op.nbytes, alignment),
            None if out else offset_of[op.name],
        )

    n_ext = len(externals)
    slot_of = {op.name: n_ext + i for i, op in enumerate(order)}
    steps = tuple(
        _Step(
            op.name,
            op.fn,
            tuple(
                slot_of[x.name] if isinstance(x, TensorRef) else ext_slot[id(x)]
                for x in op.inputs
            ),
            slot_of[op.name],
            op.name in is_out,
            op.shape,
            op.dtype,
        )
        for op in order
    )
    temp_lb = lower_bound(intervals)
    output_bytes = sum(lifetimes[n].size for n in out_names)
    pool_peak = (block_bytes(placement.arena_bytes) if placement.arena_bytes else 0) + sum(
        block_bytes(graph.op(n).nbytes) for n in out_names
    )
    return GraphPlan(
        order=tuple(op.name for op in order),
        outputs=out_names,
        lifetimes=MappingProxyType(lifetimes),
        alignment=alignment,
        arena_bytes=placement.arena_bytes,
        temp_lower_bound=temp_lb,
        output_bytes=output_bytes,
        lower_bound=temp_lb + output_bytes,
        peak_bytes=placement.arena_bytes + output_bytes,
        pool_peak_bytes=pool_peak,
        no_reuse_bytes=sum(lt.size for lt in lifetimes.values()),
        strategy=placement.strategy,
        graph_version=graph.version,
        _steps=steps,
        _externals=tuple(externals),
        _out_slots=tuple(slot_of[n] for n in out_names),
    )
