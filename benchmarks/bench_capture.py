"""KernelCapture benchmarks: replay against the bare enqueue floor, a launch-bound MLP step
normal vs replayed, and replay with an OpenTelemetry SDK vs none.

Ratios are measured in the same run with the contenders timed in alternation
(``capture_workloads.interleaved``) and stored in ``extra_info``: ratios of medians, and
``*_min`` ratios of the fastest rounds (the least disturbed by other load on a shared
machine). The pytest-benchmark stats of each test time that test's own contender. Host time
is measured with the queue drained before each timed call (an untimed ``finish``), so it is
the enqueue cost, not device time; ``*_e2e`` ratios include a ``finish`` in the timed part.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from capture_workloads import (
    LAUNCHES,
    AddLoop,
    ArrayMLP,
    PythonOpsMLP,
    interleaved,
    interleaved_times,
)
from paired import HeldQueues, paired_floor, record_floor

from netcl.runtime.capture import KernelCapture


def _rounds(benchmark: Any, full: int) -> int:
    return 3 if benchmark.disabled else full


# -- 1. per-launch replay cost against the bare enqueue loop ------------------------------


@pytest.fixture(scope="module")
def add_loop(queue: cl.CommandQueue) -> AddLoop:
    return AddLoop(queue)


@pytest.mark.benchmark(group="capture-launch")
def test_launch_bare_enqueue_loop(benchmark: Any, add_loop: AddLoop) -> None:
    """The floor: ``cl.enqueue_nd_range_kernel`` in a tight loop, arguments preset."""
    benchmark.extra_info["launches_per_call"] = LAUNCHES
    held = HeldQueues(add_loop.queue)
    benchmark.pedantic(add_loop.bare, setup=held, rounds=_rounds(benchmark, 200), warmup_rounds=2)
    held.release()
    add_loop.check()


@pytest.mark.benchmark(group="capture-launch")
def test_launch_replay(benchmark: Any, add_loop: AddLoop) -> None:
    """``KernelCapture.replay()`` of the same 200 launches; target ≤ 1.15x the bare loop."""
    times = interleaved_times(
        {"bare": add_loop.bare, "replay": add_loop.replay},
        _rounds(benchmark, 300),
        setup=add_loop.queue.finish,
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    benchmark.extra_info.update(
        replay_over_bare_min=min(times["replay"]) / min(times["bare"]),
        launches_per_call=LAUNCHES,
        bare_us_per_launch=med["bare"] / LAUNCHES * 1e6,
        replay_us_per_launch=med["replay"] / LAUNCHES * 1e6,
        replay_over_bare=med["replay"] / med["bare"],
        target_replay_over_bare=1.15,
    )
    held = HeldQueues(add_loop.queue)
    setup, floor = paired_floor(add_loop.bare, between=held)  # the bare loop, same load
    benchmark.pedantic(
        add_loop.replay, setup=setup, rounds=_rounds(benchmark, 500), warmup_rounds=2
    )
    record_floor(benchmark, floor)
    held.release()
    add_loop.check()


@pytest.mark.benchmark(group="capture-record")
def test_record_cost(benchmark: Any, add_loop: AddLoop) -> None:
    """Recording (begin, 200 ``knl(...)`` launches, end, the capture dropped) against the same
    200 plain launches; target ≤ 3x. Host cost: each round runs with the queue held (see
    ``HeldQueues``), so the device's kernels do not compete with the timed thread (on a CPU
    device they would, and the ratio would fall towards 1 as the kernels dominate)."""
    held = HeldQueues(add_loop.queue)
    times = interleaved_times(
        {"plain": add_loop.calls, "record": add_loop.record},
        _rounds(benchmark, 100),
        setup=held,
    )
    held.release()
    med = {k: statistics.median(v) for k, v in times.items()}
    benchmark.extra_info.update(
        launches_per_call=LAUNCHES,
        plain_us_per_launch=med["plain"] / LAUNCHES * 1e6,
        record_us_per_launch=med["record"] / LAUNCHES * 1e6,
        record_over_plain=med["record"] / med["plain"],
        record_over_plain_min=min(times["record"]) / min(times["plain"]),
        target_record_over_plain=3.0,
    )
    benchmark.pedantic(
        add_loop.record, setup=add_loop.queue.finish, rounds=_rounds(benchmark, 50), warmup_rounds=1
    )
    add_loop.queue.finish()
    add_loop.check()


# -- 2. a launch-bound MLP step, normal against replay ------------------------------------


class _Step:
    """A model's step run normally and as a capture of one step (output kept, not released)."""

    def __init__(self, queue: cl.CommandQueue, kind: str) -> None:
        self.queue = queue
        self.model = PythonOpsMLP(queue)
        self.kind = kind
        # the same launches by hand, arguments set once: the replay's own floor
        self.hand: Any = None
        if kind == "python_ops":
            self.normal = self._python_ops_step
            self.hand = self.model.by_hand()
        else:
            self.array_model = ArrayMLP(queue, self.model)
            self.normal = self.array_model.step
        self.capture = KernelCapture()
        with self.capture:  # a step that raises leaves pyopencl unpatched
            self.out = self._captured_step()
        self.launches = self.capture.num_launches
        queue.finish()

    def _python_ops_step(self) -> None:
        self.model.pool.release(self.model.step())

    def _captured_step(self) -> Any:
        return self.model.step() if self.kind == "python_ops" else self.array_model.step()

    def replay(self) -> None:
        self.capture.replay()

    def check(self) -> None:
        """Replay after a new input was written in place gives numpy's answer."""
        rng = np.random.default_rng(3)
        x = rng.standard_normal((16, 64)).astype(np.float32)
        if self.kind == "python_ops":
            self.model.x.write(x)
        else:
            self.array_model.x.set(x)
        self.capture.replay()
        got = self.out.to_numpy() if self.kind == "python_ops" else self.out.get()
        np.testing.assert_allclose(got, self.model.reference(x), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=["python_ops", "pyopencl_array"])
