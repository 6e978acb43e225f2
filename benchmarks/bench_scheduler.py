"""Scheduler overhead per op against calling the same callables by hand, and a copy-in /
compute / copy-out pipeline ordered four ways.

Target: at most 1.5 µs of host time per op with no OpenTelemetry SDK configured (PoCL's CPU
host; ``submit(fn)`` with a new plan per op and one ``run``, against calling the same callables
by hand: ``test_scheduler_host_callables_plan_per_op``). Each scheduler benchmark also times its
hand-written twin in the same process (median of short repeats) and puts ``overhead_us_per_op``
and ``ratio_vs_hand`` in ``extra_info``; the twins are benchmarks of their own too. The gate
judges the scheduler against a floor timed right before each of its rounds (paired rounds,
paired.py), so that its limits hold on a slow runner and a fast one alike: for host callables,
the bookkeeping any scheduler needs done by hand (a plan record per op kept in order under a
lock, then every op called and its events collected), which costs what the scheduler's own
Python costs on each CPU; for kernels, the same launches waited by hand.

Pipeline (``test_pipeline_*``): ``NETCL_BENCH_PIPELINE_CHUNKS`` chunks (default 8) of
``NETCL_BENCH_PIPELINE_MB`` MB (default 32 on a GPU, 1 elsewhere: a GPU moves 1 MB faster than
the host can enqueue it, and the figures would time the host) go host -> device, through a
kernel and back, on three in-order queues: all on one queue, ``Scheduler`` sync mode (a plan per
stage), device-ordered plans (async mode, ``queue`` + ``after``) and events chained by hand. The
kernel's work per element is calibrated so that a kernel takes about 1.3x a copy
(``NETCL_BENCH_PIPELINE_ITERS`` sets it). Each variant stores ``speedup_vs_one_queue`` and
``ratio_vs_hand_chained``, paired in the same process. Target: device-ordered plans as fast as
hand-chained events (ratio 1; on a GPU, at least 1.7x one queue). On a 2-core CPU nothing
overlaps, so only the ratio to the hand-chained run means something there.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from paired import paired_floor, record_floor

HOST_OPS = 1000  # trivial callables: the scheduler's own cost, nothing else
KERNEL_PLANS = 4
KERNEL_OPS_PER_PLAN = 50  # kernel launches that return events, waited per plan (sync mode)
N = 256

SOURCE = "__kernel void add(__global float *a, __global const float *b) {"
SOURCE += " int i = get_global_id(0); a[i] += b[i]; }"


def _noop() -> None:
    return None


def _paired_medians(
    a: Callable[[], object], b: Callable[[], object], repeats: int = 41
) -> tuple[float, float]:
    """Median seconds of ``a`` and ``b``, run alternately so that load from other processes on
    a shared machine hits both alike."""
    a(), b()  # warm up
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(repeats):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def _record(
    benchmark: Any, sched_fn: Callable[[], object], hand_fn: Callable[[], object], ops: int
) -> None:
    """Time the scheduler and the hand version here, paired, and store the per-op overhead."""
    hand, sched = _paired_medians(hand_fn, sched_fn)
    benchmark.extra_info["ops"] = ops
    benchmark.extra_info["hand_us_per_op"] = round(hand / ops * 1e6, 3)
    benchmark.extra_info["scheduler_us_per_op"] = round(sched / ops * 1e6, 3)
    benchmark.extra_info["overhead_us_per_op"] = round((sched - hand) / ops * 1e6, 3)
    benchmark.extra_info["ratio_vs_hand"] = round(sched / hand, 3)
    benchmark.extra_info["target_overhead_us_per_op"] = 1.5


# --- host overhead: trivial callables ----------------------------------------------------------

HOST_CALLABLES = [_noop] * HOST_OPS


def _hand_host() -> None:
    for fn in HOST_CALLABLES:
        fn()


class _HandPlan:
    __slots__ = ("ops",)

    def __init__(self, ops: list[Callable[[], object]]) -> None:
        self.ops = ops


def _hand_bookkeeping() -> list[Any]:
    """The floor of a scheduler run with a plan per op: a plan record per op kept in submission
    order under a lock, then every op called and its non-None results collected."""
    lock = threading.Lock()
    plans: dict[int, _HandPlan] = {}
    for fn in HOST_CALLABLES:
        plan = _HandPlan([fn])
        with lock:
            plans[id(plan)] = plan
    events = []
    for plan in list(plans.values()):
        for op in plan.ops:
            event = op()
            if event is not None:
                events.append(event)
    return events


def _paired(
    benchmark: Any, fn: Callable[[], object], floor: Callable[[], object], rounds: int = 200
) -> None:
    """``fn``'s rounds, each after one of ``floor`` (paired rounds: paired.py)."""
    setup, times = paired_floor(floor)
    benchmark.pedantic(fn, setup=setup, rounds=1 if benchmark.disabled else rounds, warmup_rounds=2)
    record_floor(benchmark, times)


