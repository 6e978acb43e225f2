"""Interval packing: offsets in one arena for values with known lifetimes, no two values alive at
the same step overlapping. Several heuristics run and the smallest arena wins (XLA's heap
simulator does the same); the graph guide lists them. The one memory planner of netcl: a
graph's intermediates and a capture's own buffers are placed with it. Also the one dependency
order (Kahn's algorithm) of a graph's ops and of a scheduler's plans."""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["Interval", "Placement", "dependency_order", "lower_bound", "place"]


@dataclass(frozen=True, slots=True)
class Interval:
    """A value alive from step ``first`` to step ``last`` (inclusive) that takes ``size`` bytes."""

    first: int
    last: int
    size: int


@dataclass(frozen=True, slots=True)
class Placement:
    """An offset per item, and the bytes the arena needs for them."""

    offsets: tuple[int, ...]
    arena_bytes: int


def lower_bound(items: Sequence[Interval]) -> int:
    """The largest sum of sizes alive at one step: no placement can use fewer bytes."""
    return _most_alive(items, [it.size for it in items])


def _most_alive(items: Sequence[Interval], weights: Sequence[int]) -> int:
    change: dict[int, int] = {}  # step -> weight coming alive minus weight dying before it
    for it, w in zip(items, weights, strict=True):
        change[it.first] = change.get(it.first, 0) + w
        change[it.last + 1] = change.get(it.last + 1, 0) - w
    return max(accumulate(change[step] for step in sorted(change)), default=0)


def _fit(lo: int, hi: float, size: int, bounds: Sequence[int]) -> int:
    """The lowest offset >= ``lo`` where ``size`` bytes fit below ``hi`` without crossing a block
    boundary in ``bounds`` (sorted); -1 when there is none."""
    pos = lo
    while pos + size <= hi:
        k = bisect.bisect_right(bounds, pos)
        if k == len(bounds) or bounds[k] >= pos + size:
            return pos
        pos = bounds[k]
    return -1


class _Lifetimes:
    """The items' lifetimes indexed for overlap queries, shared by the greedy passes of one
    :func:`place`. Time is counted in positions (the distinct first steps, in order). A query
    costs about the number of items it finds, so planning stays near O(n log n) unless many
    values are alive at once."""

    __slots__ = ("by_start", "first", "last", "size")

    def __init__(self, items: Sequence[Interval]) -> None:
        starts = sorted({it.first for it in items})
        position = {s: p for p, s in enumerate(starts)}
        self.first = [position[it.first] for it in items]
        self.last = [bisect.bisect_right(starts, it.last) - 1 for it in items]
        self.size = [it.size for it in items]
        self.by_start: list[list[int]] = [[] for _ in starts]
        for i, p in enumerate(self.first):
            self.by_start[p].append(i)


_SPAN = 16  # positions per span of the alive-at index (_greedy)


