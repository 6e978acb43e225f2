"""Memory layouts and the choice among them: each strategy puts every value of a plan in a pool
block at an offset; each layout is run through a model of the pool (a released block goes to a
free list of its size class and is reused within that class only), and the one that takes the
least device memory from an empty pool wins. The strategies are described in the guide."""

from __future__ import annotations

import bisect
import functools
import heapq
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from netcl.core.packing import Interval, place

__all__ = ["Block", "Candidate", "Spot", "Values", "choice_reason", "rank_layouts"]


@dataclass(frozen=True, slots=True)
class Values:
    """What a layout places: every op's value in execution order, with its lifetime and
    aligned size (``items``), the outputs, and the pool's size classes (``block_bytes``)."""

    names: tuple[str, ...]
    items: tuple[Interval, ...]
    outputs: tuple[str, ...]
    alignment: int
    block_bytes: Callable[[int], int]
    index: Mapping[str, int]  # name -> position in names


class Spot(NamedTuple):
    """Where a value sits: block ``block`` of its layout, at byte ``offset``."""

    block: int
    offset: int


class _RawBlock(NamedTuple):
    """A block before it is simulated: its lifetime and size come from the values in it."""

    ask: int  # bytes to ask the pool for at least (0: what its values need)
    owner: str | None  # the op whose Tensor the block is (None: intermediates only); an output's
    # block is handed to the caller after the run


class _Layout(NamedTuple):
    """One strategy's answer: its blocks and where each value (execution order) sits."""

    strategy: str
    blocks: tuple[_RawBlock, ...]
    where: tuple[Spot, ...]


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
class Candidate:
    """A layout, its blocks, and what the pool model says it costs."""

    strategy: str
    where: tuple[Spot, ...]
    blocks: tuple[Block, ...]
    device_bytes: int  # taken from an empty pool: blocks in use plus those it holds
    pool_peak: int  # pool bytes in use at once
    peak: int  # aligned bytes in use at once
    caller_bytes: int  # pool bytes of the blocks handed to the caller


def _arena(v: Values) -> _Layout:
    """One arena for the intermediates, a block of its own for each output."""
    outs = set(v.outputs)
    temps = [k for k, n in enumerate(v.names) if n not in outs]
    blocks = [_RawBlock(0, n) for n in v.outputs]
    where = [Spot(0, 0)] * len(v.names)
    for b, n in enumerate(v.outputs):
        where[v.index[n]] = Spot(b, 0)
    for k, off in zip(temps, place([v.items[t] for t in temps]).offsets, strict=True):
        where[k] = Spot(len(blocks), off)
    if temps:
        blocks.append(_RawBlock(0, None))
    return _Layout("arena", tuple(blocks), tuple(where))


def _arena_in_output_blocks(v: Values) -> _Layout:
    """The arena, but intermediates that die before an output is written may use its block:
    the output blocks are laid out one after the other, the arena after them."""
    bases, base = [], 0
    for n in v.outputs:
        bases.append(base)
        # the bytes the output's block offers: its size class, rounded down to the alignment
        base += v.block_bytes(v.items[v.index[n]].size) // v.alignment * v.alignment
    fixed = {v.index[n]: b for n, b in zip(v.outputs, bases, strict=True)}
    where = []
    for off in place(v.items, fixed, [*bases[1:], base]).offsets:
        if off < base:
            k = bisect.bisect_right(bases, off) - 1
            where.append(Spot(k, off - bases[k]))
        else:
            where.append(Spot(len(v.outputs), off - base))
    blocks = [_RawBlock(0, n) for n in v.outputs]
    if any(s.block == len(v.outputs) for s in where):
        blocks.append(_RawBlock(0, None))
    return _Layout("arena_in_output_blocks", tuple(blocks), tuple(where))


def _block_per_tensor(v: Values, best_fit: bool = False) -> _Layout:
    """Plain refcounting: a block per value, released after its last reader. With ``best_fit``
    a value asks for the smallest size class among the blocks released before it is produced
    that fits it (the pool reuses blocks within a size class only)."""
    free: list[int] = []  # sorted size classes of released blocks
    live: list[tuple[int, int]] = []  # heap of (last step, size class) of blocks in use
    blocks = []
    for name, it in zip(v.names, v.items, strict=True):
        ask = 0
        if best_fit:
            while live and live[0][0] < it.first:
                bisect.insort(free, heapq.heappop(live)[1])
            own = v.block_bytes(it.size)
            k = bisect.bisect_left(free, own)
            ask = free.pop(k) if k < len(free) else own
            heapq.heappush(live, (it.last, ask))
        blocks.append(_RawBlock(ask, name))
    name = "block_per_tensor_best_fit" if best_fit else "block_per_tensor"
    return _Layout(name, tuple(blocks), tuple(Spot(k, 0) for k in range(len(blocks))))


