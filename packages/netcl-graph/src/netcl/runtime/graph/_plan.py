"""From a Graph to an executable plan: checks, topological order, lifetimes, and a memory layout
chosen among several strategies by simulating each against the pool's size classes."""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core.tensor import Shape, Tensor
from netcl.runtime.graph._graph import Graph, Op, OpFn, TensorRef
from netcl.runtime.graph._planner import Interval, lower_bound, place

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


@dataclass(frozen=True, slots=True)
class Block:
    """One pool block a run takes: ``nbytes`` (a pool size class) allocated before step
    ``first`` runs and released after step ``last``; ``last`` is None for an output's block,
    which is handed to the caller. ``owner`` is the op whose output Tensor the block is (None:
    a block that only holds views of intermediates)."""

    nbytes: int
    size: int  # aligned bytes its values need (nbytes is this in the pool's size class)
    first: int
    last: int | None
    owner: str | None


@dataclass(frozen=True, slots=True)
class _Candidate:
    name: str
    blocks: tuple[Block, ...]
    where: Mapping[str, tuple[int, int]]  # value -> (block, offset)
    device_bytes: int
    pool_peak: int
    peak: int
    caller_bytes: int


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


@dataclass(frozen=True, slots=True)
class _Step:
    name: str
    fn: OpFn
    inputs: tuple[int, ...]  # slots of the run's value table
    slot: int
    allocs: tuple[int, ...]  # blocks to allocate before the op runs
    frees: tuple[int, ...]  # blocks to release after it
    attrs: Mapping[str, Any]  # attributes of its span


@dataclass(frozen=True, slots=True)
class _BlockSpec:
    nbytes: int
    shape: Shape  # of the Tensor the pool hands out: the owner's, or (nbytes,) uint8
    dtype: np.dtype[Any]
    owner: int  # value slot of the owning output, -1 for a block of intermediates
    views: tuple[tuple[int, int, int, Shape, np.dtype[Any]], ...]  # (slot, offset, size, ...)


@dataclass(frozen=True, slots=True)
class Schedule:
    """What a run executes (private to the executor; immutable)."""

    steps: tuple[_Step, ...]
    blocks: tuple[_BlockSpec, ...]
    template: tuple[Any, ...]  # the value table: external inputs, then a slot per op
    out_slots: tuple[int, ...]


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
) -> tuple[GraphPlan, Schedule]:
    """Check ``graph``, order it, work out lifetimes and choose the memory layout."""
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
    n_steps = len(order)

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
    for name in out_names:
        last_use[name] = n_steps - 1
    items = {
        op.name: Interval(step_of[op.name], last_use[op.name], _align(op.nbytes, alignment))
        for op in order
    }
    best, ranked = _choose(order, out_names, items, alignment, block_bytes, n_steps)

    lifetimes = MappingProxyType(
        {
            op.name: Lifetime(
                op.name,
                step_of[op.name],
                last_use[op.name],
                op.nbytes,
                items[op.name].size,
                *best.where[op.name],
                op.name in is_out,
            )
            for op in order
        }
    )
    temps = [items[op.name] for op in order if op.name not in is_out]
    temp_lb = lower_bound(temps)
    output_bytes = sum(items[n].size for n in out_names)
    others = ", ".join(f"{c.name} {c.device_bytes} B" for c in ranked[1:])
    reason = (
        f"least device memory for a run from an empty pool ({best.device_bytes} B"
        + (f"; {others}" if others else "")
        + ")"
    )
    if len(ranked) > 1 and ranked[1].device_bytes == best.device_bytes:
        reason += (
            f"; tie with {ranked[1].name} broken by bytes left with the caller, then pool peak, "
            "then fewer blocks"
        )
    plan = GraphPlan(
        order=tuple(op.name for op in order),
        outputs=out_names,
        lifetimes=lifetimes,
        blocks=best.blocks,
        alignment=alignment,
        lower_bound=lower_bound(list(items.values())),
        temp_lower_bound=temp_lb,
        output_bytes=output_bytes,
        lower_bound_outputs_whole_run=temp_lb + output_bytes,
        arena_bytes=sum(b.size for b in best.blocks if b.owner is None),
        peak_bytes=best.peak,
        pool_peak_bytes=best.pool_peak,
        pool_device_bytes=best.device_bytes,
        output_block_bytes=best.caller_bytes,
        no_reuse_bytes=sum(it.size for it in items.values()),
        strategy=best.name,
        strategy_reason=reason,
        candidates=MappingProxyType({c.name: c.device_bytes for c in ranked}),
        graph_version=graph.version,
    )
    return plan, _schedule(order, plan, ext_slot, externals)


