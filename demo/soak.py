"""The demo's steady workload (``--soak``): what a serving process does all day, at a steady
pace, so that every dashboard panel has live data.

Every step (20 a second): an in-process program cache hit, a graph run on the pool, and a
scheduled step (copy in, replay, copy out, checked against numpy), every other one on an
asynchronous scheduler. Every 10 s a new source variant is compiled (a cold miss) and the previous
one is read back by a fresh cache instance (a disk hit); every 30 s the graph is captured again
and the new capture replayed; every 45 s a cache entry is damaged on purpose and recovered (so
the recoveries panel, and over 15 minutes the NetclCacheRecoverySpike alert, have something to
show). Device time is recorded in summary mode (demo.py's default with ``--soak``), the level a
service leaves on. Ctrl-C stops it cleanly; its report lists what it did.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels import SOURCE

from netcl.runtime.cache import ProgramCache, cacher
from netcl.runtime.capture import KernelCapture
from netcl.runtime.scheduler import Scheduler

Model = Any  # demo.Model (the script's module is __main__, so not imported here)
Step = Callable[[int, Scheduler | None], float]  # one checked scheduled step

PERIOD_S = 0.05  # one step every 50 ms
COMPILE_EVERY_S = 10.0
RECAPTURE_EVERY_S = 30.0
RECOVER_EVERY_S = 45.0
REPORT_EVERY_S = 10.0


@dataclass
class _Counts:
    steps: int = 0
    graph_runs: int = 0
    compiles: int = 0
    disk_hits: int = 0
    recoveries: int = 0
    captures: int = 0
    busy_s: float = 0.0
    due: dict[str, float] = field(default_factory=dict)


def run(model: Model, step: Step, seconds: float) -> list[str]:
    """Run the steady workload for ``seconds`` (inf: until Ctrl-C) with the demo's ``model``
    and its checked scheduled ``step``; returns report lines."""
    forever = seconds == float("inf")
    print(
        f"soak: steady workload {'until Ctrl-C' if forever else f'for {seconds:g} s'}",
        file=sys.stderr,
        flush=True,
    )
    # the first recovery comes once a scraper has had time to see the counters at zero (a
    # Prometheus started with the demo scrapes within a few seconds): a counter's increase over a
    # window needs a sample before the step, and the next recovery is RECOVER_EVERY_S later
    counts = _Counts(due={"compile": 2.0, "recover": 12.0, "capture": 8.0, "report": 10.0})
    async_sched = Scheduler(async_mode=True)
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="netcl-soak-") as tmp:
            cache = ProgramCache(cache_dir=Path(tmp) / "variants")
            while (now := time.monotonic() - t0) < seconds:
                started = time.monotonic()
                _step(model, step, counts, async_sched)
                _occasional(model, counts, cache, Path(tmp), now)
                counts.busy_s += time.monotonic() - started
                time.sleep(max(0.0, PERIOD_S - (time.monotonic() - started)))
    except KeyboardInterrupt:
        print("soak: stopped", file=sys.stderr)
    elapsed = time.monotonic() - t0
    return [
        f"soak: {elapsed:.1f} s, {counts.steps} scheduled steps checked against numpy, "
        f"{counts.graph_runs} graph runs,",
        f"  {counts.compiles} compiles of new variants, {counts.disk_hits} disk hits, "
        f"{counts.recoveries} damaged entries recovered, {counts.captures} re-captures; "
        f"host busy {counts.busy_s / max(elapsed, 1e-9):.0%}",
    ]


def _step(model: Model, step: Step, counts: _Counts, async_sched: Scheduler) -> None:
    ctx, dev = model.queue.context, model.queue.device
    cacher.get_program(ctx, SOURCE, dev)  # what a framework does before each launch
    out = model.executor.run(model.graph)
    model.pool.release(out)
    counts.graph_runs += 1
    sched = async_sched if counts.steps % 2 else None
    step(counts.steps, sched)
    counts.steps += 1


def _occasional(model: Model, counts: _Counts, cache: ProgramCache, tmp: Path, now: float) -> None:
    due = counts.due
    ctx, dev = model.queue.context, model.queue.device
    if now >= due["compile"]:
        due["compile"] += COMPILE_EVERY_S
        cache.get_program(ctx, _variant(counts.compiles), dev)  # a new source: compiled
        counts.compiles += 1
        if counts.compiles > 1:  # the previous variant from a fresh instance: a disk hit
            ProgramCache(cache_dir=cache.cache_dir).get_program(
                ctx, _variant(counts.compiles - 2), dev
            )
            counts.disk_hits += 1
    if now >= due["recover"]:
        due["recover"] += RECOVER_EVERY_S
        _recover(model, tmp / f"damaged-{counts.recoveries}")
        counts.recoveries += 1
    if now >= due["capture"]:
        due["capture"] += RECAPTURE_EVERY_S
        _recapture(model)
        counts.captures += 1
    if now >= due["report"]:
        due["report"] += REPORT_EVERY_S
        print(
            f"soak: {now:.0f} s, {counts.steps} steps, {counts.compiles} compiles, "
            f"{counts.recoveries} recoveries",
            file=sys.stderr,
            flush=True,
        )


def _variant(n: int) -> str:
    return f"{SOURCE}\n// netcl demo source variant {n}\n"


def _recover(model: Model, folder: Path) -> None:
    """Compile into a folder of its own, damage the entry, read it back: recovered."""
    ctx, dev = model.queue.context, model.queue.device
    cache = ProgramCache(cache_dir=folder)
    cache.get_program(ctx, SOURCE, dev)
    for entry in cache.entries():
        entry.path.write_bytes(b"damaged on purpose by the demo's soak")
    ProgramCache(cache_dir=folder).get_program(ctx, SOURCE, dev)


def _recapture(model: Model) -> None:
    """Capture a graph run again (as after a shape change) and replay the new capture."""
    cap = KernelCapture()
    cap.begin()
    try:
        out = model.executor.run(model.graph)
    finally:
        cap.end()
    for _ in range(3):
        cap.replay()
    model.queue.finish()
    model.pool.release(out)
    cap.reset()