def _scheduler_host_plan_per_op() -> list[Any]:
    sched = Scheduler()
    submit = sched.submit
    for fn in HOST_CALLABLES:
        submit(fn)  # a new plan per op: the worst case for bookkeeping
    return sched.run()


def _scheduler_host_shared_plans() -> list[Any]:
    sched = Scheduler()
    plans = [ExecutionPlan(description=f"p{k}") for k in range(10)]
    submit = sched.submit
    for i, fn in enumerate(HOST_CALLABLES):
        submit(fn, plan=plans[i % 10])
    return sched.run()


@pytest.mark.benchmark(group="scheduler-host-overhead")
def test_hand_host_callables(benchmark: Any) -> None:
    benchmark(_hand_host)


@pytest.mark.benchmark(group="scheduler-host-overhead")
def test_hand_host_bookkeeping(benchmark: Any) -> None:
    """The scheduler's paired floor on its own (the gate reads it only in runs saved before the
    scheduler benchmarks timed it in their rounds)."""
    benchmark(_hand_bookkeeping)


@pytest.mark.benchmark(group="scheduler-host-overhead")
def test_scheduler_host_callables_plan_per_op(benchmark: Any) -> None:
    assert _scheduler_host_plan_per_op() == [] == _hand_bookkeeping()
    _paired(benchmark, _scheduler_host_plan_per_op, _hand_bookkeeping)
    _record(benchmark, _scheduler_host_plan_per_op, _hand_host, HOST_OPS)


@pytest.mark.benchmark(group="scheduler-host-overhead")
def test_scheduler_host_callables_shared_plans(benchmark: Any) -> None:
    assert _scheduler_host_shared_plans() == []
    _paired(benchmark, _scheduler_host_shared_plans, _hand_bookkeeping)
    _record(benchmark, _scheduler_host_shared_plans, _hand_host, HOST_OPS)


# --- kernel launches returning events ----------------------------------------------------------


class _Kernels:
    def __init__(self, queue: cl.CommandQueue) -> None:
        ctx = queue.context
        self.queue = queue
        self.knl = cl.Kernel(cl.Program(ctx, SOURCE).build(), "add")
        host = np.ones(N, dtype=np.float32)
        mf = cl.mem_flags
        self.a = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros_like(host))
        self.b = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
        self.knl.set_args(self.a, self.b)
        self.launches = 0

    def launch(self) -> cl.Event:
        self.launches += 1
        return cl.enqueue_nd_range_kernel(self.queue, self.knl, (N,), None)

    def check(self) -> None:
        out = np.empty(N, dtype=np.float32)
        cl.enqueue_copy(self.queue, out, self.a)
        np.testing.assert_array_equal(out, np.full(N, self.launches, dtype=np.float32))


@pytest.fixture(scope="module")
def kern(queue: cl.CommandQueue) -> _Kernels:
    return _Kernels(queue)


def _hand_kernels_sync(k: _Kernels) -> Callable[[], None]:
    def run() -> None:
        for _ in range(KERNEL_PLANS):
            cl.wait_for_events([k.launch() for _ in range(KERNEL_OPS_PER_PLAN)])

    return run


def _scheduler_kernels(k: _Kernels, async_mode: bool) -> Callable[[], list[Any]]:
    def run() -> list[Any]:
        sched = Scheduler(async_mode=async_mode)
        for _ in range(KERNEL_PLANS):
            plan = ExecutionPlan()
            for _ in range(KERNEL_OPS_PER_PLAN):
                sched.submit(k.launch, plan=plan)
        return sched.run()

    return run


def _hand_kernels_async(k: _Kernels) -> Callable[[], None]:
    def run() -> None:
        cl.wait_for_events([k.launch() for _ in range(KERNEL_PLANS * KERNEL_OPS_PER_PLAN)])

    return run


@pytest.mark.benchmark(group="scheduler-kernel-overhead")
def test_hand_kernels_sync(benchmark: Any, kern: _Kernels) -> None:
    benchmark(_hand_kernels_sync(kern))
    kern.check()