def _schedule(
    order: Sequence[Op], plan: GraphPlan, ext_slot: Mapping[int, int], externals: list[Tensor]
) -> Schedule:
    n_ext = len(externals)
    slot_of = {op.name: n_ext + i for i, op in enumerate(order)}
    views: list[list[tuple[int, int, int, Shape, np.dtype[Any]]]] = [[] for _ in plan.blocks]
    for op in order:
        lt = plan.lifetimes[op.name]
        if plan.blocks[lt.block].owner != op.name:
            views[lt.block].append((slot_of[op.name], lt.offset, lt.size, op.shape, op.dtype))
    specs = []
    for k, b in enumerate(plan.blocks):
        if b.owner is None:
            shape: Shape = (b.nbytes,)
            dtype = np.dtype(np.uint8)
            owner = -1
        else:
            op = next(o for o in order if o.name == b.owner)
            shape, dtype, owner = op.shape, op.dtype, slot_of[op.name]
        specs.append(_BlockSpec(b.nbytes, shape, dtype, owner, tuple(views[k])))
    steps = tuple(
        _Step(
            op.name,
            op.fn,
            tuple(
                slot_of[x.name] if isinstance(x, TensorRef) else ext_slot[id(x)]
                for x in op.inputs
            ),
            slot_of[op.name],
            tuple(k for k, b in enumerate(plan.blocks) if b.first == i),
            tuple(k for k, b in enumerate(plan.blocks) if b.last == i),
            MappingProxyType(
                {
                    "netcl.node.name": op.name,
                    "netcl.node.shape": op.shape,
                    "netcl.node.dtype": op.dtype.name,
                }
            ),
        )
        for i, op in enumerate(order)
    )
    return Schedule(
        steps,
        tuple(specs),
        (*externals, *([None] * len(order))),
        tuple(slot_of[n] for n in plan.outputs),
    )


# ------------------------------------------------------------------------------- strategies


def _choose(
    order: Sequence[Op],
    outputs: tuple[str, ...],
    items: Mapping[str, Interval],
    alignment: int,
    block_bytes: Callable[[int], int],
    n_steps: int,
) -> tuple[_Candidate, list[_Candidate]]:
    """Build every strategy's layout, simulate each against the pool, best first."""
    names = [op.name for op in order]
    temps = [n for n in names if n not in outputs]
    # a layout: (strategy, blocks as (bytes to ask for at least, owner, handed to the caller),
    # value -> (block, offset))
    layouts: list[tuple[str, list[tuple[int, str | None, bool]], dict[str, tuple[int, int]]]]
    layouts = []

    def cap(n: str) -> int:
        # an output's block: its size class, rounded down to the alignment (at least its size)
        return block_bytes(items[n].size) // alignment * alignment

    # 1. one arena for the intermediates, a block of its own for each output
    placement = place([items[n] for n in temps])
    blocks: list[tuple[int, str | None, bool]] = [(0, n, True) for n in outputs]
    where = {n: (k, 0) for k, n in enumerate(outputs)}
    if temps:
        where.update({n: (len(blocks), placement.offsets[k]) for k, n in enumerate(temps)})
        blocks.append((0, None, False))
    layouts.append(("arena", blocks, where))

    # 2. the same, but intermediates that die before an output is written may use its block
    bases, base = [], 0
    for n in outputs:
        bases.append(base)
        base += cap(n)
    index = {n: k for k, n in enumerate(names)}
    all_items = [items[n] for n in names]
    fixed = {index[n]: b for n, b in zip(outputs, bases, strict=True)}
    shared = place(all_items, fixed, [*bases[1:], base])
    blocks = [(0, n, True) for n in outputs]
    where = {}
    arena_end = 0
    for n in names:
        off = shared.offsets[index[n]]
        if off < base:
            k = bisect.bisect_right(bases, off) - 1
            where[n] = (k, off - bases[k])
        else:
            where[n] = (len(outputs), off - base)
            arena_end = max(arena_end, off - base + items[n].size)
    if arena_end:
        blocks.append((0, None, False))
    layouts.append(("arena_in_output_blocks", blocks, where))

    # 3. plain refcounting: a block per value, released after its last reader
    layouts.append(
        (
            "block_per_tensor",
            [(0, n, n in outputs) for n in names],
            {n: (k, 0) for k, n in enumerate(names)},
        )
    )
    # 3b. the same, but a value takes the smallest free block of a larger size class when there
    # is one (the pool reuses blocks within a size class only, so it asks for that class)
    asks = _best_fit(names, items, block_bytes)
    layouts.append(
        (
            "block_per_tensor_best_fit",
            [(r, n, n in outputs) for n, r in zip(names, asks, strict=True)],
            {n: (k, 0) for k, n in enumerate(names)},
        )
    )

    # 4. everything packed as one region, then cut at the outputs' offsets: a block per output,
    # starting with it (one block for a single output)
    free = place(all_items)
    outs = [index[n] for n in outputs]
    tries = [(free.arena_bytes, _cut_at_outputs(free.offsets, all_items, outs, free.arena_bytes))]
    if tries[0][1] is None:
        # keep the outputs where they are and place the rest again, crossing no cut
        at = {o: free.offsets[o] for o in outs}
        again = place(all_items, at, sorted(at.values()))
        tries.append(
            (again.arena_bytes, _cut_at_outputs(again.offsets, all_items, outs, again.arena_bytes))
        )
    if len(outputs) == 1:
        pinned = place(all_items, {outs[0]: 0})
        tries.append((pinned.arena_bytes, [(0, o) for o in pinned.offsets]))
    valid = [(size, c) for size, c in tries if c is not None]
    cut = min(valid, key=lambda t: t[0])[1] if valid else None
    if cut is not None:
        layouts.append(
            (
                "one_block" if len(outputs) == 1 else "block_per_output",
                [(0, n, True) for n in sorted(outputs, key=lambda n: cut[index[n]][0])],
                {n: cut[index[n]] for n in names},
            )
        )

    ranked = sorted(
        (
            _simulate(name, raw, where, items, names, block_bytes, n_steps)
            for name, raw, where in layouts
        ),
        key=lambda c: (c.device_bytes, c.caller_bytes, c.pool_peak, len(c.blocks)),
    )
    return ranked[0], ranked


