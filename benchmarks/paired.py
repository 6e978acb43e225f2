"""Paired rounds: a benchmark times its floor (the same work done the plain way) right before
each of its own rounds, so both see the same machine load.

On a shared machine, two benchmarks timed one after the other can see different load (another
process on the sibling core, a busy second), and their fastest rounds then differ by 30% or more.
Paired, the floor runs in the same window as the benchmark: the fastest round of each, and so
their ratio, stays put. The benchmark's own rounds are pytest-benchmark's (its stats and table);
the floor's fastest round goes into ``extra_info[key]`` (seconds), where the gate's
``paired(...)`` figure reads it.

    setup, floor = paired_floor(add_loop.bare, between=held)
    benchmark.pedantic(add_loop.replay, setup=setup, rounds=200, warmup_rounds=2)
    record_floor(benchmark, floor)

``record_floor`` also stores the median of the per-round ratios (each round over the floor timed
right before it, ``paired_ratio_median``): the two halves of one round see the same machine
state, so that median barely moves when the machine is slow for part of a run, and the history
(benchmarks/tracking/history_runs.py) compares it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import pyopencl as cl


def paired_floor(
    floor: Callable[[], object], between: Callable[[], object] | None = None
) -> tuple[Callable[[], None], list[float]]:
    """A pedantic ``setup`` that runs ``between`` (e.g. drain a queue), times one call of
    ``floor``, and runs ``between`` again; and the list the floor's times go to."""
    times: list[float] = []
    clock = time.perf_counter

    def setup() -> None:
        if between is not None:
            between()
        t0 = clock()
        floor()
        times.append(clock() - t0)
        if between is not None:
            between()

    return setup, times


def record_floor(benchmark: Any, floor: list[float], key: str = "paired_floor_s") -> None:
    """Store a paired benchmark's floor in ``extra_info``: its fastest round (``key``, the
    gate's), and the median of the ratios of each round to the floor timed before it (the key's
    ``_floor_s`` made ``_ratio_median``: ``paired_ratio_median``, the history's) when the rounds'
    times are known. ``floor`` holds one time per round, warm-up rounds first (as
    ``paired_floor``'s setup fills it)."""
    benchmark.extra_info[key] = min(floor)
    stats = getattr(benchmark, "stats", None)
    rounds = list(getattr(getattr(stats, "stats", None), "data", None) or [])
    if rounds and len(floor) >= len(rounds):
        ratios = [t / f for t, f in zip(rounds, floor[-len(rounds) :], strict=True) if f > 0]
        if ratios:
            median_key = key.removesuffix("_floor_s") + "_ratio_median"
            benchmark.extra_info[median_key] = statistics.median(ratios)


class HeldQueues:
    """Setup of a host-time round: drain the previous round, then hold each queue behind a user
    event, so the device runs no command while the round enqueues (on a CPU device its worker
    threads would otherwise compete with the timed thread, and the fastest round would depend
    on the machine's load). ``release()`` lets the held commands run and drains the queues."""

    def __init__(self, *queues: cl.CommandQueue) -> None:
        self.queues = queues
        self.events: list[cl.UserEvent] = []

    def __call__(self) -> None:
        self.release()
        for q in self.queues:
            ev = cl.UserEvent(q.context)
            cl.enqueue_marker(q, wait_for=[ev])
            self.events.append(ev)

    def release(self) -> None:
        for ev in self.events:
            ev.set_status(cl.command_execution_status.COMPLETE)
        self.events = []
        for q in self.queues:
            q.finish()