def _bench_scheduler_kernels(
    benchmark: Any, k: _Kernels, async_mode: bool, hand: Callable[[], None]
) -> None:
    ops = KERNEL_PLANS * KERNEL_OPS_PER_PLAN
    run = _scheduler_kernels(k, async_mode)
    assert len(run()) == ops
    _paired(benchmark, run, hand, rounds=50)
    _record(benchmark, run, hand, ops)
    k.check()


@pytest.mark.benchmark(group="scheduler-kernel-overhead")
def test_scheduler_kernels_sync(benchmark: Any, kern: _Kernels) -> None:
    _bench_scheduler_kernels(benchmark, kern, False, _hand_kernels_sync(kern))


@pytest.mark.benchmark(group="scheduler-kernel-overhead")
def test_hand_kernels_async(benchmark: Any, kern: _Kernels) -> None:
    benchmark(_hand_kernels_async(kern))
    kern.check()


@pytest.mark.benchmark(group="scheduler-kernel-overhead")
def test_scheduler_kernels_async(benchmark: Any, kern: _Kernels) -> None:
    _bench_scheduler_kernels(benchmark, kern, True, _hand_kernels_async(kern))


# --- pipeline: copy in / compute / copy out over chunks on three queues ------------------------

PIPELINE_CHUNKS = int(os.environ.get("NETCL_BENCH_PIPELINE_CHUNKS", "8"))


def _chunk_mb(device: cl.Device) -> float:
    gpu = bool(device.type & cl.device_type.GPU)
    return float(os.environ.get("NETCL_BENCH_PIPELINE_MB", "32" if gpu else "1"))


PIPELINE_SOURCE = """
__kernel void work(__global float *a, int iters) {
    size_t i = get_global_id(0);
    float x = a[i];
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 0.5f;
    a[i] = x;
}
"""


