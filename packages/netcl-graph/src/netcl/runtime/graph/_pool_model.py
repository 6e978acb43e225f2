"""Choosing a layout: each strategy's layout is run through a model of the pool (a released
block goes to a free list of its size class and is reused within that class only); the one
that takes the least device memory from an empty pool wins."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from netcl.runtime.graph._layouts import STRATEGIES, Layout, Values

__all__ = ["Block", "Candidate", "describe_choice", "rank_layouts"]


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
    """A layout, its blocks' sizes and lifetimes, and what the pool model says it costs."""

    layout: Layout
    nbytes: tuple[int, ...]  # per block: the pool bytes it takes (a size class)
    need: tuple[int, ...]  # per block: the aligned bytes its values use
    first: tuple[int, ...]  # per block: the step before which it is taken
    last: tuple[int | None, ...]  # per block: the step after which it is released (None: never)
    device_bytes: int
    pool_peak: int
    peak: int
    caller_bytes: int

    @property
    def name(self) -> str:
        return self.layout.strategy

    def blocks(self) -> tuple[Block, ...]:
        raw = self.layout.blocks
        return tuple(
            Block(self.nbytes[k], self.need[k], self.first[k], self.last[k], raw[k].owner)
            for k in range(len(raw))
        )


def rank_layouts(values: Values) -> list[Candidate]:
    """Every strategy's layout, simulated, best first: least device memory, then fewest bytes
    left with the caller, then lower pool peak, then fewer blocks."""
    layouts = [layout for strategy in STRATEGIES if (layout := strategy(values)) is not None]
    return sorted(
        (_simulate(layout, values) for layout in layouts),
        key=lambda c: (c.device_bytes, c.caller_bytes, c.pool_peak, len(c.nbytes)),
    )


def _simulate(layout: Layout, values: Values) -> Candidate:
    """Give each block its lifetime and size (from its values) and run the blocks through the
    pool model, step by step."""
    n = len(layout.blocks)
    first = [len(values.names)] * n
    end = [-1] * n
    need = [0] * n  # the bytes a block's values really use (no more is asked for)
    for (k, off), it in zip(layout.where, values.items, strict=True):
        if it.first < first[k]:
            first[k] = it.first
        if it.last > end[k]:
            end[k] = it.last
        if off + it.size > need[k]:
            need[k] = off + it.size
    block_bytes = values.block_bytes
    nbytes = [block_bytes(max(need[k], raw.ask)) for k, raw in enumerate(layout.blocks)]
    taken: defaultdict[int, list[int]] = defaultdict(list)
    released: defaultdict[int, list[int]] = defaultdict(list)
    caller = 0
    for k, raw in enumerate(layout.blocks):
        taken[first[k]].append(k)
        if raw.to_caller:
            caller += nbytes[k]
        else:
            released[end[k]].append(k)
    held: Counter[int] = Counter()
    device = in_use = pool_peak = aligned = peak = 0
    for step in sorted(taken.keys() | released.keys()):
        for k in taken.get(step, ()):
            if held[nbytes[k]]:
                held[nbytes[k]] -= 1
            else:
                device += nbytes[k]
            in_use += nbytes[k]
            aligned += need[k]
        if in_use > pool_peak:
            pool_peak = in_use
        if aligned > peak:
            peak = aligned
        for k in released.get(step, ()):
            held[nbytes[k]] += 1
            in_use -= nbytes[k]
            aligned -= need[k]
    last = tuple(None if raw.to_caller else end[k] for k, raw in enumerate(layout.blocks))
    return Candidate(layout, tuple(nbytes), tuple(need), tuple(first), last, device, pool_peak,
                     peak, caller)  # fmt: skip


def describe_choice(ranked: Sequence[Candidate]) -> str:
    """Why the first candidate won, with every other layout's figure."""
    best = ranked[0]
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
    return reason
