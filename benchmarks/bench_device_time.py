"""Device time of replays: what profiling costs the replay, and whether the device duration netcl
reports agrees with the device's own event timestamps.

1. ``test_replay_profiled`` times a replay of a capture recorded on a profiling queue, paired
   with a replay of the same kernel sequence captured on a plain queue of the same context (the
   floor, timed right before each round). Host time of the enqueue, the queue held behind a user
   event while the round enqueues (as in bench_capture.py). ``extra_info``: the ratio of the
   fastest rounds (target <= 1.10) and of the medians; ``e2e_ratio``: the time per replay of a
   sustained loop of replay + finish, with the collection of the device time (the collector's
   thread and a final ``profiling.flush``) included, against the same loop on the plain queue.
   ``driver_ratio``: the driver's own share, the same 64 launches enqueued by hand (events
   dropped, as a plain replay does) on the profiling queue against the plain one, interleaved
   round by round with the queues held; ``netcl_over_driver``: ``ratio_min`` over it, what
   netcl adds on top of what the driver charges for timestamps.
2. ``test_device_duration_matches_raw_events`` replays a capture of 64 kernels ``REPEATS`` times
   and reads the device duration netcl recorded (the collector's ``REPLAY`` totals); in the same
   run it enqueues the same 64 kernels by hand on the same queue and sums ``end - start`` of their
   events. It prints both per-replay figures and their ratio (target within 5% on a GPU) and
   stores them in ``extra_info``.
"""

from __future__ import annotations

import statistics
import sys
import time
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
REPEATS = 20
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
    """``KERNELS`` launches of ``work`` on one queue: by hand, and as a capture."""

    def __init__(self, queue: cl.CommandQueue, size: int, iters: int) -> None:
        ctx = queue.context
        self.queue, self.size = queue, size
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
        return [cl.enqueue_nd_range_kernel(q, k, size, None) for _ in range(KERNELS)]

    def bare(self) -> None:
        """The launches by hand, each event dropped at once (the driver's floor)."""
        q, k, size = self.queue, self.kernel, (self.size,)
        for _ in range(KERNELS):
            cl.enqueue_nd_range_kernel(q, k, size, None)

    def replay(self) -> None:
        self.capture.replay()


class _Held(HeldQueues):
    """Round setup: hold the queues (see HeldQueues); releasing also collects the device time
    of the round, so collection never falls into a timed round."""

    def release(self) -> None:
        super().release()
        profiling.flush(5.0)


@pytest.fixture(scope="module")
def chains(ctx: cl.Context) -> tuple[_Chain, _Chain]:
    plain = cl.CommandQueue(ctx)
    profiled = cl.CommandQueue(ctx, properties=_PROFILING)
    return _Chain(plain, 256, 1), _Chain(profiled, 256, 1)


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


@pytest.mark.benchmark(group="device-time")
def test_replay_profiled(benchmark: Any, chains: tuple[_Chain, _Chain]) -> None:
    plain, profiled = chains
    assert profiling.enabled(profiled.queue) and not profiling.enabled(plain.queue)
    held = _Held(plain.queue, profiled.queue)
    setup, floor = paired_floor(plain.replay, between=held)
    before = profiling.collector().stats().by_kind.get(profiling.REPLAY, (0, 0.0))[0]
    benchmark.pedantic(profiled.replay, setup=setup, rounds=_rounds(benchmark, 300),
                       warmup_rounds=2)  # fmt: skip
    held.release()
    replays = profiling.collector().stats().by_kind.get(profiling.REPLAY, (0, 0.0))[0] - before
    stats = benchmark.stats.stats if benchmark.stats is not None else None
    mine = list(stats.data) if stats is not None else []
    n = 5 if benchmark.disabled else 200
    e2e_plain, e2e_profiled = _sustained(plain, n), _sustained(profiled, n)
    driver = interleaved_times({"plain": plain.bare, "profiled": profiled.bare},
                               _rounds(benchmark, 300), setup=held)
    held.release()
    info = {
        "kernels_per_replay": KERNELS,
        "paired_floor_s": min(floor),
        "replays_collected": replays,
        "e2e_plain_s": e2e_plain,
        "e2e_profiled_s": e2e_profiled,
        "e2e_ratio": e2e_profiled / e2e_plain,
    }
    info["driver_ratio"] = min(driver["profiled"]) / min(driver["plain"])
    if mine:
        info["ratio_min"] = min(mine) / min(floor)
        info["ratio_median"] = statistics.median(mine) / statistics.median(floor)
        info["netcl_over_driver"] = info["ratio_min"] / info["driver_ratio"]
    benchmark.extra_info.update(info)
    print("\nprofiled vs plain replay:", {k: round(v, 9) for k, v in info.items()})
    assert replays >= 3  # every profiled round's device time reached the collector


@pytest.mark.benchmark(group="device-time")
def test_device_duration_matches_raw_events(benchmark: Any, ctx: cl.Context) -> None:
    queue = cl.CommandQueue(ctx, properties=_PROFILING)
    gpu = bool(queue.device.type & cl.device_type.GPU)
    # each kernel a few tens of µs on either device, so launch gaps do not dominate
    chain = _Chain(queue, 1 << 20 if gpu else 1 << 12, 256 if gpu else 64)
    chain.replay()
    queue.finish()
    profiling.flush(10.0)
    raw: list[int] = []
    reported: list[float] = []

    def one() -> None:
        # by hand: the same 64 kernels, their device time summed from the raw timestamps
        events = chain.by_hand()
        queue.finish()
        raw.append(sum(e.profile.end - e.profile.start for e in events))
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
        "kernels_per_replay": KERNELS,
        "raw_event_sum_s": raw_s,
        "netcl_device_duration_s": netcl_s,
        "ratio": netcl_s / raw_s,
        "rounds": len(raw),
    }
    benchmark.extra_info.update(info)
    print(f"\n{info['device']}: netcl replay device duration {netcl_s * 1e3:.4f} ms, raw event "
          f"sum by hand {raw_s * 1e3:.4f} ms, ratio {netcl_s / raw_s:.4f} (medians of "
          f"{len(raw)} rounds)")  # fmt: skip