def _median_s(fn: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _Pipeline:
    def __init__(self, ctx: cl.Context) -> None:
        mf = cl.mem_flags
        self.queues = [cl.CommandQueue(ctx) for _ in range(3)]
        self.mb = _chunk_mb(ctx.devices[0])
        self.n = n = max(1, int(self.mb * 2**20) // 4)
        self.knl = cl.Kernel(cl.Program(ctx, PIPELINE_SOURCE).build(), "work")
        q = self.queues[0]
        # pinned host memory (ALLOC_HOST_PTR, mapped): what lets a GPU copy while it computes
        self._pinned: list[cl.Buffer] = []
        self.host_in: list[np.ndarray[Any, Any]] = []
        self.host_out: list[np.ndarray[Any, Any]] = []
        for c in range(PIPELINE_CHUNKS):
            for arrays in (self.host_in, self.host_out):
                buf = cl.Buffer(ctx, mf.READ_WRITE | mf.ALLOC_HOST_PTR, n * 4)
                flags = cl.map_flags.READ | cl.map_flags.WRITE
                array, _ = cl.enqueue_map_buffer(q, buf, flags, 0, (n,), np.float32)
                self._pinned.append(buf)
                arrays.append(array)
            self.host_in[c][:] = np.linspace(0, 1, n, dtype=np.float32) + c
        self.dev = [cl.Buffer(ctx, mf.READ_WRITE, n * 4) for _ in range(PIPELINE_CHUNKS)]
        q.finish()
        self.iters = int(os.environ.get("NETCL_BENCH_PIPELINE_ITERS", "0")) or self._calibrate()

    def _calibrate(self) -> int:
        q, probe = self.queues[0], 64

        def copy() -> None:
            self.copy_in(0, q).wait()

        def kernel() -> None:
            self.knl(q, (self.n,), None, self.dev[0], np.int32(probe)).wait()

        copy(), kernel()
        t_copy, t_kernel = _median_s(copy), _median_s(kernel)
        return max(1, round(probe * 1.3 * t_copy / t_kernel))

    def copy_in(self, c: int, q: cl.CommandQueue, wait_for: Any = None) -> cl.Event:
        return cl.enqueue_copy(
            q, self.dev[c], self.host_in[c], is_blocking=False, wait_for=wait_for
        )

    def compute(self, c: int, q: cl.CommandQueue, wait_for: Any = None) -> cl.Event:
        return self.knl(q, (self.n,), None, self.dev[c], np.int32(self.iters), wait_for=wait_for)

    def copy_out(self, c: int, q: cl.CommandQueue, wait_for: Any = None) -> cl.Event:
        return cl.enqueue_copy(
            q, self.host_out[c], self.dev[c], is_blocking=False, wait_for=wait_for
        )

    def one_queue(self) -> None:
        q = self.queues[0]
        for c in range(PIPELINE_CHUNKS):
            self.copy_in(c, q)
            self.compute(c, q)
            self.copy_out(c, q)
        q.finish()

    def sync_plans(self) -> None:
        sched = Scheduler(async_mode=False)
        qi, qk, qo = self.queues
        for c in range(PIPELINE_CHUNKS):
            sched.submit(functools.partial(self.copy_in, c, qi))
            sched.submit(functools.partial(self.compute, c, qk))
            sched.submit(functools.partial(self.copy_out, c, qo))
        sched.run()

    def device_ordered(self) -> None:
        sched = Scheduler(async_mode=True)
        stages = (self.copy_in, self.compute, self.copy_out)
        for c in range(PIPELINE_CHUNKS):
            prev = None
            for q, stage in zip(self.queues, stages, strict=True):
                prev = ExecutionPlan(ops=[functools.partial(stage, c, q)], queue=q, after=prev)
                sched.submit(prev)
        sched.run()

    def hand_chained(self) -> None:
        qi, qk, qo = self.queues
        events = []
        for c in range(PIPELINE_CHUNKS):
            ev = self.copy_in(c, qi)
            ev = self.compute(c, qk, [ev])
            events.append(self.copy_out(c, qo, [ev]))
        cl.wait_for_events(events)

    def check(self, variant: Callable[[], None]) -> None:
        """Run ``variant`` once on cleared outputs and compare every chunk with numpy (on 1024
        elements spread over the chunk: thousands of iterations over 32 MB are slow in numpy)."""
        for out in self.host_out:
            out[:] = -1
        variant()
        sample = np.linspace(0, self.n - 1, min(self.n, 1024)).astype(np.int64)
        for c in range(PIPELINE_CHUNKS):
            x = self.host_in[c][sample]
            for _ in range(self.iters):
                x = x * np.float32(0.999) + np.float32(0.5)
            np.testing.assert_allclose(self.host_out[c][sample], x, rtol=1e-4)


@pytest.fixture(scope="module")
def pipeline(ctx: cl.Context) -> _Pipeline:
    return _Pipeline(ctx)


def _bench_pipeline(benchmark: Any, pipe: _Pipeline, variant: Callable[[], None]) -> None:
    pipe.check(variant)
    benchmark(variant)
    # the variant, one queue and hand-chained events in turn, 21 rounds: ratios are medians of
    # per-round ratios, so load that other processes put on a shared machine cancels out
    rounds: list[tuple[float, float, float]] = []
    for _ in range(21):
        times = []
        for fn in (variant, pipe.one_queue, pipe.hand_chained):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rounds.append((times[0], times[1], times[2]))
    mine, one, hand = (statistics.median(r[k] for r in rounds) for k in range(3))
    benchmark.extra_info.update(
        chunks=PIPELINE_CHUNKS,
        chunk_mb=pipe.mb,
        kernel_iters=pipe.iters,
        wall_ms=round(mine * 1e3, 3),
        one_queue_ms=round(one * 1e3, 3),
        hand_chained_ms=round(hand * 1e3, 3),
        speedup_vs_one_queue=round(statistics.median(o / m for m, o, _ in rounds), 3),
        ratio_vs_hand_chained=round(statistics.median(m / h for m, _, h in rounds), 3),
        target_ratio_vs_hand_chained=1.0,
    )


@pytest.mark.benchmark(group="scheduler-pipeline")
def test_pipeline_one_queue(benchmark: Any, pipeline: _Pipeline) -> None:
    _bench_pipeline(benchmark, pipeline, pipeline.one_queue)


@pytest.mark.benchmark(group="scheduler-pipeline")
def test_pipeline_sync_plans(benchmark: Any, pipeline: _Pipeline) -> None:
    _bench_pipeline(benchmark, pipeline, pipeline.sync_plans)


@pytest.mark.benchmark(group="scheduler-pipeline")
def test_pipeline_device_ordered_plans(benchmark: Any, pipeline: _Pipeline) -> None:
    _bench_pipeline(benchmark, pipeline, pipeline.device_ordered)


@pytest.mark.benchmark(group="scheduler-pipeline")
def test_pipeline_hand_chained_events(benchmark: Any, pipeline: _Pipeline) -> None:
    _bench_pipeline(benchmark, pipeline, pipeline.hand_chained)
