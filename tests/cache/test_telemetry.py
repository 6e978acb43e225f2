"""Spans and metrics as docs/guides/cache.md (Telemetry) names them, with the in-memory exporters;
the no-SDK hit path."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.runtime.cache import ProgramBuildError, ProgramCache


def _lookups(metric_points: Callable[[str], list[Any]]) -> dict[str, int]:
    return {
        p.attributes["netcl.cache.result"]: p.value for p in metric_points("netcl.cache.lookups")
    }


BUILD_ERROR = "netcl.runtime.cache.ProgramBuildError"


def _failed_compiles(metric_points: Callable[[str], list[Any]]) -> list[Any]:
    points = metric_points("netcl.cache.compile.duration")
    return [p for p in points if "error.type" in p.attributes]


def test_spans_and_metrics(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    before = _lookups(metric_points)
    src = add_src(0.0, "otel")
    c = ProgramCache(cache_dir)
    c.get_program(ctx, src, device, "-cl-mad-enable")  # compiled
    c.get_program(ctx, src, device, "-cl-mad-enable")  # memory: counted, no span
    ProgramCache(cache_dir).get_program(ctx, src, device, "-cl-mad-enable")  # disk
    got = spans.get_finished_spans()
    top = [s for s in got if s.name == "netcl.cache.get_program"]
    assert [s.attributes["netcl.cache.result"] for s in top] == ["compiled", "disk"]
    keys = {s.attributes["netcl.cache.key"] for s in top}
    assert len(keys) == 1 and len(next(iter(keys))) == 64
    assert all(s.attributes["netcl.device.name"] == device.name for s in top)
    (comp,) = [s for s in got if s.name == "netcl.cache.compile"]
    assert comp.parent is not None and comp.parent.span_id == top[0].context.span_id
    assert comp.attributes["netcl.compile.options"] == "-cl-mad-enable"
    after = _lookups(metric_points)
    for result in ("compiled", "memory", "disk"):
        assert after[result] - before.get(result, 0) == 1
    durations = metric_points("netcl.cache.compile.duration")
    assert sum(p.count for p in durations) >= 1
    # successful builds: points without error.type (failed ones are apart, see below)
    assert sum(p.count for p in durations if "error.type" not in p.attributes) >= 1


def test_the_compile_duration_is_the_time_the_build_took(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    metric_points: Callable[[str], list[Any]],
) -> None:
    def recorded() -> tuple[int, float]:  # (builds, seconds) of this device's successful builds
        points = [
            p
            for p in metric_points("netcl.cache.compile.duration")
            if dict(p.attributes) == {"netcl.device.name": device.name}
        ]
        return sum(p.count for p in points), sum(p.sum for p in points)

    count, seconds = recorded()
    t0 = time.perf_counter()
    ProgramCache(cache_dir).get_program(ctx, add_src(0.0, f"duration-{time.time_ns()}"), device)
    took = time.perf_counter() - t0
    count_after, seconds_after = recorded()
    assert count_after == count + 1
    assert 0 < seconds_after - seconds <= took  # within the lookup that compiled it


def test_recovery_and_build_error_telemetry(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    spans: InMemorySpanExporter,
    metric_points: Callable[[str], list[Any]],
) -> None:
    src = add_src(0.0, "otel-recover")
    ProgramCache(cache_dir).get_program(ctx, src, device)
    ProgramCache(cache_dir).entries()[0].path.write_bytes(b"")
    spans.clear()
    ProgramCache(cache_dir).get_program(ctx, src, device)
    (top,) = [s for s in spans.get_finished_spans() if s.name == "netcl.cache.get_program"]
    assert top.attributes["netcl.cache.result"] == "recovered"
    reasons = {p.attributes["netcl.cache.reason"] for p in metric_points("netcl.cache.recoveries")}
    assert "empty" in reasons

    spans.clear()
    before = sum(p.count for p in _failed_compiles(metric_points))
    with pytest.raises(ProgramBuildError):
        ProgramCache(cache_dir).get_program(ctx, "__kernel void f() { nope; }", device)
    got = spans.get_finished_spans()
    (comp,) = [s for s in got if s.name == "netcl.cache.compile"]
    assert "nope" in comp.attributes["netcl.compile.log"]
    assert not comp.status.is_ok
    assert comp.attributes["error.type"] == BUILD_ERROR
    (top,) = [s for s in got if s.name == "netcl.cache.get_program"]
    assert not top.status.is_ok
    assert top.attributes["error.type"] == BUILD_ERROR
    assert top.attributes["netcl.cache.key"] == comp.attributes["netcl.cache.key"]  # kept
    assert "netcl.cache.result" not in top.attributes
    # the failed build is a point of its own in the duration histogram
    failed = _failed_compiles(metric_points)
    assert sum(p.count for p in failed) == before + 1
    assert {p.attributes["error.type"] for p in failed} == {BUILD_ERROR}


def test_get_program_under_a_failing_sdk(
    hostile_sdk: Callable[[], None],
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    """A span processor raising in on_start/on_end and a metric reader raising on record and
    collect change nothing a caller gets: compile, memory hit, disk hit, recovery, build error."""
    src = add_src(7.0, "hostile-sdk")
    c = ProgramCache(cache_dir)
    prg = c.get_program(ctx, src, device)  # compiled: both spans, the duration histogram
    check_add(prg, 7.0)
    assert c.get_program(ctx, src, device) is prg  # memory
    fresh = ProgramCache(cache_dir)
    check_add(fresh.get_program(ctx, src, device), 7.0)  # disk
    assert (c.stats.compiles, c.stats.memory_hits, fresh.stats.disk_hits) == (1, 1, 1)
    fresh.entries()[0].path.write_bytes(b"")  # damaged: the recoveries counter
    again = ProgramCache(cache_dir)
    check_add(again.get_program(ctx, src, device), 7.0)
    assert again.stats.recoveries == 1
    with pytest.raises(ProgramBuildError):  # the build error, not the SDK's
        again.get_program(ctx, "__kernel void f() { nope; }", device)
    hostile_sdk()  # the reader collects (and fails inside the SDK, never here)
    check_add(ProgramCache(cache_dir).get_program(ctx, src, device), 7.0)


def test_memory_hit_without_sdk_is_cheap(tmp_path: Path) -> None:
    """No SDK configured (a fresh process): an in-process hit costs a few dict lookups (the
    absolute figure is a benchmark: benchmarks/bench_cache.py)."""
    code = textwrap.dedent(f"""
        import timeit
        from netcl.core import device, telemetry
        from netcl.runtime.cache import ProgramCache
        assert not telemetry.tracing()
        ctx = device.default_context(); dev = ctx.devices[0]
        c = ProgramCache({str(tmp_path)!r})
        src = "__kernel void f(__global float *x) {{ x[0] = 1.0f; }}"
        c.get_program(ctx, src, dev)
        d = {{(ctx, dev, src, None): 1}}
        n = 20000
        def best(f):
            return min(timeit.repeat(f, number=n, repeat=5)) / n
        hit = best(lambda: c.get_program(ctx, src, dev))
        floor = best(lambda: d.get((ctx, dev, src, None)))
        print(hit / floor)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 8  # ~3 on PoCL; a span or a sha256 per hit would be > 20