def _best_fit(
    names: Sequence[str], items: Mapping[str, Interval], block_bytes: Callable[[int], int]
) -> list[int]:
    """Per value (in execution order), the pool bytes to ask for: the smallest size class among
    the blocks released before it is produced that fits it, else its own."""
    free: list[int] = []  # sorted size classes of released blocks
    ask: list[int] = []
    ends: list[tuple[int, int]] = []  # (last step, class) of live blocks
    for n in names:
        it = items[n]
        for end in [e for e in ends if e[0] < it.first]:
            ends.remove(end)
            bisect.insort(free, end[1])
        own = block_bytes(it.size)
        k = bisect.bisect_left(free, own)
        cls = free.pop(k) if k < len(free) else own
        ask.append(cls)
        ends.append((it.last, cls))
    return ask


def _cut_at_outputs(
    offsets: Sequence[int], items: Sequence[Interval], outs: Sequence[int], size: int
) -> list[tuple[int, int]] | None:
    """Split a placement of ``size`` bytes into blocks that each start with an output: cut at
    every output's offset and rotate so the lowest output starts the first block (values below
    it join the last block). Also tried mirrored. Per item: (block, offset in it); None when a
    value crosses a cut in both."""
    mirrored = [size - o - it.size for o, it in zip(offsets, items, strict=True)]
    for offs in (offsets, mirrored):
        cuts = sorted(offs[o] for o in outs)
        if any(o < c < o + it.size for c in cuts for o, it in zip(offs, items, strict=True)):
            continue
        first = cuts[0]
        starts = [c - first for c in cuts]
        placed = []
        for o in offs:
            r = o - first if o >= first else o + size - first
            k = bisect.bisect_right(starts, r) - 1
            placed.append((k, r - starts[k]))
        return placed
    return None


def _simulate(
    name: str,
    raw: list[tuple[int, str | None, bool]],
    where: Mapping[str, tuple[int, int]],
    items: Mapping[str, Interval],
    names: Sequence[str],
    block_bytes: Callable[[int], int],
    n_steps: int,
) -> _Candidate:
    """Give each raw block its lifetime (from its values) and run it through a model of the
    pool: blocks released go to a free list per size class and are reused within it only."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    need: dict[int, int] = {}  # the bytes a block's values really use (no more is asked for)
    for n in names:
        k, off = where[n]
        it = items[n]
        first[k] = min(first.get(k, n_steps), it.first)
        last[k] = max(last.get(k, -1), it.last)
        need[k] = max(need.get(k, 0), off + it.size)
    blocks = tuple(
        Block(
            block_bytes(max(need[k], ask)), need[k], first[k], None if keep else last[k], owner
        )
        for k, (ask, owner, keep) in enumerate(raw)
    )
    held: Counter[int] = Counter()
    device = in_use = pool_peak = aligned = peak = 0
    for step in range(n_steps):
        for b in blocks:
            if b.first == step:
                if held[b.nbytes]:
                    held[b.nbytes] -= 1
                else:
                    device += b.nbytes
                in_use += b.nbytes
                aligned += b.size
        pool_peak = max(pool_peak, in_use)
        peak = max(peak, aligned)
        for b in blocks:
            if b.last == step:
                held[b.nbytes] += 1
                in_use -= b.nbytes
                aligned -= b.size
    caller = sum(b.nbytes for b in blocks if b.last is None)
    return _Candidate(name, blocks, where, device, pool_peak, peak, caller)