def step(request: Any, queue: cl.CommandQueue) -> _Step:
    return _Step(queue, request.param)


@pytest.mark.benchmark(group="capture-step")
def test_step_normal(benchmark: Any, step: _Step) -> None:
    """One MLP step (8 layers, batch 16, width 64) executed op by op."""
    benchmark.extra_info.update(kind=step.kind, launches_per_step=step.launches)
    held = HeldQueues(step.queue)
    benchmark.pedantic(step.normal, setup=held, rounds=_rounds(benchmark, 100), warmup_rounds=2)
    held.release()


@pytest.mark.benchmark(group="capture-step")
def test_step_replay(benchmark: Any, step: _Step) -> None:
    """The same step replayed; target ≥ 5x faster (host time per step) on PoCL. The gate's
    figures: 1000 rounds, each after a normal step (paired: the speed-up) and for Python ops
    the same launches by hand (the replay over ``hand_floor_s``), then an untimed normal step,
    so that both the hand launches and the replay follow one; about half a second in all:
    on a 2-core runner PoCL's cost per command moves by ~1 µs for tens of milliseconds at a
    time, and over 100 rounds (one such spell) the figure read 2.4-3.0 there, over 1000 2.9-3.0
    (2026-12-04)."""
    rounds = _rounds(benchmark, 100)
    times = interleaved_times(
        {"normal": step.normal, "replay": step.replay}, rounds, setup=step.queue.finish
    )
    host = {k: statistics.median(v) for k, v in times.items()}

    def finished(fn: Any) -> Any:
        return lambda: (fn(), step.queue.finish())

    e2e = interleaved({"normal": finished(step.normal), "replay": finished(step.replay)}, rounds)
    bare = AddLoop(step.queue)
    floor = interleaved({"bare": bare.bare}, rounds, setup=step.queue.finish)["bare"] / LAUNCHES
    benchmark.extra_info.update(
        kind=step.kind,
        launches_per_step=step.launches,
        normal_us_per_step=host["normal"] * 1e6,
        replay_us_per_step=host["replay"] * 1e6,
        normal_over_replay=host["normal"] / host["replay"],
        normal_over_replay_min=min(times["normal"]) / min(times["replay"]),
        normal_over_replay_e2e=e2e["normal"] / e2e["replay"],
        replay_us_per_launch=host["replay"] / step.launches * 1e6,
        bare_enqueue_us_per_launch=floor * 1e6,
        target_normal_over_replay=5.0,
    )
    held = HeldQueues(step.queue)
    setup, floor = paired_floor(step.normal, between=held)  # the normal step, same load
    hand: list[float] = []
    if step.hand is not None:  # and the launches by hand: extra_info["hand_floor_s"]
        normal_setup, (hand_setup, hand) = setup, paired_floor(step.hand, between=held)

        def setup() -> None:
            normal_setup()
            hand_setup()
            # untimed: the replay, as the launches by hand, comes right after a normal step
            step.normal()
            held()

    benchmark.pedantic(step.replay, setup=setup, rounds=10 * rounds, warmup_rounds=2)
    record_floor(benchmark, floor)
    if hand:  # hand_floor_s, and hand_ratio_median: each replay over the launches before it
        record_floor(benchmark, hand, "hand_floor_s")
    held.release()
    step.check()


# -- 3. replay with an OpenTelemetry SDK against none -------------------------------------


@pytest.mark.benchmark(group="capture-telemetry")
def test_replay_telemetry_overhead(benchmark: Any, add_loop: AddLoop) -> None:
    """Replay (200 launches) with an SDK + BatchSpanProcessor vs none: target ≤ 5% apart.

    ``sdk_over_none`` is host time of the replay call, ``sdk_over_none_e2e`` replay + finish.
    The ratios come from a subprocess (see capture_otel_probe.py for why and how); the stats
    of this test time the no-SDK replay in this process.
    """
    probe = Path(__file__).with_name("capture_otel_probe.py")
    res = subprocess.run(
        [sys.executable, str(probe), str(_rounds(benchmark, 300))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    figures = json.loads(res.stdout.strip().splitlines()[-1])
    assert figures["spans_exported"] > 0  # the SDK really recorded the replays
    benchmark.extra_info.update(
        sdk_us_per_replay=figures["sdk_s"] * 1e6,
        none_us_per_replay=figures["none_s"] * 1e6,
        sdk_over_none=figures["sdk_over_none"],
        sdk_e2e_us_per_replay=figures["sdk_e2e_s"] * 1e6,
        none_e2e_us_per_replay=figures["none_e2e_s"] * 1e6,
        sdk_over_none_e2e=figures["sdk_over_none_e2e"],
        sdk_over_none_e2e_min=figures["sdk_over_none_e2e_min"],
        launches_per_replay=figures["launches_per_replay"],
        target_sdk_over_none=1.05,
    )
    benchmark.pedantic(
        add_loop.replay,
        setup=add_loop.queue.finish,
        rounds=_rounds(benchmark, 100),
        warmup_rounds=2,
    )
