"""submit from several threads."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pyopencl as cl

from netcl.runtime.scheduler import ExecutionPlan, Scheduler

THREADS = 8
PER_THREAD = 250


def test_concurrent_submits_lose_nothing() -> None:
    sched = Scheduler()
    shared = [ExecutionPlan(description=f"shared {k}") for k in range(4)]
    ran: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def record(t: int, i: int) -> None:
        with lock:
            ran[(t, i)] += 1

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(PER_THREAD):
            op = lambda t=t, i=i: record(t, i)  # noqa: E731
            if i % 2:
                sched.submit(op, plan=shared[i % 4])
            else:
                sched.submit(op)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()

    plans = sched.plans
    assert sum(len(p.ops) for p in plans) == THREADS * PER_THREAD
    assert len({id(p) for p in plans}) == len(plans)  # each plan scheduled once
    assert len(plans) == THREADS * PER_THREAD // 2 + 2  # new plans + shared 1 and 3 (odd i)
    sched.run()
    assert len(ran) == THREADS * PER_THREAD and set(ran.values()) == {1}


def test_submits_while_another_thread_runs(queue: cl.CommandQueue, kernels: object) -> None:
    n = 256
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, n * 4)
    sched = Scheduler()
    done = threading.Event()
    submitted = 0

    def producer() -> None:
        nonlocal submitted
        for _ in range(300):
            sched.submit(lambda: kernels.scale(queue, (n,), None, buf, np.float32(1)))
            submitted += 1
        done.set()

    events: list[cl.Event] = []
    th = threading.Thread(target=producer)
    th.start()
    while not done.is_set():
        events += sched.run()
    th.join()
    events += sched.run()
    assert submitted == 300
    assert len(events) == 300  # every op ran exactly once, in one run or another
    assert len({e.int_ptr for e in events}) == 300