def _one_region(v: Values) -> _Layout | None:
    """Everything packed as one region, then cut at the outputs' offsets: a block per output,
    starting with it (one block for a single output). None when no cut works."""
    items = v.items
    outs = [v.index[n] for n in v.outputs]
    free = place(items)
    size = free.arena_bytes
    if (cut := _cut_at_outputs(free.offsets, items, outs, size)) is None:
        # keep the outputs where they are and place the rest again, crossing no cut
        at = {o: free.offsets[o] for o in outs}
        again = place(items, at, sorted(at.values()))
        size = again.arena_bytes
        cut = _cut_at_outputs(again.offsets, items, outs, size)
    if len(outs) == 1:
        pinned = place(items, {outs[0]: 0})
        if cut is None or pinned.arena_bytes < size:
            cut = [Spot(0, o) for o in pinned.offsets]
    if cut is None:
        return None
    by_block = sorted(v.outputs, key=lambda n: cut[v.index[n]].block)
    name = "one_block" if len(outs) == 1 else "block_per_output"
    return _Layout(name, tuple(_RawBlock(0, n) for n in by_block), tuple(cut))


def _cut_at_outputs(
    offsets: Sequence[int], items: Sequence[Interval], outs: Sequence[int], size: int
) -> list[Spot] | None:
    """Split a placement of ``size`` bytes into blocks that each start with an output: cut at
    every output's offset and rotate so the lowest output starts the first block (values below
    it join the last block). Also tried mirrored. None when a value crosses a cut in both."""
    mirrored = [size - o - it.size for o, it in zip(offsets, items, strict=True)]
    for offs in (offsets, mirrored):
        cuts = sorted(offs[o] for o in outs)
        if any(_crosses(cuts, o, it.size) for o, it in zip(offs, items, strict=True)):
            continue
        first = cuts[0]
        starts = [c - first for c in cuts]
        placed = []
        for o in offs:
            r = o - first if o >= first else o + size - first
            k = bisect.bisect_right(starts, r) - 1
            placed.append(Spot(k, r - starts[k]))
        return placed
    return None


def _crosses(cuts: Sequence[int], offset: int, size: int) -> bool:
    """Whether a cut (sorted offsets) lies strictly inside ``[offset, offset + size)``."""
    k = bisect.bisect_right(cuts, offset)
    return k < len(cuts) and cuts[k] < offset + size


#: Every strategy, in the order ties are resolved (the first of equals wins).
_STRATEGIES: tuple[Callable[[Values], _Layout | None], ...] = (
    _arena,
    _arena_in_output_blocks,
    _block_per_tensor,
    functools.partial(_block_per_tensor, best_fit=True),
    _one_region,
)


def rank_layouts(values: Values) -> list[Candidate]:
    """Every strategy's layout, simulated, best first: least device memory, then fewest bytes
    left with the caller, then lower pool peak, then fewer blocks."""
    layouts = [layout for strategy in _STRATEGIES if (layout := strategy(values)) is not None]
    return sorted(
        (_simulate(layout, values) for layout in layouts),
        key=lambda c: (c.device_bytes, c.caller_bytes, c.pool_peak, len(c.blocks)),
    )


def _simulate(layout: _Layout, values: Values) -> Candidate:
    """Give each block its lifetime and size (from its values) and run the blocks through the
    pool model, step by step."""
    n = len(layout.blocks)
    first = [len(values.names)] * n
    end = [-1] * n
    need = [0] * n  # the bytes a block's values really use (no more is asked for)
    for (k, off), it in zip(layout.where, values.items, strict=True):
        first[k] = min(first[k], it.first)
        end[k] = max(end[k], it.last)
        need[k] = max(need[k], off + it.size)
    outs = set(values.outputs)
    blocks: list[Block] = []
    for k, raw in enumerate(layout.blocks):
        last = None if raw.owner in outs else end[k]  # an output's block goes to the caller
        nbytes = values.block_bytes(max(need[k], raw.ask))
        blocks.append(Block(nbytes, need[k], first[k], last, raw.owner))
    taken: defaultdict[int, list[Block]] = defaultdict(list)
    released: defaultdict[int, list[Block]] = defaultdict(list)
    for b in blocks:
        taken[b.first].append(b)
        if b.last is not None:
            released[b.last].append(b)
    held: Counter[int] = Counter()  # released blocks the pool keeps, by size class
    device = in_use = pool_peak = aligned = peak = 0
    for step in sorted(taken.keys() | released.keys()):
        for b in taken.get(step, ()):
            if held[b.nbytes]:
                held[b.nbytes] -= 1
            else:
                device += b.nbytes
            in_use += b.nbytes
            aligned += b.size
        pool_peak = max(pool_peak, in_use)
        peak = max(peak, aligned)
        for b in released.get(step, ()):
            held[b.nbytes] += 1
            in_use -= b.nbytes
            aligned -= b.size
    caller = sum(b.nbytes for b in blocks if b.last is None)
    return Candidate(layout.strategy, layout.where, tuple(blocks), device, pool_peak, peak, caller)


def choice_reason(ranked: Sequence[Candidate]) -> str:
    """Why the first candidate won, with every other layout's figure."""
    best = ranked[0]
    others = ", ".join(f"{c.strategy} {c.device_bytes} B" for c in ranked[1:])
    reason = (
        f"least device memory for a run from an empty pool ({best.device_bytes} B"
        f"{'; ' + others if others else ''})"
    )
    if len(ranked) > 1 and ranked[1].device_bytes == best.device_bytes:
        reason += (
            f"; tie with {ranked[1].strategy} broken by bytes left with the caller, then pool "
            "peak, then fewer blocks"
        )
    return reason
