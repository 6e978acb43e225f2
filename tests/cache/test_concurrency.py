"""Many processes on one folder: no torn reads, one compile per key, correct kernels."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyopencl as cl
import pytest

from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._entry import decode
from netcl.runtime.cache._program_cache import MemoryEntry, MemoryTier

WORKER = textwrap.dedent("""
    import json, sys, time
    import numpy as np, pyopencl as cl
    from netcl.core import device
    from netcl.runtime.cache import ProgramCache

    root, me, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    ctx = device.default_context(); dev = ctx.devices[0]; q = cl.CommandQueue(ctx)
    K = ("__kernel void add(__global const float *a, __global float *c) "
         "{{ int i = get_global_id(0); c[i] = a[i] + {v}f; }}  // {tag}")
    shared = [K.format(v=float(k), tag=f"shared-{k}") for k in range(3)]
    own = K.format(v=100.0 + me, tag=f"own-{me}")
    a = np.arange(32, dtype=np.float32)
    totals = {}
    time.sleep(max(0.0, go - time.time()))  # start together
    for r in range(rounds):
        c = ProgramCache(root)  # fresh instance each round: every lookup goes to disk
        for src, v in [(s, float(k)) for k, s in enumerate(shared)] + [(own, 100.0 + me)]:
            prg = c.get_program(ctx, src, dev)
            mf = cl.mem_flags
            da = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
            dc = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
            cl.Kernel(prg, "add")(q, (32,), None, da, dc)
            out = np.empty_like(a); cl.enqueue_copy(q, out, dc)
            assert np.allclose(out, a + v), (me, r, v)
        for k, n in c.stats.as_dict().items():
            totals[k] = totals.get(k, 0) + n
    print(json.dumps(totals))
""")


@pytest.mark.slow
def test_processes_share_one_folder(cache_dir: Path) -> None:
    import time

    procs = 5
    go = time.time() + 4.0  # after every worker has imported pyopencl and made its context
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(cache_dir), str(i), "4", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    results = []
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        results.append(json.loads(out))
    total = {k: sum(r[k] for r in results) for k in results[0]}
    # the 3 shared keys were compiled once each in all processes together, plus one own key
    # per process: the others waited on the lock and loaded the binary
    assert total["compiles"] == 3 + procs, total
    assert total["corrupt"] == 0 and total["recoveries"] == 0  # never a torn or partial read
    assert total["lock_timeouts"] == 0 and total["write_errors"] == 0
    assert total["disk_hits"] == procs * 4 * 4 - total["compiles"]
    files = ProgramCache(cache_dir).entries()
    assert len(files) == 3 + procs
    for f in files:
        decode(f.path.read_bytes(), f.key)  # every file complete and checksummed
    assert not [p for p in os.listdir(cache_dir / "programs") if p.endswith(".tmp")]


def test_threads_share_one_instance(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    c = ProgramCache(cache_dir)
    src = add_src(6.0, "threads")
    got: list[cl.Program] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            got.append(c.get_program(ctx, src, device))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({id(p) for p in got}) == 1  # one build, shared
    assert c.stats.compiles == 1 and c.stats.memory_hits == 5
    check_add(got[0], 6.0)


@pytest.mark.slow
def test_processes_meet_a_fifo_entry(ctx: cl.Context, device: cl.Device, cache_dir: Path) -> None:
    """A FIFO planted at a shared entry's path: no process waits on it, exactly one rebuilds it,
    every kernel is right."""
    import time

    shared0 = (
        "__kernel void add(__global const float *a, __global float *c) "
        "{ int i = get_global_id(0); c[i] = a[i] + 0.0f; }  // shared-0"
    )
    c = ProgramCache(cache_dir)
    c.get_program(ctx, shared0, device)
    (entry,) = c.entries()
    entry.path.unlink()
    os.mkfifo(entry.path)
    procs = 4
    go = time.time() + 4.0
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(cache_dir), str(i), "2", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    results = []
    for w in workers:
        out, err = w.communicate(timeout=120)  # a blocking read would never return
        assert w.returncode == 0, err
        results.append(json.loads(out))
    total = {k: sum(r[k] for r in results) for k in results[0]}
    assert total["recoveries"] == 1, total  # rebuilt once, by one process
    assert total["corrupt"] >= 1 and total["write_errors"] == 0
    assert total["compiles"] == 1 + 2 + procs, total  # shared-0 again, shared-1/2, one own each
    assert entry.path.is_file() and not entry.path.is_symlink()
    decode(entry.path.read_bytes(), entry.key)


def test_dropping_dead_contexts_never_waits_for_the_tier_lock() -> None:
    """``drop_dead_contexts`` (run by the garbage collector, in any thread) returns at once while
    another thread holds the memory tier's lock, leaving the purge to the next insertion."""
    tier = MemoryTier(4)
    tier._lock.acquire()
    try:
        t = threading.Thread(target=tier.drop_dead_contexts, daemon=True)
        t.start()
        t.join(timeout=5)
        assert not t.is_alive()  # did not block on the lock
        assert tier._dead_pending
    finally:
        tier._lock.release()
    t.join(timeout=5)
    tier.drop_dead_contexts()  # free lock: purged now
    assert not tier._dead_pending


def test_the_memory_tier_gives_a_used_program_a_second_chance_and_forgets_a_dead_context(
    ctx: cl.Context, device: cl.Device, add_src: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``max_programs`` the oldest program goes unless it was used since the hand last
    passed (then the next one goes and it stays, unused now); the programs of a context that is
    collected go with it, quietly (no error in the garbage collector's callback)."""
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    tier = MemoryTier(2)
    prg = cl.Program(ctx, add_src(0.0, "tier")).build()
    first, second, third = (MemoryEntry(prg, k) for k in ("k1", "k2", "k3"))
    first.used = True
    for e in (first, second, third):
        tier.remember((weakref.ref(ctx), device, e.key, ""), ctx, e)
    assert [e.key for e in tier.entries.values()] == ["k3", "k1"]  # k1 moved to the end
    assert tier.entries[(weakref.ref(ctx), device, "k1", "")] is first and not first.used
    other = cl.Context(devices=[device])
    tier.remember((weakref.ref(other), device, "k4", ""), other, MemoryEntry(prg, "k4"))
    assert len(tier.entries) == 2
    del other
    gc.collect()
    assert [e.key for e in tier.entries.values()] == ["k1"]  # k4's context is gone
    assert unraisable == []
