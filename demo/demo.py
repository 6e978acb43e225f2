"""The netcl main job: one realistic workload through every runtime package.

1. compile the MLP's kernels through the program cache (cold, disk hit, in-process hit);
2. describe the forward pass as a Graph and run it on a BufferPool;
3. capture the run's kernel launches and replay many steps with changing inputs through
   Scheduler plans (copy in, replay, copy out), double-buffering the input by rebinding;
4. check every result against numpy and print a summary table.

Spans and metrics go to stderr (one line each) or, when OTEL_EXPORTER_OTLP_* is set, to an OTLP
endpoint; ``--prometheus-port`` also serves metrics for Prometheus.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyopencl as cl
from kernels import SOURCE, Array, mlp_reference
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from netcl.core import device, telemetry
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.cache import ProgramCache, cacher
from netcl.runtime.capture import KernelCapture
from netcl.runtime.graph import Graph, GraphExecutor
from netcl.runtime.scheduler import ExecutionPlan, Scheduler

LAYERS = (128, 128, 128, 128, 10)  # features -> 3 hidden layers -> classes: small, launch-bound
BATCH = 16


class _SpanCounter(SpanProcessor):
    def __init__(self) -> None:
        self.count = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.count += 1


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f} ms"


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class _Progress:
    """A one-line progress report on stderr for loops longer than a second."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.t0, self.shown = what, total, time.perf_counter(), -1

    def update(self, done: int) -> None:
        pct = 100 * done // self.total
        if time.perf_counter() - self.t0 > 1.0 and pct // 10 != self.shown // 10:
            self.shown = pct
            end = "\n" if done == self.total else ""
            print(f"\r{self.what}: {done}/{self.total} ({pct}%)", end=end, file=sys.stderr)


