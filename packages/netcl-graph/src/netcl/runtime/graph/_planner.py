"""Offset planning: place values with known lifetimes in one arena so that no two values alive at
the same step overlap, using as few bytes as the heuristics find.

Several placement heuristics run and the smallest arena wins (XLA's heap simulator does the same):
an exact two-ended placement when at most two values are ever alive together (chains), TFLite's
greedy-by-size with best fit and with first fit, greedy by size x lifetime, greedy in execution
order; then, while none reached the lower bound, greedy-by-size again over size orders perturbed
by a seeded generator (deterministic), as many times as a small budget allows.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Interval", "Placement", "lower_bound", "max_live_count", "place"]


@dataclass(frozen=True, slots=True)
class Interval:
    """A value alive from step ``first`` to step ``last`` (inclusive) that takes ``size`` bytes."""

    first: int
    last: int
    size: int


@dataclass(frozen=True, slots=True)
class Placement:
    offsets: tuple[int, ...]
    arena_bytes: int
    strategy: str


def _overlap(a: Interval, b: Interval) -> bool:
    return a.first <= b.last and b.first <= a.last


def lower_bound(items: Sequence[Interval]) -> int:
    """The largest sum of sizes alive at one step: no placement can use fewer bytes."""
    events: list[tuple[int, int]] = []
    for it in items:
        events.append((it.first, it.size))
        events.append((it.last + 1, -it.size))
    events.sort(key=lambda e: (e[0], e[1]))  # frees (negative) before allocations at one step
    live = best = 0
    for _, delta in events:
        live += delta
        best = max(best, live)
    return best


def max_live_count(items: Sequence[Interval]) -> int:
    """The most values alive at one step."""
    return lower_bound([Interval(it.first, it.last, 1) for it in items])


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


def _greedy(
    items: Sequence[Interval],
    order: Sequence[int],
    best_fit: bool,
    fixed: Mapping[int, int] | None = None,
    bounds: Sequence[int] = (),
) -> list[int]:
    offsets = [0] * len(items)
    placed: list[int] = []
    for i, off in (fixed or {}).items():
        offsets[i] = off
        placed.append(i)
    for i in order:
        if fixed and i in fixed:
            continue
        it = items[i]
        busy = sorted(
            (offsets[j], offsets[j] + items[j].size) for j in placed if _overlap(it, items[j])
        )
        chosen = -1
        chosen_gap = -1
        end = 0
        for start, stop in busy:
            gap = start - end
            if gap >= it.size:
                pos = _fit(end, start, it.size, bounds) if bounds else end
                if pos >= 0 and (chosen < 0 or gap < chosen_gap):
                    chosen, chosen_gap = pos, gap
                    if not best_fit:
                        break
            end = max(end, stop)
        if chosen < 0:
            chosen = _fit(end, float("inf"), it.size, bounds) if bounds else end
        offsets[i] = chosen
        placed.append(i)
    return offsets


def _two_ended(items: Sequence[Interval], bound: int) -> list[int] | None:
    """Exact when at most two values are alive together: colour the interval graph with two
    colours (greedy by start is optimal for interval graphs); colour 0 sits at the bottom of the
    arena, colour 1 at the top. Two values alive together have different colours and sizes that
    sum to at most ``bound``, so they never overlap."""
    if max_live_count(items) > 2:
        return None
    order = sorted(range(len(items)), key=lambda i: (items[i].first, items[i].last))
    colour_free_at = [-1, -1]  # the step after which each colour is free
    offsets = [0] * len(items)
    for i in order:
        it = items[i]
        colour = 0 if colour_free_at[0] < it.first else 1
        colour_free_at[colour] = it.last
        offsets[i] = 0 if colour == 0 else bound - it.size
    return offsets


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
        return Placement((), 0, "empty")
    bound = lower_bound(items)
    n = len(items)
    by_size = sorted(range(n), key=lambda i: (-items[i].size, items[i].first, i))
    by_start = sorted(range(n), key=lambda i: (items[i].first, -items[i].size, i))
    by_area = sorted(
        range(n),
        key=lambda i: (-(items[i].last - items[i].first + 1) * items[i].size, items[i].first, i),
    )
    by_end = sorted(range(n), key=lambda i: (-items[i].last, -items[i].size, i))
    bounds = sorted(bounds)

    def greedy(order: Sequence[int], best_fit: bool) -> list[int]:
        return _greedy(items, order, best_fit, fixed, bounds)

    candidates: list[tuple[str, Callable[[], list[int] | None]]] = [
        ("two_ended", lambda: None if fixed or bounds else _two_ended(items, bound)),
        ("greedy_by_size_best_fit", lambda: greedy(by_size, True)),
        ("greedy_by_size_first_fit", lambda: greedy(by_size, False)),
        ("greedy_by_area_best_fit", lambda: greedy(by_area, True)),
        ("greedy_by_start_best_fit", lambda: greedy(by_start, True)),
        ("greedy_by_end_best_fit", lambda: greedy(by_end, True)),
    ]
    best: Placement | None = None
    for name, run in candidates:
        offsets = run()
        if offsets is None:
            continue
        arena = max(o + it.size for o, it in zip(offsets, items, strict=True))
        if best is None or arena < best.arena_bytes:
            best = Placement(tuple(offsets), arena, name)
        if arena == bound:
            break  # optimal: no heuristic can do better
    assert best is not None
    # Seeded restarts over perturbed size orders: cheap for graphs of tens of nodes, and they close
    # most of the remaining gap on DAGs with very different value sizes. Budget: n^2 pair checks.
    rng = random.Random(0)
    tries = min(_RESTARTS, _RESTART_BUDGET // (n * n))
    for attempt in range(tries):
        if best.arena_bytes == bound:
            break
        # log-uniform jitter, wider on later tries: lets a smaller value go before a larger one
        spread = 0.5 + 2.0 * attempt / max(tries - 1, 1)
        jitter = {i: items[i].size * 2.0 ** rng.uniform(-spread, spread) for i in range(n)}
        order = sorted(range(n), key=lambda i: (-jitter[i], i))
        offsets = greedy(order, True)
        arena = max(o + it.size for o, it in zip(offsets, items, strict=True))
        if arena < best.arena_bytes:
            best = Placement(tuple(offsets), arena, "greedy_by_size_restarts")
    return best


_RESTARTS = 64
_RESTART_BUDGET = 400_000


def check(items: Sequence[Interval], offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Pairs of values alive together whose byte ranges overlap (empty for a valid placement)."""
    bad: list[tuple[int, int]] = []
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            if _overlap(items[i], items[j]):
                a0, a1 = offsets[i], offsets[i] + items[i].size
                b0, b1 = offsets[j], offsets[j] + items[j].size
                if a0 < b1 and b0 < a1:
                    bad.append((i, j))
    return bad
