"""From a Graph to its plan: checks, the execution order (Kahn's algorithm, ties broken by
insertion order), lifetimes, and the memory layout the pool model finds cheapest."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from netcl.core.packing import Interval, dependency_order, lower_bound
from netcl.runtime.graph._graph import Graph, Op, TensorRef
from netcl.runtime.graph._layouts import Block, Values, choice_reason, rank_layouts

__all__ = ["Block", "GraphPlan", "Lifetime", "build_plan"]


@dataclass(frozen=True, slots=True)
class Lifetime:
    """Where and when one op's output lives: from ``step`` (the op's position in the execution
    order) to ``last_use`` (its last reader's; the last step for an output), in ``blocks[block]``
    of the plan at ``offset``. ``size`` is ``nbytes`` rounded up to the device's alignment."""

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

    ``lower_bound`` is the most aligned bytes alive at one step (an output alive from its step to
    the end of the run): no layout needs less. ``strategy`` is the layout whose run from an empty
    pool takes the fewest device bytes (``pool_device_bytes``; ``candidates`` has every layout's,
    ``strategy_reason`` says why). The package's guide describes every field.
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


def build_plan(
    graph: Graph,
    outputs: Sequence[str] | None,
    alignment: int,
    block_bytes: Callable[[int], int],
    guard: Callable[[int], int] | None = None,
) -> GraphPlan:
    """Check ``graph``, order it, work out lifetimes and choose the memory layout; with
    ``guard`` (checked mode: bytes of guard for a value of n bytes) each value takes room for
    its guards too (see ``padding``)."""
    if len(graph) == 0:
        raise ValueError("GraphExecutor: the graph has no ops")
    order = topological_order(graph)
    names = tuple(op.name for op in order)
    out_names = _check_outputs(names, outputs)
    index = {name: i for i, name in enumerate(names)}
    # each value is alive from its step to its last reader (an output to the end of the run)
    last_use = list(range(len(order)))
    for i, op in enumerate(order):
        for x in op.inputs:
            if isinstance(x, TensorRef):
                last_use[index[x.name]] = i  # readers come later in the order: the last wins
    for name in out_names:
        last_use[index[name]] = len(order) - 1
    is_out = set(out_names)
    items = tuple(
        Interval(i, last_use[i], padding(op.nbytes, op.name in is_out, alignment, guard)[1])
        for i, op in enumerate(order)
    )
    # a few sizes, asked for again and again
    values = Values(names, items, out_names, alignment, functools.cache(block_bytes), index)
    ranked = rank_layouts(values)
    best = ranked[0]
    lifetimes = {  # a spot is (block, offset), as a Lifetime's fields after its size
        op.name: Lifetime(op.name, it.first, it.last, op.nbytes, it.size, *spot, op.name in is_out)
        for op, it, spot in zip(order, items, best.where, strict=True)
    }
    temp_lb = lower_bound([it for it, name in zip(items, names, strict=True) if name not in is_out])
    output_bytes = sum(items[index[n]].size for n in out_names)
    return GraphPlan(
        order=names,
        outputs=out_names,
        lifetimes=MappingProxyType(lifetimes),
        blocks=best.blocks,
        alignment=alignment,
        lower_bound=lower_bound(items),
        temp_lower_bound=temp_lb,
        output_bytes=output_bytes,
        lower_bound_outputs_whole_run=temp_lb + output_bytes,
        arena_bytes=sum(b.size for b in best.blocks if b.owner is None),
        peak_bytes=best.peak,
        pool_peak_bytes=best.pool_peak,
        pool_device_bytes=best.device_bytes,
        output_block_bytes=best.caller_bytes,
        no_reuse_bytes=sum(it.size for it in items),
        strategy=best.strategy,
        strategy_reason=choice_reason(ranked),
        candidates=MappingProxyType({c.strategy: c.device_bytes for c in ranked}),
        graph_version=graph.version,
    )


def padding(
    nbytes: int, is_output: bool, alignment: int, guard: Callable[[int], int] | None
) -> tuple[int, int]:
    """(guard bytes before the value, bytes its lifetime takes): its size aligned, at least one
    unit (OpenCL has no 0-byte buffers); in checked mode room for ``guard(nbytes)`` bytes after
    it, and as many before it unless it is an output (which starts its block)."""

    def aligned(n: int) -> int:
        return -(-max(n, 1) // alignment) * alignment

    if guard is None:
        return 0, aligned(nbytes)
    before = 0 if is_output else aligned(guard(nbytes))
    return before, before + aligned(nbytes + guard(nbytes))


def topological_order(graph: Graph) -> list[Op]:
    """The ops in execution order (an acyclic graph added in dependency order runs in that
    order). Raises ValueError naming an input ref to an unknown op, or the ops of a cycle."""
    ops = graph.ops
    position = {op.name: k for k, op in enumerate(ops)}  # = op.index: ties go by insertion
    for op in ops:
        for pos, x in enumerate(op.inputs):
            if isinstance(x, TensorRef) and x.name not in position:
                raise ValueError(
                    f"graph op {op.name!r}: input {pos} refers to unknown op {x.name!r} "
                    f"(known ops: {', '.join(sorted(position)) or 'none'})"
                )
    order, cycle = dependency_order(
        [[position[x.name] for x in op.inputs if isinstance(x, TensorRef)] for op in ops]
    )
    if cycle:  # in data-flow order
        names = " -> ".join(ops[k].name for k in [*cycle, cycle[0]])
        raise ValueError(f"graph has a cycle: {names}")
    return [ops[k] for k in order]


def _check_outputs(names: Sequence[str], outputs: Sequence[str] | None) -> tuple[str, ...]:
    """The outputs to return (the last op's by default), checked against the graph's ops."""
    if outputs is None:
        return (names[-1],)
    wanted = tuple(outputs)
    known = set(names)
    for name in wanted:
        if name not in known:
            raise ValueError(f"GraphExecutor: requested output {name!r} is not an op of the graph")
    if dup := {n for n, times in Counter(wanted).items() if times > 1}:
        raise ValueError(f"GraphExecutor: output(s) {sorted(dup)} requested more than once")
    if not wanted:
        raise ValueError("GraphExecutor: outputs must name at least one op")
    return wanted
