"""From a Graph to an executable plan: checks, topological order, lifetimes, and the memory layout
the pool model finds cheapest among the strategies."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import pyopencl as cl

from netcl.core.tensor import Tensor
from netcl.runtime.graph._graph import Graph, Op, TensorRef
from netcl.runtime.graph._layouts import Values
from netcl.runtime.graph._order import topological_order
from netcl.runtime.graph._packing import Interval, lower_bound
from netcl.runtime.graph._pool_model import Block, describe_choice, rank_layouts
from netcl.runtime.graph._schedule import Schedule, make_schedule

__all__ = ["Block", "GraphPlan", "Lifetime", "build_plan"]


@dataclass(frozen=True, slots=True)
class Lifetime:
    """Where and when one op's output lives.

    ``step`` is the op's position in the execution order, ``last_use`` the step of its last reader
    (``step`` when nothing reads it; the last step for outputs). ``size`` is ``nbytes`` rounded up
    to the device's base-address alignment. The value lives in pool block ``block`` of the plan
    at byte ``offset``; an output is always at offset 0 of its own block, which the caller gets.
    """

    name: str
    step: int
    last_use: int
    nbytes: int
    size: int
    block: int
    offset: int
    is_output: bool



@dataclass(frozen=True)
class GraphPlan:
    """The plan of one graph for one set of outputs: made once, used by every run (read-only).

    * ``lower_bound``: the most bytes alive at one step of the execution order, where an
      intermediate lives from the step that produces it to its last reader and an output from
      the step that produces it to the end of the run (aligned bytes). No layout needs less.
    * ``peak_bytes``: the most aligned bytes the run's blocks hold at once.
    * ``pool_peak_bytes``: the same in the pool's block bytes: what ``BufferPool.stats``'s
      ``peak_bytes`` reaches during a run from an idle pool.
    * ``pool_device_bytes``: device bytes the pool takes for one run from an empty pool (blocks
      in use plus the released ones it holds, which it reuses only within a size class). The
      ``strategy`` is the layout with the least of these (``strategy_reason`` says why;
      ``candidates`` lists every strategy's figure).
    * ``output_block_bytes``: pool bytes of the outputs' blocks, which the caller holds after a
      run (more than the outputs' own bytes when a block also held intermediates before).
    * ``temp_lower_bound``: the most intermediate bytes alive at one step;
      ``lower_bound_outputs_whole_run`` = ``temp_lower_bound + output_bytes``: the bound when
      every output is counted as alive for the whole run (the figure older versions called
      the lower bound). ``arena_bytes``: aligned bytes of the blocks that hold only
      intermediates. ``no_reuse_bytes``: a buffer of its own for every op.
    """

    order: tuple[str, ...]
    outputs: tuple[str, ...]
    lifetimes: Mapping[str, Lifetime]
    blocks: tuple[Block, ...]
    alignment: int
    lower_bound: int
    temp_lower_bound: int
    output_bytes: int
    lower_bound_outputs_whole_run: int
    arena_bytes: int
    peak_bytes: int
    pool_peak_bytes: int
    pool_device_bytes: int
    output_block_bytes: int
    no_reuse_bytes: int
    strategy: str
    strategy_reason: str
    candidates: Mapping[str, int]
    graph_version: int

    def describe(self) -> str:
        """A human-readable table of the plan: the strategy, its figures, one line per op."""
        rows = [
            f"plan: {len(self.order)} ops, {len(self.blocks)} pool block(s), strategy "
            f"{self.strategy}",
            f"  why: {self.strategy_reason}",
            f"  pool peak {self.pool_peak_bytes} B, device {self.pool_device_bytes} B, lower "
            f"bound {self.lower_bound} B (ratio {self.pool_device_bytes / self.lower_bound:.3f}); "
            f"no reuse {self.no_reuse_bytes} B; outputs held after the run "
            f"{self.output_block_bytes} B; alignment {self.alignment} B",
        ]
        for k, b in enumerate(self.blocks):
            until = "caller" if b.last is None else f"{b.last:>3}"
            kind = f"output {b.owner}" if b.last is None else (b.owner or "intermediates")
            rows.append(f"  block {k}: {b.nbytes} B [{b.first:>3}..{until}] {kind}")
        for name in self.order:
            lt = self.lifetimes[name]
            tag = " (output)" if lt.is_output else ""
            rows.append(
                f"  [{lt.step:>3}..{lt.last_use:>3}] {name}: {lt.nbytes} B ({lt.size} B) "
                f"block {lt.block}@{lt.offset}{tag}"
            )
        return "\n".join(rows)


def _align(n: int, alignment: int) -> int:
    n = max(n, 1)  # OpenCL has no 0-byte buffers
    return -(-n // alignment) * alignment


def build_plan(
    graph: Graph,
    outputs: Sequence[str] | None,
    alignment: int,
    block_bytes: Callable[[int], int],
    context: cl.Context,
) -> tuple[GraphPlan, Schedule]:
    """Check ``graph``, order it, work out lifetimes and choose the memory layout."""
    if len(graph) == 0:
        raise ValueError("GraphExecutor: the graph has no ops")
    order = topological_order(graph)
    out_names = _output_names(order, outputs)
    externals, ext_slot = _externals(order, context)
    values = Values(
        tuple(op.name for op in order),
        tuple(_intervals(order, out_names, alignment)),
        out_names,
        alignment,
        functools.cache(block_bytes),  # a few sizes, asked for again and again
        {op.name: i for i, op in enumerate(order)},
    )
    plan = _plan(graph, order, values)
    return plan, make_schedule(order, plan, ext_slot, externals)


def _output_names(order: Sequence[Op], outputs: Sequence[str] | None) -> tuple[str, ...]:
    if outputs is None:
        return (order[-1].name,)
    names = tuple(outputs)
    known = {op.name for op in order}
    for name in names:
        if name not in known:
            raise ValueError(f"GraphExecutor: requested output {name!r} is not an op of the graph")
    dup = {n for n, times in Counter(names).items() if times > 1}
    if dup:
        raise ValueError(f"GraphExecutor: output(s) {sorted(dup)} requested more than once")
    if not names:
        raise ValueError("GraphExecutor: outputs must name at least one op")
    return names


def _externals(order: Sequence[Op], context: cl.Context) -> tuple[list[Tensor], dict[int, int]]:
    """The external input Tensors in order of first use, and their slots by ``id``."""
    externals: list[Tensor] = []
    ext_slot: dict[int, int] = {}
    for op in order:
        for pos, x in enumerate(op.inputs):
            if not isinstance(x, TensorRef) and id(x) not in ext_slot:
                if x.queue.context != context:
                    raise ValueError(
                        f"graph op {op.name!r}: input {pos} ({x!r}) lives in another OpenCL "
                        "context than the executor's pool"
                    )
                ext_slot[id(x)] = len(externals)
                externals.append(x)
    return externals, ext_slot


def _intervals(order: Sequence[Op], outputs: Sequence[str], alignment: int) -> list[Interval]:
    """Per op (execution order): alive from its step to its last reader (outputs to the end),
    its size aligned."""
    step_of = {op.name: i for i, op in enumerate(order)}
    last_use = list(range(len(order)))
    for i, op in enumerate(order):
        for x in op.inputs:
            if isinstance(x, TensorRef):
                k = step_of[x.name]
                last_use[k] = max(last_use[k], i)
    for name in outputs:
        last_use[step_of[name]] = len(order) - 1
    return [
        Interval(i, last_use[i], _align(op.nbytes, alignment)) for i, op in enumerate(order)
    ]


def _plan(graph: Graph, order: Sequence[Op], values: Values) -> GraphPlan:
    ranked = rank_layouts(values)
    best = ranked[0]
    blocks = best.blocks()
    items = values.items
    is_out = set(values.outputs)
    lifetimes = MappingProxyType(
        {
            op.name: Lifetime(op.name, it.first, it.last, op.nbytes, it.size, *where,
                              op.name in is_out)
            for op, it, where in zip(order, items, best.layout.where, strict=True)
        }
    )  # fmt: skip
    temps = [it for it, name in zip(items, values.names, strict=True) if name not in is_out]
    temp_lb = lower_bound(temps)
    output_bytes = sum(items[values.index[n]].size for n in values.outputs)
    return GraphPlan(
        order=values.names,
        outputs=values.outputs,
        lifetimes=lifetimes,
        blocks=blocks,
        alignment=values.alignment,
        lower_bound=lower_bound(items),
        temp_lower_bound=temp_lb,
        output_bytes=output_bytes,
        lower_bound_outputs_whole_run=temp_lb + output_bytes,
        arena_bytes=sum(b.size for b in blocks if b.owner is None),
        peak_bytes=best.peak,
        pool_peak_bytes=best.pool_peak,
        pool_device_bytes=best.device_bytes,
        output_block_bytes=best.caller_bytes,
        no_reuse_bytes=sum(it.size for it in items),
        strategy=best.name,
        strategy_reason=describe_choice(ranked),
        candidates=MappingProxyType({c.name: c.device_bytes for c in ranked}),
        graph_version=graph.version,
    )
