"""Counts of captured steps for their metrics: per step, and by step name over the steps
alive now plus those already garbage-collected (a counter never goes down)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from opentelemetry.util.types import AttributeValue

from netcl.runtime.capture._step_plan import Capture
from netcl.runtime.capture._telemetry import STEP_NAME, TEL

__all__ = ["StepStats", "RUNS", "CAPTURES", "REPLAYS", "EVICTIONS", "by_name", "counter", "counts",
           "register"]

RUNS, CAPTURES, REPLAYS, EVICTIONS = range(4)
Points = Iterable[tuple[float, Mapping[str, AttributeValue]]]


class StepStats(NamedTuple):
    """Counts of one captured step's calls since it was made."""

    runs: int
    """calls that ran the function normally (warm-up, check mode, nested in a recording)"""
    captures: int
    """captures recorded"""
    replays: int
    """calls answered by a replay"""
    evictions: int
    """captures dropped to stay within ``max_captures``"""


class _Step(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def _counts(self) -> list[int]: ...

    @property
    def _captures(self) -> Mapping[Any, Capture]: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_retired: dict[str, list[int]] = {}  # counts of steps garbage-collected, by name
_lock = threading.Lock()


def register(step: _Step) -> None:
    """Count ``step`` in the metrics from now on (and after it is garbage-collected)."""
    _live.add(step)
    weakref.finalize(step, _retire, step.name, step._counts, step._captures)


def counts(tally: list[int], captures: Mapping[Any, Capture]) -> list[int]:
    """A step's counts, with the replays of the captures it keeps (each counts its own)."""
    live = sum(entry.capture.replay_count for entry in list(captures.values()))
    return [*tally[:REPLAYS], tally[REPLAYS] + live, *tally[REPLAYS + 1:]]


def _retire(name: str, tally: list[int], captures: Mapping[Any, Capture]) -> None:
    with _lock:
        total = _retired.setdefault(name, [0, 0, 0, 0])
        for i, n in enumerate(counts(tally, captures)):
            total[i] += n


def by_name(value: Callable[[_Step], int], retired: int | None) -> Points:
    """``value`` of every live step summed by name (plus the retired steps' count ``retired``)."""
    with _lock:
        sums = {n: c[retired] for n, c in _retired.items()} if retired is not None else {}
    for step in list(_live):
        sums[step.name] = sums.get(step.name, 0) + value(step)
    return [(v, {STEP_NAME: n}) for n, v in sums.items()]


def counter(i: int) -> Callable[[], Points]:
    """The observe function of count ``i`` (RUNS, CAPTURES, REPLAYS, EVICTIONS)."""
    return lambda: by_name(lambda s: counts(s._counts, s._captures)[i], i)


# Observable, read when a metric reader collects: a replay adds nothing (each KernelCapture counts
# its own replays), the other calls add to a list item of their step.
TEL.observable_counter(
    "netcl.step.replays", counter(REPLAYS), "{replay}", "Replays made by captured steps")
TEL.observable_counter(
    "netcl.step.captures", counter(CAPTURES), "{capture}",
    "Captures recorded by captured steps (one per new guard key, again after one was dropped)")
TEL.observable_counter(
    "netcl.step.runs", counter(RUNS), "{call}",
    "Calls of captured steps that ran the function normally (warm-up, check mode, nested)")
TEL.observable_counter(
    "netcl.step.evictions", counter(EVICTIONS), "{capture}",
    "Captures dropped to keep a captured step within max_captures")
TEL.observable_gauge(
    "netcl.step.captures_kept", lambda: by_name(lambda s: len(s._captures), None),
    "{capture}", "Captures a captured step keeps now (at most its max_captures)")
