"""Candidate ways of stamping summary device time on a plain queue, side by side (issue #61).

Each candidate times a unit of ``KERNELS`` small launches on a plain in-order queue, stamped on a
profiling side queue the way the candidate says, then a ``finish`` (the sustained loop of
bench_device_time.py's ``bracketed_over_plain``), against the same loop unstamped: ``ROUNDS``
rounds of ``UNITS`` units of both, in turn first (ABBA), the median of the ratios within each
round. ``host_us``: the median host time per unit spent in the stamping calls alone.

    python benchmarks/stamp_candidates.py [kernels ...]   # default 64 256

``NETCL_STAMP_UNITS`` (100) and ``NETCL_STAMP_ROUNDS`` (101) set the size of a block and the
number of rounds.

Candidates (``begin`` before the unit's launches, ``end`` after them):
- ``bracket``: what netcl did before #61: begin = a marker on the queue, a flush, a stamp kernel
  on the side queue waiting for the marker, a flush of the side queue, a barrier on the queue
  waiting for the stamp; end = a flush, a stamp waiting for the last launch, a flush.
- ``two_flushes``: the same commands, flushing only the side queue (the queue is flushed by the
  ``finish``, or the next flush, that follows).
- ``no_hold``: begin = a stamp on the side queue that waits for nothing (nothing holds the
  unit's launches behind it); end as ``bracket``.
- ``shared``: one stamp per unit, its end (the start of the next unit is the end of this one,
  right only where nothing ran between two units: here the device idles between them, so this
  is the cost of shared stamps, not a valid reading of this loop).
- ``sampled_N``: ``bracket`` on one unit in N (random, chance 1/N), nothing on the others.

Measured 2026-12-07 (over plain, at 64 kernels | at 256; benchmarks/results is full, so here):
- NVIDIA H200, driver 580.159.04, ``NETCL_STAMP_ROUNDS=15 NETCL_STAMP_UNITS=50``: bracket 1.100 |
  1.025 (stamping calls 39 µs a unit), two_flushes 1.091 | 1.014, no_hold 1.090 | 1.031, shared
  1.044 | 0.998, sampled_4 1.036 | 1.010, sampled_8 1.021 | 1.007, plain_twin 0.993 | 0.994.
- PoCL on the shared 2-core Xeon runner (load 1.3-4.6, ``nice -n 10``), defaults: bracket 1.175 |
  1.024 (73 µs a unit), two_flushes 1.136 | 1.046, no_hold 1.042 | 1.030, shared 1.041 | 1.029,
  sampled_4 1.062 | 1.016, sampled_8 1.035 | 1.000, plain_twin 0.989 | 0.999.
What was chosen and why: docs/guides/core.md, Stamps sampled.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import pyopencl as cl

KERNELS = (64, 256)
UNITS = int(os.environ.get("NETCL_STAMP_UNITS", "100"))  # units a block
ROUNDS = int(os.environ.get("NETCL_STAMP_ROUNDS", "101"))
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE
SRC = """
__kernel void work(__global float *a, const int n) {
    int i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < n; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
__kernel void netcl_stamp(void) {}
"""


class _Loop:
    """A plain queue, its side queue, the work and stamp kernels; one unit per call."""

    def __init__(self, ctx: cl.Context, kernels: int) -> None:
        self.q = cl.CommandQueue(ctx)
        self.side = cl.CommandQueue(ctx, properties=_PROFILING)
        prg = cl.Program(ctx, SRC).build()
        self.work, self.stamp = cl.Kernel(prg, "work"), cl.Kernel(prg, "netcl_stamp")
        self.buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 256)
        cl.enqueue_fill_buffer(self.q, self.buf, np.float32(1.0), 0, 4 * 256)
        self.work.set_args(self.buf, np.int32(1))
        self.kernels, self.host = kernels, 0.0
        self.q.finish()

    def launches(self) -> cl.Event:
        q, k = self.q, self.work
        for _ in range(self.kernels - 1):
            cl.enqueue_nd_range_kernel(q, k, (256,), None)
        return cl.enqueue_nd_range_kernel(q, k, (256,), None)

    def _stamp(self, after: list[cl.Event] | None) -> cl.Event:
        return cl.enqueue_nd_range_kernel(self.side, self.stamp, (1,), None, wait_for=after)

    def plain(self) -> None:
        self.launches()
        self.q.finish()

    def _held_begin(self, flush: bool) -> None:
        marker = cl.enqueue_marker(self.q)
        if flush:
            self.q.flush()
        stamp = self._stamp([marker])
        self.side.flush()
        cl.enqueue_barrier(self.q, wait_for=[stamp])

    def _end(self, last: cl.Event, flush: bool) -> None:
        if flush:
            self.q.flush()
        self._stamp([last])
        self.side.flush()

    def _timed(self, begin: Callable[[], None] | None, end: Callable[[cl.Event], None]) -> None:
        t0 = time.perf_counter()
        if begin is not None:
            begin()
        t1 = time.perf_counter()
        last = self.launches()
        t2 = time.perf_counter()
        end(last)
        self.host += time.perf_counter() - t2 + t1 - t0
        self.q.finish()

    def bracket(self) -> None:
        self._timed(lambda: self._held_begin(True), lambda e: self._end(e, True))

    def two_flushes(self) -> None:
        self._timed(lambda: self._held_begin(False), lambda e: self._end(e, False))

    def no_hold(self) -> None:
        def begin() -> None:
            self._stamp(None)
            self.side.flush()

        self._timed(begin, lambda e: self._end(e, True))

    def shared(self) -> None:
        self._timed(None, lambda e: self._end(e, True))

    def sampled(self, n: int) -> Callable[[], None]:
        def unit() -> None:
            if random.random() * n < 1:
                self.bracket()
            else:
                self.plain()

        return unit


def _block(fn: Callable[[], None], units: int) -> float:
    t0 = time.perf_counter()
    for _ in range(units):
        fn()
    return (time.perf_counter() - t0) / units


def main(kernels: tuple[int, ...]) -> None:
    ctx = cl.create_some_context(interactive=False)
    print(f"device: {ctx.devices[0].name.strip()} ({ctx.devices[0].platform.name})", flush=True)
    for n in kernels:
        loop = _Loop(ctx, n)
        candidates = {
            "bracket": loop.bracket,
            "two_flushes": loop.two_flushes,
            "no_hold": loop.no_hold,
            "shared": loop.shared,
            "sampled_4": loop.sampled(4),
            "sampled_8": loop.sampled(8),
            "plain_twin": loop.plain,  # the A/A control: plain against plain
        }
        for name, fn in candidates.items():
            _block(fn, 5)  # warm-up
            loop.host, ratios = 0.0, []
            for r in range(ROUNDS):
                pair = (fn, loop.plain) if r % 2 == 0 else (loop.plain, fn)
                a, b = (_block(f, UNITS) for f in pair)
                ratios.append(a / b if r % 2 == 0 else b / a)
            host_us = loop.host / (ROUNDS * UNITS) * 1e6
            q = statistics.quantiles(ratios, n=4)
            print(
                f"{n:4d} kernels  {name:12s} over plain {statistics.median(ratios):.3f} "
                f"(quartiles {q[0]:.3f}-{q[2]:.3f}), stamping calls {host_us:6.1f} µs a unit",
                flush=True,
            )


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or KERNELS)