def build_graph(
    prg: cl.Program, queue: cl.CommandQueue, x: Tensor, weights: list[tuple[Tensor, Tensor]]
) -> Graph:
    """The MLP forward pass as graph ops: gemm -> bias_relu per hidden layer, bias_softmax last."""
    gemm, bias_relu, bias_softmax = prg.gemm, prg.bias_relu, prg.bias_softmax
    graph = Graph()
    h = x
    for i, (w, b) in enumerate(weights):
        k, n = w.shape

        def matmul(inputs: list[Tensor], out: Tensor, k: int = k, n: int = n) -> None:
            a, wt = inputs
            gemm(queue, (BATCH, n), None, a.buffer, wt.buffer, out.buffer, np.int32(k), np.int32(n))

        last = i == len(weights) - 1
        act = bias_softmax if last else bias_relu

        def activate(inputs: list[Tensor], out: Tensor, n: int = n, act: cl.Kernel = act) -> None:
            z, bias = inputs
            size = (BATCH,) if act is bias_softmax else (BATCH * n,)
            act(queue, size, None, z.buffer, bias.buffer, out.buffer, np.int32(n))

        z = graph.add_op(f"fc{i}", matmul, [h, w], shape=(BATCH, n), dtype="float32")
        name = "softmax" if last else f"relu{i}"
        h = graph.add_op(name, activate, [z, b], shape=(BATCH, n), dtype="float32")  # type: ignore[assignment]
    return graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="replayed steps (default 100)")
    parser.add_argument("--prometheus-port", type=int, help="serve metrics on 127.0.0.1:PORT")
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to keep serving after")
    parser.add_argument("--no-console", action="store_true", help="no span/metric lines on stderr")
    args = parser.parse_args(argv)

    providers = telemetry.configure(
        service_name="netcl-demo",
        console=False if args.no_console else None,
        prometheus_port=args.prometheus_port,
    )
    spans = _SpanCounter()
    providers["tracer_provider"].add_span_processor(spans)

    queue = device.default_queue()
    ctx, dev = queue.context, queue.device
    print(f"device: {dev.name} ({dev.platform.name})")
    rng = np.random.default_rng(0)

    # 1. program cache: cold compile, disk hit in a fresh instance, in-process hit
    with tempfile.TemporaryDirectory() as tmp:
        cold_cache = ProgramCache(cache_dir=Path(tmp))
        t_cold = _timed(lambda: cold_cache.get_program(ctx, SOURCE, dev))
        t_disk = _timed(lambda: ProgramCache(cache_dir=Path(tmp)).get_program(ctx, SOURCE, dev))
        t_mem = min(_timed(lambda: cold_cache.get_program(ctx, SOURCE, dev)) for _ in range(100))
    prg = cacher.get_program(ctx, SOURCE, dev)  # the global cache the framework uses

    # 2. the forward pass as a graph
    dims = list(itertools.pairwise(LAYERS))
    host_w = [
        (
            (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
            (rng.standard_normal(n) * 0.1).astype(np.float32),
        )
        for k, n in dims
    ]
    weights = [(Tensor.from_numpy(w, queue), Tensor.from_numpy(b, queue)) for w, b in host_w]
    x = Tensor.empty((BATCH, LAYERS[0]), "float32", queue)
    pool = BufferPool(queue)
    executor = GraphExecutor(pool)
    graph = build_graph(prg, queue, x, weights)
    plan = executor.plan(graph)

    def batch() -> Array:
        return rng.standard_normal((BATCH, LAYERS[0])).astype(np.float32)

    def check(got: Array, inp: Array, what: str) -> None:
        want = mlp_reference(inp, host_w)
        if not np.allclose(got, want, rtol=1e-3, atol=1e-5):
            err = float(np.abs(got - want).max())
            raise SystemExit(f"demo: {what} differs from numpy (max abs error {err:.3g})")

    inp = batch()
    x.write(inp)
    out = executor.run(graph)
    check(out.to_numpy(), inp, "graph run")
    pool.release(out)

    normal = []
    for _ in range(20):
        t0 = time.perf_counter()
        out = executor.run(graph)
        queue.finish()
        normal.append(time.perf_counter() - t0)
        pool.release(out)

    # 3. capture one run, then replay it with new inputs, double-buffered by rebinding
    cap = KernelCapture()
    cap.begin()
    try:
        captured_out = executor.run(graph)
    finally:
        n_launches = cap.end()
    x2 = Tensor.empty(x.shape, x.dtype, queue)
    swap = {x.buffer.int_ptr: x2.buffer}
    host_out = np.empty(captured_out.shape, np.float32)
    sched = Scheduler(async_mode=False)
    replay_times = []
    progress = _Progress("replaying", args.steps)
    for step in range(args.steps):
        inp = batch()
        dst = x2 if step % 2 else x
        h2d = ExecutionPlan(description="h2d copy")
        compute = ExecutionPlan(description="replay")
        d2h = ExecutionPlan(description="d2h copy")
        sched.submit(lambda dst=dst, inp=inp: dst.write(inp, wait=False), plan=h2d)
        if step % 2:
            sched.submit(lambda: cap.replay_with_new_buffers(swap), plan=compute)
        else:
            sched.submit(cap.replay, plan=compute)
        sched.submit(
            lambda: cl.enqueue_copy(queue, host_out, captured_out.buffer, is_blocking=False),
            plan=d2h,
        )
        t0 = time.perf_counter()
        sched.run(wait=True)
        replay_times.append(time.perf_counter() - t0)
        check(host_out, inp, f"replay step {step}")
        progress.update(step + 1)
    replay_only = []
    for _ in range(20):
        t0 = time.perf_counter()
        cap.replay()
        queue.finish()
        replay_only.append(time.perf_counter() - t0)

    # 4. summary
    providers["tracer_provider"].force_flush()  # span lines before the table, not after
    stats = cacher.stats
    med_normal, med_replay = statistics.median(normal), statistics.median(replay_only)
    rows = [
        ("program cache: cold compile", _ms(t_cold)),
        ("program cache: disk hit (new instance)", _ms(t_disk)),
        ("program cache: in-process hit", f"{t_mem * 1e6:9.3f} µs"),
        ("global cacher this run", f"{stats.hits} hit(s), {stats.compiles} compile(s)"),
        (f"graph: {len(plan.order)} nodes, normal step (median)", _ms(med_normal)),
        (f"capture: {n_launches} launches, replay step (median)", _ms(med_replay)),
        ("replay speed-up over normal step", f"{med_normal / med_replay:9.2f} x"),
        ("scheduled step: copy in + replay + copy out", _ms(statistics.median(replay_times))),
        (
            "pool peak (plan) / lower bound",
            f"{plan.peak_bytes} B / {plan.lower_bound} B  ({plan.pool_device_bytes} B in pool "
            f"blocks, {plan.strategy})",
        ),
        ("pool peak without reuse", f"{plan.no_reuse_bytes} B"),
        ("steps checked against numpy", f"{args.steps + 1}"),
        ("spans emitted", f"{spans.count}"),
    ]
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    if args.linger > 0:
        print(f"serving metrics for {args.linger:g} s more", file=sys.stderr)
        time.sleep(args.linger)
    telemetry.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