def test_memory_hits_of_a_cache_that_is_gone_still_count(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    metric_points: Callable[[str], list[Any]],
) -> None:
    """An in-process hit bumps only its cache's counter; the lookups metric gets it when a reader
    collects, and when the cache is collected before any reader did."""
    import gc

    from netcl.runtime.cache import _telemetry

    src = add_src(0.0, "gone-hits")
    gc.collect()  # caches of earlier tests go now, not during this one
    c = ProgramCache(cache_dir)
    c.get_program(ctx, src, device)
    before = _lookups(metric_points).get("memory", 0)
    for _ in range(3):
        c.get_program(ctx, src, device)
    (mine,) = [token for token, counters in _telemetry._live.items() if counters is c._c]
    watched = len(_telemetry._live)
    del c
    gc.collect()
    assert _lookups(metric_points)["memory"] - before == 3
    assert mine not in _telemetry._live  # reported a last time, then forgotten
    assert len(_telemetry._live) == watched - 1


def test_a_cache_collected_during_a_collection_does_not_deadlock(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    metric_points: Callable[[str], list[Any]],
) -> None:
    """A cache's finalizer runs inside whatever allocation starts the garbage collector, also
    inside a reader's collection of the lookups, which holds the registry's lock: it must not
    wait for that lock (it once did, and a metric reader's thread hung for good at exit)."""
    import threading

    from netcl.runtime.cache import _telemetry

    src = add_src(0.0, "collected-mid-collection")
    box = [ProgramCache(cache_dir)]
    for _ in range(3):
        box[0].get_program(ctx, src, device)
    before = _lookups(metric_points).get("memory", 0)
    (mine,) = [token for token, counters in _telemetry._live.items() if counters is box[0]._c]
    done = threading.Event()

    def finalizer_inside_a_collection() -> None:
        with _telemetry._lock:  # as _count_memory_hits holds it when the collector runs
            box.clear()  # the cache goes here: its finalizer runs with the lock held
            gc.collect()
        done.set()

    worker = threading.Thread(target=finalizer_inside_a_collection, daemon=True)
    worker.start()
    worker.join(10)
    assert done.is_set(), "a cache's finalizer waited for the lock its collection holds"
    assert _lookups(metric_points)["memory"] - before == 0  # its 2 hits counted, once
    assert mine not in _telemetry._live
