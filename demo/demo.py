"""The netcl main job: one realistic workload through every runtime package.

1. compile the MLP's kernels through the program cache (cold, disk hit, in-process hit, an
   entry damaged on purpose and recovered);
2. describe the forward pass as a Graph and run it on a BufferPool;
3. capture the run's kernel launches and replay many steps with changing inputs through
   Scheduler plans (copy in, replay, copy out), double-buffering the input by rebinding;
4. check every result against numpy and print a summary table, a per-span-name summary and
   where the telemetry went.

Telemetry follows the standard OTEL_* variables (netcl.core.telemetry.configure);
``--console-spans`` prints every span (one line each) to stderr, ``--prometheus-port`` serves
metrics for Prometheus.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

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


class _SpanStats(SpanProcessor):
    """Durations of the finished spans, by span name."""

    def __init__(self) -> None:
        self.durations: dict[str, list[int]] = {}

    def on_end(self, span: ReadableSpan) -> None:
        ns = (span.end_time or 0) - (span.start_time or 0)
        self.durations.setdefault(span.name, []).append(ns)

    def table(self) -> list[str]:
        total = sum(len(d) for d in self.durations.values())
        lines = [f"{'span (' + str(total) + ' in all)':<32}{'count':>7}{'p50':>13}{'p99':>13}"]
        for name, ns in sorted(self.durations.items()):
            ns.sort()
            p50, p99 = ns[len(ns) // 2], ns[min(len(ns) - 1, len(ns) * 99 // 100)]
            lines.append(f"{name:<32}{len(ns):>7}{_us(p50):>13}{_us(p99):>13}")
        return lines


def _us(ns: int) -> str:
    return f"{ns / 1e3:.1f} µs" if ns < 1e6 else f"{ns / 1e6:.3f} ms"


def _where(exporters: dict[str, list[str]], prometheus_port: int | None) -> list[str]:
    """Where spans, metrics and logs went, one line each."""
    if not exporters:
        return ["telemetry: an OpenTelemetry SDK installed before the demo handles it"]
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the SDK's default endpoint")
    lines = []
    for signal, names in exporters.items():
        where = []
        for name in names:
            if name.startswith("otlp"):
                where.append(f"OTLP/{'gRPC' if 'grpc' in name else 'HTTP'} to {endpoint}")
            elif name == "prometheus":  # --prometheus-port, else the exporter's variables
                default = "localhost" if prometheus_port is None else "127.0.0.1"
                host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", default)
                port = prometheus_port or os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")
                where.append(f"Prometheus on http://{host}:{port}/metrics")
            elif name == "console":
                where.append("stderr, one line each")
            else:
                where.append(name)
        if signal == "logs" and not names:
            where.append("stdlib logging, not configured here (netcl.core.log.configure_logging)")
        lines.append(f"{signal + ':':<9}{', '.join(where) or 'not exported'}")
    if not exporters["traces"]:
        lines.append("(--console-spans prints every span; the OTEL_* variables pick exporters)")
    return lines


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


class _Parser(argparse.ArgumentParser):
    """Bad arguments end in one line on stderr (no usage block, no traceback) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(
    parse: Callable[[str], float], ok: Callable[[float], bool], expected: str
) -> Callable[[str], Any]:
    """An argparse type: ``parse`` the text, then check it with ``ok``; the error names what was
    ``expected`` and what was given."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    return convert


_steps = _number(int, lambda v: v >= 1, "an integer >= 1")
_port = _number(int, lambda v: 1 <= v <= 65535, "a port 1..65535")
_seconds = _number(float, lambda v: 0 <= v < math.inf, "seconds >= 0")  # also rejects nan


def _port_in_use(port: int) -> str | None:
    """Why 127.0.0.1:port cannot be served (None when it can), checked before any work starts.
    SO_REUSEADDR as prometheus_client's server sets it, so a port in TIME_WAIT counts as free."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo's options, validated: errors are one line naming the option and the value."""
    parser = _Parser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=_steps, default=100, help="replayed steps, >= 1 (default 100)")
    add("--prometheus-port", type=_port, metavar="PORT", help="serve metrics on 127.0.0.1:PORT")
    add("--linger", type=_seconds, default=0.0, metavar="S",
        help="seconds to keep serving metrics after the run, >= 0 (default 0)")
    add("--no-console", action="store_true", help="no span/metric lines on stderr")
    add("--console-spans", action="store_true", help="every span on stderr")
    args = parser.parse_args(argv)
    if args.prometheus_port is not None:
        why = _port_in_use(args.prometheus_port)
        if why is not None:
            parser.error(
                f"argument --prometheus-port: cannot serve on 127.0.0.1:{args.prometheus_port}: "
                f"{why}"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    providers = telemetry.configure(
        service_name="netcl-demo",
        console=args.console_spans and not args.no_console,
        prometheus_port=args.prometheus_port,
    )
    spans = _SpanStats()
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
        # a damaged entry (truncated file, disk error) is detected, recompiled and rewritten
        (entry,) = cold_cache.entries()
        entry.path.write_bytes(b"damaged on purpose by the demo")
        t_rec = _timed(lambda: ProgramCache(cache_dir=Path(tmp)).get_program(ctx, SOURCE, dev))
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
        ("program cache: damaged entry recompiled", _ms(t_rec)),
        ("global cacher this run", f"{stats.hits} hit(s), {stats.compiles} compile(s)"),
        (f"graph: {len(plan.order)} nodes, normal step (median)", _ms(med_normal)),
        (f"capture: {n_launches} launches, replay step (median)", _ms(med_replay)),
        ("replay speed-up over normal step", f"{med_normal / med_replay:9.2f} x"),
        ("scheduled step: copy in + replay + copy out", _ms(statistics.median(replay_times))),
        ("pool peak (plan) / lower bound", f"{plan.peak_bytes} B / {plan.lower_bound} B"),
        ("pool device bytes, layout", f"{plan.pool_device_bytes} B, {plan.strategy}"),
        ("pool peak without reuse", f"{plan.no_reuse_bytes} B"),
        ("steps checked against numpy", f"{args.steps + 1}"),
    ]
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    print()
    print("\n".join(spans.table()))
    print()
    print("\n".join(_where(providers["exporters"], args.prometheus_port)))
    if args.linger > 0:
        print(f"serving metrics for {args.linger:g} s more", file=sys.stderr)
        time.sleep(args.linger)
    telemetry.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