def _greedy(
    lifetimes: _Lifetimes,
    order: Sequence[int],
    best_fit: bool,
    fixed: Mapping[int, int] | None = None,
    bounds: Sequence[int] = (),
) -> list[int]:
    """Place the items one by one in ``order``, each in the smallest gap (best fit) or the
    lowest gap (first fit) between the items placed so far that it overlaps in time."""
    first, last, sizes = lifetimes.first, lifetimes.last, lifetimes.size
    by_start = lifetimes.by_start
    # The placed items alive at position p: alive_at[p] + alive_across[p // _SPAN]. An item is
    # listed in alive_across for the whole spans of _SPAN positions it lives through, and in
    # alive_at for the positions at its ends (so a long life costs len / _SPAN entries).
    alive_at: list[list[int]] = [[] for _ in by_start]
    alive_across: list[list[int]] = [[] for _ in range(len(by_start) // _SPAN + 1)]
    placed = bytearray(len(sizes))
    offsets = [0] * len(sizes)

    def add(i: int, offset: int) -> None:
        offsets[i] = offset
        placed[i] = 1
        lo, hi = first[i], last[i] + 1
        while lo < hi and (lo % _SPAN or hi - lo < _SPAN):
            alive_at[lo].append(i)
            lo += 1
        while hi - lo >= _SPAN:
            alive_across[lo // _SPAN].append(i)
            lo += _SPAN
        for p in range(lo, hi):
            alive_at[p].append(i)

    for i, off in (fixed or {}).items():
        add(i, off)
    for i in order:
        if placed[i]:
            continue  # pinned
        p = first[i]
        # the placed items alive with item i: alive at its first position, or starting later
        # within its life
        near = [
            *alive_at[p],
            *alive_across[p // _SPAN],
            *(j for q in range(p + 1, last[i] + 1) for j in by_start[q] if placed[j]),
        ]
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in near)  # (start, stop) of each
        add(i, _gap(busy, sizes[i], best_fit, bounds))
    return offsets


def _gap(busy: Sequence[tuple[int, int]], size: int, best_fit: bool, bounds: Sequence[int]) -> int:
    """The offset for ``size`` bytes among the ``busy`` ranges (sorted): the smallest gap that
    fits (best fit) or the lowest (first fit), else above them all."""
    chosen = -1
    chosen_gap = -1
    end = 0
    for start, stop in busy:
        if (gap := start - end) >= size:
            pos = _fit(end, start, size, bounds) if bounds else end
            if pos >= 0 and (chosen < 0 or gap < chosen_gap):
                chosen, chosen_gap = pos, gap
                if not best_fit:
                    break
        if stop > end:
            end = stop
    if chosen < 0:
        chosen = _fit(end, float("inf"), size, bounds) if bounds else end
    return chosen


def _two_ended(items: Sequence[Interval], bound: int) -> list[int] | None:
    """Exact when at most two values are alive together: colour the interval graph with two
    colours (greedy by start is optimal for interval graphs); colour 0 sits at the bottom of the
    arena, colour 1 at the top. Two values alive together have different colours and sizes that
    sum to at most ``bound``, so they never overlap."""
    if _most_alive(items, [1] * len(items)) > 2:
        return None
    colour_free_at = [-1, -1]  # the step after which each colour is free
    offsets = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (items[i].first, items[i].last)):
        it = items[i]
        colour = 0 if colour_free_at[0] < it.first else 1
        colour_free_at[colour] = it.last
        offsets[i] = 0 if colour == 0 else bound - it.size
    return offsets


# The greedy passes, in the order they are tried: the order of the items (a sort key of item and
# index), and best fit (else first fit). By size (TFLite's greedy-by-size, best and first fit), by
# size x lifetime, by start, by end.
_GREEDY_PASSES: tuple[tuple[Callable[[Interval, int], tuple[int, ...]], bool], ...] = (
    (lambda it, i: (-it.size, it.first, i), True),
    (lambda it, i: (-it.size, it.first, i), False),
    (lambda it, i: (-(it.last - it.first + 1) * it.size, it.first, i), True),
    (lambda it, i: (it.first, -it.size, i), True),
    (lambda it, i: (-it.last, -it.size, i), True),
)
_RESTARTS = 64
_RESTART_BUDGET = 400_000


def place(
    items: Sequence[Interval],
    fixed: Mapping[int, int] | None = None,
    bounds: Sequence[int] = (),
) -> Placement:
    """Offsets for ``items`` in the smallest arena any of the heuristics finds.

    ``fixed`` pins some items at given offsets; no item may cross an offset in ``bounds`` (the
    edges of separate blocks laid out one after the other).
    """
    if not items:
        return Placement((), 0)
    bound = lower_bound(items)  # no placement does better: stop at the first that reaches it
    best: Placement | None = None
    if not fixed and not bounds and (offsets := _two_ended(items, bound)) is not None:
        best = _placement(items, offsets)
    lifetimes = _Lifetimes(items)
    bounds = sorted(bounds)
    for key, best_fit in _GREEDY_PASSES:
        if best is not None and best.arena_bytes == bound:
            return best
        keys = [key(it, i) for i, it in enumerate(items)]
        order = sorted(range(len(items)), key=keys.__getitem__)
        placement = _placement(items, _greedy(lifetimes, order, best_fit, fixed, bounds))
        if best is None or placement.arena_bytes < best.arena_bytes:
            best = placement
    assert best is not None
    # Seeded restarts of greedy-by-size over perturbed size orders while the best is above the
    # bound: they close most of the remaining gap on DAGs with very different value sizes. Only
    # for graphs of tens of values: the budget allows 400,000 / n² restarts (at most 64).
    n = len(items)
    rng = random.Random(0)
    tries = min(_RESTARTS, _RESTART_BUDGET // (n * n))
    for attempt in range(tries):
        if best.arena_bytes == bound:
            break
        # log-uniform jitter, wider on later tries: lets a smaller value go before a larger one
        spread = 0.5 + 2.0 * attempt / max(tries - 1, 1)
        jitter = [(-it.size * 2.0 ** rng.uniform(-spread, spread), i) for i, it in enumerate(items)]
        order = sorted(range(n), key=jitter.__getitem__)
        placement = _placement(items, _greedy(lifetimes, order, True, fixed, bounds))
        if placement.arena_bytes < best.arena_bytes:
            best = placement
    return best


def _placement(items: Sequence[Interval], offsets: Sequence[int]) -> Placement:
    return Placement(tuple(offsets), max(o + it.size for o, it in zip(offsets, items, strict=True)))


def dependency_order(preds: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Nodes ``0..n-1`` in an order where node k comes after every node in ``preds[k]``, the
    lowest ready node first (Kahn's algorithm): ``(order, [])``; when some cannot be ordered,
    ``(the nodes ordered, a cycle)``, each node of the cycle coming after the one before it."""
    waiting = [len(ks) for ks in preds]
    followers: list[list[int]] = [[] for _ in preds]
    for k, ks in enumerate(preds):
        for j in ks:
            followers[j].append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]  # ascending: a heap already
    order: list[int] = []
    while ready:
        order.append(k := heapq.heappop(ready))
        for f in followers[k]:
            waiting[f] -= 1
            if waiting[f] == 0:
                heapq.heappush(ready, f)
    if len(order) == len(preds):
        return order, []
    # every stuck node waits on another stuck one: walking back from the lowest must meet itself
    k = next(k for k, w in enumerate(waiting) if w)
    path: dict[int, int] = {}  # node -> its position on the path walked
    while k not in path:
        path[k] = len(path)
        k = next(j for j in preds[k] if waiting[j])
    return order, list(path)[path[k] :][::-1]  # walked backwards: reversed, it is in order
