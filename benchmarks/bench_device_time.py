"""Device time of replays: what profiling costs the replay in each mode, and whether the device
duration netcl reports agrees with the device's own event timestamps.
``benchmarks/device_time_h200.sh`` runs this file alone (on the GPU machine, or here).

1. ``test_replay_profiled`` times a replay of a capture recorded on a profiling queue in
   per-command mode (``commands``), paired with a replay of the same kernel sequence captured on
   a plain queue of the same context (the floor, timed right before each round). Host time of the
   enqueue, the queue held behind a user event while the round enqueues (as in
   bench_capture.py). ``extra_info``: the ratio of the fastest rounds and of the medians;
   ``driver_ratio``: the driver's own share, the same 64 launches enqueued by hand (events
   dropped, as a plain replay does) on the profiling queue against the plain one, interleaved
   round by round with the queues held; ``netcl_over_driver``: ``ratio_min`` over it.
   Then the sustained loop, ``SUSTAINED`` replays each followed by a ``finish``, the collection of
   the device time (the collector's thread and a final ``profiling.flush``) included, of the
   variants ``plain`` (the plain queue), ``none`` (the profiling queue, a capture made and
   replayed in mode ``none``: no collection), ``summary`` and ``commands`` (the profiling queue,
   collected in that mode), ``bracketed`` (the production setting: a plain queue, a capture made
   and replayed in summary mode, its replays stamped on a side queue one in N as
   ``Collector.stamp_budget`` has it), compared two at a time: ``ROUNDS`` rounds of both, in
   turn first; and ``plain_256``, ``bracketed_256``: the same with ``LONG`` kernels a replay.
   ``e2e_<variant>_s``: the median seconds per replay; ``bracketed_over_plain`` (the whole price
   of leaving summary mode on, target <= 1.10 on NVIDIA, <= 1.05 on PoCL),
   ``bracketed_256_over_plain_256`` (target <= 1.05), ``bracketed_stamped`` and
   ``bracketed_256_stamped`` (the share of their replays that were stamped),
   ``summary_over_none`` (netcl's own share of a profiling queue's summary, the collection
   alone, target <= 1.03), ``none_over_plain`` (the driver's price for a profiling queue),
   ``commands_over_none`` and ``e2e_ratio`` (commands over plain, the figure of earlier runs):
   medians of the ratios within each round; ``twin_over_none``, the same pairing of two
   identical variants (a second capture replayed in mode ``none``): how far these medians read
   from 1 with nothing between them (on a 2-core runner a round's ratio spreads by ±6% and the
   median of 31 rounds by ±2%, so ``ROUNDS`` is 61; ``NETCL_BENCH_DEVICE_TIME_ROUNDS`` sets it,
   e.g. 241 for a figure to ±1%).
2. ``test_device_duration_matches_raw_events[mode]`` replays a capture of 64 kernels ``REPEATS``
   times and reads the device duration netcl recorded in that mode (the collector's ``REPLAY``
   totals; ``commands`` and ``summary`` on a profiling queue, the latter without sampled
   detail; ``bracketed``, summary mode on a plain queue, every replay stamped: a stamped
   replay's duration is exact, sampling only leaves replays out); in the same run it enqueues the
   same 64 kernels by hand on a profiling queue and sums ``end - start`` of their events. It
   prints both per-replay figures and their ratio (the median of the ratios within each
   round; target within 5%) and stores them in ``extra_info``, with
   ``raw_envelope_s``, last end - first start of the hand-enqueued events: what a summary
   measures, gaps between kernels included (so the kernels are long enough for the gaps to be
   small: 0.2-0.6 ms each).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from capture_workloads import interleaved_times
from paired import HeldQueues, paired_floor

from netcl.core import profiling
from netcl.runtime.capture import KernelCapture

KERNELS = 64
LONG = 256  # kernels a replay of the long chains (bracketed_over_plain_256)
REPEATS = 20
SUSTAINED = 100  # replays per variant and round
ROUNDS = int(os.environ.get("NETCL_BENCH_DEVICE_TIME_ROUNDS", "61"))
SRC = """
__kernel void work(__global float *a, const int n) {
    int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < n; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
"""
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE


def _rounds(benchmark: Any, full: int) -> int:
    return 3 if benchmark.disabled else full


class _Chain:
    """``kernels`` launches of ``work`` on one queue: by hand, and as a capture."""

    def __init__(
        self, queue: cl.CommandQueue, size: int, iters: int, kernels: int = KERNELS
    ) -> None:
        ctx = queue.context
        self.queue, self.size, self.kernels = queue, size, kernels
        self.kernel = cl.Kernel(cl.Program(ctx, SRC).build(), "work")
        self.buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * size)
        cl.enqueue_fill_buffer(queue, self.buf, np.float32(1.0), 0, 4 * size)
        self.kernel.set_args(self.buf, np.int32(iters))
        self.capture = KernelCapture()
        self.capture.begin()
        try:
            self.by_hand()
        finally:
            self.capture.end()
        queue.finish()

    def by_hand(self) -> list[cl.Event]:
        q, k, size = self.queue, self.kernel, (self.size,)
        return [cl.enqueue_nd_range_kernel(q, k, size, None) for _ in range(self.kernels)]

    def bare(self) -> None:
        """The launches by hand, each event dropped at once (the driver's floor)."""
        q, k, size = self.queue, self.kernel, (self.size,)
        for _ in range(self.kernels):
            cl.enqueue_nd_range_kernel(q, k, size, None)

    def replay(self) -> None:
        self.capture.replay()


class _Held(HeldQueues):
    """Round setup: hold the queues (see HeldQueues); releasing also collects the device time
    of the round, so collection never falls into a timed round."""

    def release(self) -> None:
        super().release()
        profiling.flush(5.0)


@contextlib.contextmanager
def _mode(
    mode: profiling.Mode, sample_budget: float | None = None, stamp_budget: float | None = None
) -> Iterator[None]:
    """The process-wide collector in ``mode`` (and with ``sample_budget``, ``stamp_budget``)
    for a while."""
    col = profiling.collector()
    saved = col.mode, col.sample_budget, col.stamp_budget
    col.mode = mode
    col.sample_budget = saved[1] if sample_budget is None else sample_budget
    col.stamp_budget = saved[2] if stamp_budget is None else stamp_budget
    try:
        yield
    finally:
        col.mode, col.sample_budget, col.stamp_budget = saved


@pytest.fixture(scope="module")
def chains(ctx: cl.Context) -> tuple[_Chain, ...]:
    """The chain on a plain queue, on a profiling queue, twice on that same queue captured in
    mode ``none`` (its replays take the plain path: the profiling queue without collection),
    and on a second plain queue captured in summary mode (each replay bracketed); then the
    plain and the bracketed chains again with ``LONG`` kernels a replay."""
    plain, bracketed = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    profiled = cl.CommandQueue(ctx, properties=_PROFILING)
    with _mode("none"):
        unwatched = _Chain(profiled, 256, 1), _Chain(profiled, 256, 1)
    with _mode("summary"):
        summary, summary_long = _Chain(bracketed, 256, 1), _Chain(bracketed, 256, 1, LONG)
    plains = _Chain(plain, 256, 1), _Chain(profiled, 256, 1)
    return *plains, *unwatched, summary, _Chain(plain, 256, 1, LONG), summary_long


def _sustained(chain: _Chain, n: int) -> float:
    """Seconds per replay of ``n`` replays, each followed by a ``finish``, then the collection
    of everything pending: all the profiled replay costs, the collector's thread included."""
    profiling.flush(5.0)
    t0 = time.perf_counter()
    for _ in range(n):
        chain.replay()
        chain.queue.finish()
    profiling.flush(30.0)
    return (time.perf_counter() - t0) / n


def _paired_rounds(
    variants: dict[str, tuple[_Chain, profiling.Mode]],
    top: str,
    bottom: str,
    n: int,
    rounds: int,
    times: dict[str, list[float]],
) -> float:
    """``top`` over ``bottom`` (two of ``variants``, a chain replayed in a mode): the median of
    the ratios within ``rounds`` rounds, each timing ``n`` replays of both back to back, in
    turn first (ABBA), so that neither always follows the same work. Seconds per replay go to
    ``times``. (A rotation of all four variants put each after the same neighbour every round,
    and which one came first moved a 300-replay block by up to 20% on the H200's host.)"""
    ratios = []
    for r in range(rounds):
        got = {}
        for name in (top, bottom) if r % 2 == 0 else (bottom, top):
            chain, mode = variants[name]
            with _mode(mode):
                got[name] = _sustained(chain, n)
            times.setdefault(name, []).append(got[name])
        ratios.append(got[top] / got[bottom])
    return statistics.median(ratios)


@pytest.mark.benchmark(group="device-time")
def test_replay_profiled(benchmark: Any, chains: tuple[_Chain, ...]) -> None:
    plain, profiled, unwatched, twin, bracketed, plain_long, bracketed_long = chains
    assert profiling.enabled(profiled.queue) and not profiling.enabled(plain.queue)
    held = _Held(plain.queue, profiled.queue)
    setup, floor = paired_floor(plain.replay, between=held)
    before = profiling.collector().stats().by_kind.get(profiling.REPLAY, (0, 0.0))[0]
    with _mode("commands"):
        benchmark.pedantic(
            profiled.replay, setup=setup, rounds=_rounds(benchmark, 300), warmup_rounds=2
        )
        held.release()
    replays = profiling.collector().stats().by_kind.get(profiling.REPLAY, (0, 0.0))[0] - before
    stats = benchmark.stats.stats if benchmark.stats is not None else None
    mine = list(stats.data) if stats is not None else []
    sampled = profiling.collector().stats().sampled
    variants: dict[str, tuple[_Chain, profiling.Mode]] = {
        "plain": (plain, "commands"),
        "none": (unwatched, "none"),
        "bracketed": (bracketed, "summary"),
        "summary": (profiled, "summary"),
        "commands": (profiled, "commands"),
        "twin": (twin, "none"),
        f"plain_{LONG}": (plain_long, "commands"),
        f"bracketed_{LONG}": (bracketed_long, "summary"),
    }
    e2e: dict[str, list[float]] = {}
    n, rounds = (5, 3) if benchmark.disabled else (SUSTAINED, ROUNDS)
    ratios, stamped = {}, {}
    for top, bottom in (
        ("bracketed", "plain"),
        (f"bracketed_{LONG}", f"plain_{LONG}"),
        ("summary", "none"),
        ("none", "plain"),
        ("commands", "none"),
        ("commands", "plain"),
        ("twin", "none"),
    ):
        watched = profiling.collector().stats().watched  # the bracketed ones: units stamped
        ratios[f"{top}_over_{bottom}"] = _paired_rounds(variants, top, bottom, n, rounds, e2e)
        if top.startswith("bracketed"):
            units = n * rounds
            stamped[f"{top}_stamped"] = (profiling.collector().stats().watched - watched) / units
    driver = interleaved_times(
        {"plain": plain.bare, "profiled": profiled.bare}, _rounds(benchmark, 300), setup=held
    )
    held.release()
    info: dict[str, Any] = {
        "kernels_per_replay": KERNELS,
        "paired_floor_s": min(floor),
        "replays_collected": replays,
        **{f"e2e_{name}_s": statistics.median(t) for name, t in e2e.items()},
        **ratios,
        **stamped,
        "e2e_ratio": ratios["commands_over_plain"],
        "summary_sampled_units": profiling.collector().stats().sampled - sampled,
        "summary_replays": len(e2e["summary"]) * n,
    }
    info["driver_ratio"] = min(driver["profiled"]) / min(driver["plain"])
    if mine:
        info["ratio_min"] = min(mine) / min(floor)
        info["ratio_median"] = statistics.median(mine) / statistics.median(floor)
        info["netcl_over_driver"] = info["ratio_min"] / info["driver_ratio"]
    benchmark.extra_info.update(info)
    print("\nprofiled vs plain replay:", {k: round(v, 9) for k, v in info.items()})
    # every profiled round's device time reached the collector (disabled: pedantic runs once)
    assert replays >= (1 if benchmark.disabled else 3)


@pytest.mark.parametrize("variant", ["commands", "summary", "bracketed"])
@pytest.mark.benchmark(group="device-time")
def test_device_duration_matches_raw_events(benchmark: Any, ctx: cl.Context, variant: str) -> None:
    pq = cl.CommandQueue(ctx, properties=_PROFILING)
    queue = cl.CommandQueue(ctx) if variant == "bracketed" else pq
    mode: profiling.Mode = "commands" if variant == "commands" else "summary"
    gpu = bool(queue.device.type & cl.device_type.GPU)
    # kernels long enough for the gaps between them (a summary's envelope holds them) to stay
    # small: on the H200 256 iterations gave ~12 µs kernels and 20-30% gaps, so 4096 (~200 µs);
    # on PoCL 256 (~0.6 ms each on the 2-core machine, where a loaded core stretches the gaps)
    size, iters = (1 << 20, 4096) if gpu else (1 << 12, 256)
    # summary: every replay as a summary; on a plain queue, every replay stamped
    with _mode(mode, sample_budget=0.0, stamp_budget=math.inf):
        chain = _Chain(queue, size, iters)
        by_hand = chain if queue is pq else _Chain(pq, size, iters)
        _matches_raw_events(benchmark, chain, by_hand, variant)


def _matches_raw_events(benchmark: Any, chain: _Chain, by_hand: _Chain, mode: str) -> None:
    queue, pq = chain.queue, by_hand.queue
    chain.replay()
    queue.finish()
    profiling.flush(10.0)
    raw: list[int] = []
    envelope: list[int] = []
    reported: list[float] = []

    def one() -> None:
        # by hand: the same 64 kernels, their device time summed from the raw timestamps
        events = by_hand.by_hand()
        pq.finish()
        raw.append(sum(e.profile.end - e.profile.start for e in events))
        envelope.append(events[-1].profile.end - events[0].profile.start)
        count, total = profiling.collector().stats().by_kind.get(profiling.REPLAY, (0, 0.0))
        chain.replay()
        queue.finish()
        assert profiling.flush(10.0) == 0
        count2, total2 = profiling.collector().stats().by_kind[profiling.REPLAY]
        assert count2 == count + 1
        reported.append(total2 - total)

    benchmark.pedantic(one, rounds=_rounds(benchmark, REPEATS), warmup_rounds=1)
    raw_s = statistics.median(raw) / 1e9
    netcl_s = statistics.median(reported)
    info = {
        "device": queue.device.name.strip(),
        "mode": mode,
        "kernels_per_replay": KERNELS,
        "raw_event_sum_s": raw_s,
        "raw_envelope_s": statistics.median(envelope) / 1e9,
        "netcl_device_duration_s": netcl_s,
        # within each round (the same machine state: a loaded CPU device stretches both)
        "ratio": statistics.median(r / (w / 1e9) for r, w in zip(reported, raw, strict=True)),
        "ratio_of_medians": netcl_s / raw_s,
        "rounds": len(raw),
    }
    benchmark.extra_info.update(info)
    print(
        f"\n{info['device']}, {mode}: netcl replay device duration {netcl_s * 1e3:.4f} ms, "
        f"raw event sum by hand {raw_s * 1e3:.4f} ms, ratio {info['ratio']:.4f} (medians of "
        f"{len(raw)} rounds; raw envelope {info['raw_envelope_s'] * 1e3:.4f} ms)"
    )
