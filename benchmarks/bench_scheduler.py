"""Scheduler overhead per op against calling the same callables by hand.

Target: at most 3 µs of host time per op with no OpenTelemetry SDK configured. Each scheduler
benchmark also times its hand-written twin in the same process (median of short repeats) and puts
``overhead_us_per_op`` and ``ratio_vs_hand`` in ``extra_info``; the twins are benchmarks of their
own too, so a ratio gate can read both medians from the JSON.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

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
    benchmark.extra_info["target_overhead_us_per_op"] = 3.0


# --- host overhead: trivial callables ----------------------------------------------------------

HOST_CALLABLES = [_noop] * HOST_OPS


def _hand_host() -> None:
    for fn in HOST_CALLABLES:
        fn()


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
def test_scheduler_host_callables_plan_per_op(benchmark: Any) -> None:
    assert _scheduler_host_plan_per_op() == []
    benchmark(_scheduler_host_plan_per_op)
    _record(benchmark, _scheduler_host_plan_per_op, _hand_host, HOST_OPS)


@pytest.mark.benchmark(group="scheduler-host-overhead")
def test_scheduler_host_callables_shared_plans(benchmark: Any) -> None:
    assert _scheduler_host_shared_plans() == []
    benchmark(_scheduler_host_shared_plans)
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
    benchmark(run)
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
