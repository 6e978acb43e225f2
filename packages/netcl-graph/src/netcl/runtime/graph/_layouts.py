"""Memory layouts: each strategy puts every value of a plan in a pool block at an offset.

The strategies (tried in this order; the pool model in ``_pool_model`` picks among them):

* ``arena``: one block for the intermediates (packed), a block per output;
* ``arena_in_output_blocks``: the same, but intermediates that die before an output is written
  may use its block;
* ``block_per_tensor``: plain refcounting, a block per value released after its last reader;
* ``block_per_tensor_best_fit``: the same, but a value asks for the smallest size class among
  the blocks released before it is produced;
* ``one_block`` / ``block_per_output``: every value packed as one region, cut at the outputs.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from netcl.runtime.graph._packing import Interval, place

__all__ = ["STRATEGIES", "Layout", "RawBlock", "Values"]


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

    def cap(self, name: str) -> int:
        """The bytes an output's block offers: its size class, rounded down to the alignment
        (at least the output's size)."""
        size_class = self.block_bytes(self.items[self.index[name]].size)
        return size_class // self.alignment * self.alignment


class RawBlock(NamedTuple):
    """A block before it is simulated: its lifetime and size come from the values in it."""

    ask: int  # bytes to ask the pool for at least (0: what its values need)
    owner: str | None  # the output whose Tensor the block is (None: intermediates only)
    to_caller: bool  # handed to the caller after the run


class Layout(NamedTuple):
    """One strategy's answer: its blocks and, per value (execution order), (block, offset)."""

    strategy: str
    blocks: tuple[RawBlock, ...]
    where: tuple[tuple[int, int], ...]


def _output_blocks(outputs: Sequence[str]) -> list[RawBlock]:
    return [RawBlock(0, n, True) for n in outputs]


def _arena(v: Values) -> Layout:
    """One arena for the intermediates, a block of its own for each output."""
    outs = set(v.outputs)
    temps = [k for k, n in enumerate(v.names) if n not in outs]
    placement = place([v.items[k] for k in temps])
    blocks = _output_blocks(v.outputs)
    where = [(0, 0)] * len(v.names)
    for b, n in enumerate(v.outputs):
        where[v.index[n]] = (b, 0)
    for k, off in zip(temps, placement.offsets, strict=True):
        where[k] = (len(blocks), off)
    if temps:
        blocks.append(RawBlock(0, None, False))
    return Layout("arena", tuple(blocks), tuple(where))


def _arena_in_output_blocks(v: Values) -> Layout:
    """The arena, but intermediates that die before an output is written may use its block:
    the output blocks are laid out one after the other, the arena after them."""
    bases, base = [], 0
    for n in v.outputs:
        bases.append(base)
        base += v.cap(n)
    fixed = {v.index[n]: b for n, b in zip(v.outputs, bases, strict=True)}
    shared = place(v.items, fixed, [*bases[1:], base])
    where = []
    in_arena = False
    for off in shared.offsets:
        if off < base:
            k = bisect.bisect_right(bases, off) - 1
            where.append((k, off - bases[k]))
        else:
            where.append((len(v.outputs), off - base))
            in_arena = True
    blocks = _output_blocks(v.outputs)
    if in_arena:
        blocks.append(RawBlock(0, None, False))
    return Layout("arena_in_output_blocks", tuple(blocks), tuple(where))


def _block_per_tensor(v: Values) -> Layout:
    """Plain refcounting: a block per value, released after its last reader."""
    outs = set(v.outputs)
    blocks = tuple(RawBlock(0, n, n in outs) for n in v.names)
    return Layout("block_per_tensor", blocks, tuple((k, 0) for k in range(len(v.names))))


def _block_per_tensor_best_fit(v: Values) -> Layout:
    """A block per value, but a value takes the smallest free block of a larger size class when
    there is one (the pool reuses blocks within a size class only, so it asks for that class)."""
    outs = set(v.outputs)
    asks = _best_fit(v.items, v.block_bytes)
    blocks = tuple(RawBlock(r, n, n in outs) for n, r in zip(v.names, asks, strict=True))
    return Layout("block_per_tensor_best_fit", blocks, tuple((k, 0) for k in range(len(blocks))))


def _best_fit(items: Sequence[Interval], block_bytes: Callable[[int], int]) -> list[int]:
    """Per value (in execution order), the pool bytes to ask for: the smallest size class among
    the blocks released before it is produced that fits it, else its own."""
    free: list[int] = []  # sorted size classes of released blocks
    ask: list[int] = []
    live: list[tuple[int, int]] = []  # heap of (last step, class) of blocks in use
    for it in items:
        while live and live[0][0] < it.first:
            bisect.insort(free, heapq.heappop(live)[1])
        own = block_bytes(it.size)
        k = bisect.bisect_left(free, own)
        cls = free.pop(k) if k < len(free) else own
        ask.append(cls)
        heapq.heappush(live, (it.last, cls))
    return ask


def _one_region(v: Values) -> Layout | None:
    """Everything packed as one region, then cut at the outputs' offsets: a block per output,
    starting with it (one block for a single output). None when no cut works."""
    items = v.items
    free = place(items)
    outs = [v.index[n] for n in v.outputs]
    tries = [(free.arena_bytes, _cut_at_outputs(free.offsets, items, outs, free.arena_bytes))]
    if tries[0][1] is None:
        # keep the outputs where they are and place the rest again, crossing no cut
        at = {o: free.offsets[o] for o in outs}
        again = place(items, at, sorted(at.values()))
        tries.append(
            (again.arena_bytes, _cut_at_outputs(again.offsets, items, outs, again.arena_bytes))
        )
    if len(outs) == 1:
        pinned = place(items, {outs[0]: 0})
        tries.append((pinned.arena_bytes, [(0, o) for o in pinned.offsets]))
    valid = [(size, cut) for size, cut in tries if cut is not None]
    if not valid:
        return None
    cut = min(valid, key=lambda t: t[0])[1]
    by_block = sorted(v.outputs, key=lambda n: cut[v.index[n]][0])
    name = "one_block" if len(outs) == 1 else "block_per_output"
    return Layout(name, tuple(_output_blocks(by_block)), tuple(cut))


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
        if any(_crosses(cuts, o, it.size) for o, it in zip(offs, items, strict=True)):
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


def _crosses(cuts: Sequence[int], offset: int, size: int) -> bool:
    """Whether a cut (sorted offsets) lies strictly inside ``[offset, offset + size)``."""
    k = bisect.bisect_right(cuts, offset)
    return k < len(cuts) and cuts[k] < offset + size


#: Every strategy, in the order ties are resolved (the first of equals wins).
STRATEGIES: tuple[Callable[[Values], Layout | None], ...] = (
    _arena,
    _arena_in_output_blocks,
    _block_per_tensor,
    _block_per_tensor_best_fit,
    _one_region,
)
