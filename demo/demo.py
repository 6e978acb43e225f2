"""The netcl main job: one realistic workload through every runtime package.

1. compile the MLP's kernels through the program cache (cold, disk hit, in-process hit, an
   entry damaged on purpose and recovered);
2. describe the forward pass as a Graph and run it on a BufferPool;
3. capture the run's kernel launches and replay many steps with changing inputs through
   Scheduler plans (copy in, replay, copy out), double-buffering the input by rebinding;
4. check every result against numpy and print a summary table, a per-span-name summary and
   where the telemetry went;
5. with ``--soak``, keep a steady mix of all of it running (the way to watch the dashboards).

Telemetry follows the standard OTEL_* variables (netcl.core.telemetry.configure);
``--console-spans`` prints every span (one line each) to stderr, ``--prometheus-port`` serves
metrics for Prometheus, ``--profile`` records device time (spans and metrics; ``--profile
summary``: one device time per replay, node and plan, kernels sampled).
"""

from __future__ import annotations

import argparse
import itertools
import math
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np
import pyopencl as cl
import report
from kernels import SOURCE, Array, mlp_reference

from netcl.core import device, profiling, table, telemetry
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.cache import ProgramCache, cacher
from netcl.runtime.capture import CapturedStep, capture_step
from netcl.runtime.graph import Graph, GraphExecutor
from netcl.runtime.scheduler import ExecutionPlan, Scheduler

LAYERS = (128, 128, 128, 128, 10)  # features -> 3 hidden layers -> classes: small, launch-bound
BATCH = 16


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cache_tour(ctx: cl.Context, dev: cl.Device) -> dict[str, float]:
    """Program cache: cold compile, disk hit in a fresh instance, in-process hit, and an entry
    damaged on purpose (truncated file, disk error) detected, recompiled and rewritten."""
    with tempfile.TemporaryDirectory() as tmp:
        cold_cache = ProgramCache(cache_dir=Path(tmp))
        t = {"cold": _timed(lambda: cold_cache.get_program(ctx, SOURCE, dev))}
        t["disk"] = _timed(lambda: ProgramCache(cache_dir=Path(tmp)).get_program(ctx, SOURCE, dev))
        t["mem"] = min(_timed(lambda: cold_cache.get_program(ctx, SOURCE, dev)) for _ in range(100))
        (entry,) = cold_cache.entries()
        entry.path.write_bytes(b"damaged on purpose by the demo")
        t["rec"] = _timed(lambda: ProgramCache(cache_dir=Path(tmp)).get_program(ctx, SOURCE, dev))
    return t


class Model(NamedTuple):
    """The MLP on the device: weights, input tensor, graph, its executor and pool."""

    queue: cl.CommandQueue
    host_w: list[tuple[Array, Array]]
    x: Tensor
    pool: BufferPool
    executor: GraphExecutor
    graph: Graph
    plan: Any
    rng: np.random.Generator
    kernels: tuple[cl.Kernel, cl.Kernel, cl.Kernel]  # gemm, bias_relu, bias_softmax
    weights: list[tuple[Tensor, Tensor]]

    def batch(self) -> Array:
        return self.rng.standard_normal((BATCH, LAYERS[0])).astype(np.float32)

    def check(self, got: Array, inp: Array, what: str) -> None:
        want = mlp_reference(inp, self.host_w)
        if not np.allclose(got, want, rtol=1e-3, atol=1e-5):
            err = float(np.abs(got - want).max())
            raise SystemExit(f"demo: {what} differs from numpy (max abs error {err:.3g})")


def build_graph(
    kernels: tuple[cl.Kernel, cl.Kernel, cl.Kernel],
    queue: cl.CommandQueue,
    x: Tensor,
    weights: list[tuple[Tensor, Tensor]],
) -> Graph:
    """The MLP forward pass as graph ops: gemm -> bias_relu per hidden layer, bias_softmax last."""
    gemm, bias_relu, bias_softmax = kernels
    graph = Graph()
    h = x
    for i, (w, b) in enumerate(weights):
        k, n = w.shape
        last = i == len(weights) - 1
        act = bias_softmax if last else bias_relu
        mm_name, act_name = f"fc{i}", "softmax" if last else f"relu{i}"

        def matmul(inputs: list[Tensor], out: Tensor, k: int = k, n: int = n) -> None:
            a, wt = inputs
            gemm(queue, (BATCH, n), None, a.buffer, wt.buffer, out.buffer, np.int32(k), np.int32(n))

        def activate(inputs: list[Tensor], out: Tensor, n: int = n, act: cl.Kernel = act) -> None:
            z, bias = inputs
            size = (BATCH,) if act is bias_softmax else (BATCH * n,)
            act(queue, size, None, z.buffer, bias.buffer, out.buffer, np.int32(n))

        z = graph.add_op(mm_name, matmul, [h, w], shape=(BATCH, n), dtype="float32")
        h = graph.add_op(act_name, activate, [z, b], shape=(BATCH, n), dtype="float32")  # type: ignore[assignment]
    return graph


def build_model(queue: cl.CommandQueue, prg: cl.Program) -> Model:
    rng = np.random.default_rng(0)
    host_w = [
        (
            (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
            (rng.standard_normal(n) * 0.1).astype(np.float32),
        )
        for k, n in itertools.pairwise(LAYERS)
    ]
    weights = [(Tensor.from_numpy(w, queue), Tensor.from_numpy(b, queue)) for w, b in host_w]
    x = Tensor.empty((BATCH, LAYERS[0]), "float32", queue)
    pool = BufferPool(queue)
    executor = GraphExecutor(pool)
    kernels = (prg.gemm, prg.bias_relu, prg.bias_softmax)  # fetched once (pyopencl warns on more)
    graph = build_graph(kernels, queue, x, weights)
    return Model(
        queue, host_w, x, pool, executor, graph, executor.plan(graph), rng, kernels, weights
    )


def graph_steps(model: Model, n: int) -> list[float]:
    """One checked graph run, then ``n`` timed ones (run + finish)."""
    inp = model.batch()
    model.x.write(inp)
    out = model.executor.run(model.graph)
    model.check(out.to_numpy(), inp, "graph run")
    model.pool.release(out)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = model.executor.run(model.graph)
        model.queue.finish()
        times.append(time.perf_counter() - t0)
        model.pool.release(out)
    return times


class Captured(NamedTuple):
    """The forward pass as a captured step, replayed with new inputs through Scheduler plans."""

    step: CapturedStep[[Tensor], Tensor]
    launches: int
    out: Tensor  # the capture's own output: every replay writes it
    x2: Tensor
    host_out: Array
    sched: Scheduler


def capture(model: Model) -> Captured:
    """A warm-up call runs the forward pass normally, the next one records it; later calls
    replay it with the input's buffer in place of the recorded one."""
    executor, queue = model.executor, model.queue

    @capture_step(name="demo.forward")
    def forward(inp: Tensor) -> Tensor:
        return executor.run(build_graph(model.kernels, queue, inp, model.weights))

    model.pool.release(forward(model.x))  # warm-up: a normal run, its output is the caller's
    out = forward(model.x)  # recorded while it runs
    x2 = Tensor.empty(model.x.shape, model.x.dtype, queue)
    return Captured(
        forward,
        forward.num_launches,
        out,
        x2,
        np.empty(out.shape, np.float32),
        Scheduler(async_mode=False),
    )


def saved_step(model: Model, c: Captured, n: int = 20) -> dict[str, float]:
    """Save the captured step, load it in a second process (load_saved.py, which imports none
    of this file) and check its results for ``n`` new inputs against numpy and, bit for bit,
    against the step's function run normally here."""
    with tempfile.TemporaryDirectory(prefix="netcl-demo-") as tmp:
        path, inputs, outputs = (Path(tmp) / name for name in ("forward.ncl", "in.npz", "out.npz"))
        size = c.step.save(path)
        batches = [model.batch() for _ in range(n)]
        np.savez(inputs, kind=np.array("tensor"), **{f"c{i}_0": x for i, x in enumerate(batches)})
        subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("load_saved.py")),
                str(path),
                str(inputs),
                str(outputs),
            ],
            check=True,
        )
        found = np.load(outputs)
        for i, x in enumerate(batches):
            got = found[f"c{i}_0"]
            model.check(got, x, f"the loaded step's call {i}")
            normal = c.step.__wrapped__(Tensor.from_numpy(x, model.queue))  # the step's code
            if got.tobytes() != normal.to_numpy().tobytes():
                raise SystemExit(
                    f"demo: the loaded step's call {i} is not bit-identical to "
                    "the step run normally"
                )
            model.pool.release(normal)
        return {"bytes": size, "first": float(found["first_result_s"]), "calls": n}


def scheduled_step(model: Model, c: Captured, step: int, sched: Scheduler | None = None) -> float:
    """Copy in, replay, copy out as three Scheduler plans; checked against numpy."""
    sched = sched or c.sched
    inp = model.batch()
    dst = c.x2 if step % 2 else model.x
    # plans that name their queue: on a profiling queue the scheduler records their device time
    h2d = ExecutionPlan(description="h2d copy", queue=model.queue)
    compute = ExecutionPlan(description="replay", queue=model.queue)
    d2h = ExecutionPlan(description="d2h copy", queue=model.queue)
    sched.submit(lambda: dst.write(inp, wait=False), plan=h2d)

    def replay() -> None:  # None: the scheduler would take a returned Tensor for an event
        # on a profiling queue the replay records its device time itself (a span per kernel)
        c.step(dst)

    sched.submit(replay, plan=compute)
    sched.submit(
        lambda: cl.enqueue_copy(model.queue, c.host_out, c.out.buffer, is_blocking=False),
        plan=d2h,
    )
    t0 = time.perf_counter()
    sched.run(wait=True)
    elapsed = time.perf_counter() - t0
    model.check(c.host_out, inp, f"replay step {step}")
    return elapsed


def replay_only(model: Model, c: Captured, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.step(model.x)
        model.queue.finish()
        times.append(time.perf_counter() - t0)
    return times


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
_soak = _number(float, lambda v: 0 < v < math.inf, "seconds > 0")


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
    add(
        "--linger",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="seconds to keep serving metrics after the run, >= 0 (default 0)",
    )
    add("--no-console", action="store_true", help="no span/metric lines on stderr")
    add("--console-spans", action="store_true", help="every span on stderr")
    add(
        "--profile",
        nargs="?",
        const="commands",
        choices=("commands", "summary"),
        help="record device time on a profiling queue: commands (no value: every command's, a "
        "span per kernel) or summary (one per replay, node and plan; kernels sampled)",
    )
    add(
        "--soak",
        type=_soak,
        nargs="?",
        const=math.inf,
        metavar="S",
        help="after the checked run, keep a steady mix of work going for S seconds (no S: until "
        "Ctrl-C); implies --profile summary. The way to watch the dashboards",
    )
    args = parser.parse_args(argv)
    if args.prometheus_port is not None:
        why = _port_in_use(args.prometheus_port)
        if why is not None:
            parser.error(
                f"argument --prometheus-port: cannot serve on 127.0.0.1:{args.prometheus_port}: "
                f"{why}"
            )
    if args.profile is None and args.soak is not None:
        args.profile = "summary"  # device time a service can leave on: every panel live
    return args


def _configure(args: argparse.Namespace) -> dict[str, Any]:
    """configure() from the OTEL_* variables; a bad value is one line and exit status 2."""
    try:
        providers = telemetry.configure(
            service_name="netcl-demo",
            console=args.console_spans and not args.no_console,
            prometheus_port=args.prometheus_port,
        )
    except telemetry.ConfigError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return providers


def _queue(profile: bool) -> cl.CommandQueue:
    if not profile:
        return device.default_queue()
    return cl.CommandQueue(
        device.default_context(), properties=cl.command_queue_properties.PROFILING_ENABLE
    )


def main(argv: list[str] | None = None) -> int:
    """Run the demo; Ctrl-C anywhere ends it with one line on stderr and exit status 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr, flush=True)
        return 130


def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    providers = _configure(args)
    spans = report.SpanStats()
    add_processor = getattr(providers["tracer_provider"], "add_span_processor", None)
    if add_processor is not None:
        add_processor(spans)

    queue = _queue(args.profile is not None)
    if args.profile:
        profiling.collector().mode = args.profile
    ctx, dev = queue.context, queue.device
    print(f"device: {dev.name} ({dev.platform.name})")
    t = cache_tour(ctx, dev)
    prg = cacher.get_program(ctx, SOURCE, dev)  # the global cache the framework uses
    model = build_model(queue, prg)
    normal = graph_steps(model, 20)
    cap = capture(model)
    saved = saved_step(model, cap)
    scheduled = []
    progress = report.Progress("replaying", args.steps)
    for step in range(args.steps):
        scheduled.append(scheduled_step(model, cap, step))
        progress.update(step + 1)
    replays = replay_only(model, cap, 20)
    summary = _summary(model, cap, t, normal, replays, scheduled, args.steps, saved)
    soaked = None
    if args.soak is not None:
        import soak

        soaked = soak.run(model, lambda n, s: scheduled_step(model, cap, n, s), args.soak)

    if args.console_spans and not args.no_console:
        telemetry.flush()  # span lines before the table, not after
    print("\n".join(summary))
    if soaked is not None:
        print("\n".join(["", *soaked]))
    if args.profile:
        profiling.flush(1.0)
        print("\n".join(["", *report.device_time()]))
    print("\n".join(["", *spans.table()]))
    if args.linger > 0:
        sys.stderr.write(f"serving metrics for {args.linger:g} s more\n")  # one write: whole line
        time.sleep(args.linger)
    telemetry.shutdown()
    print("\n".join(["", *report.where(providers, args.prometheus_port)]))
    return 0


def _summary(
    model: Model,
    c: Captured,
    t: dict[str, float],
    normal: list[float],
    replays: list[float],
    scheduled: list[float],
    steps: int,
    saved: dict[str, float],
) -> list[str]:
    stats, plan = cacher.stats, model.plan
    med_normal, med_replay = statistics.median(normal), statistics.median(replays)
    ms = report.ms
    return report.rows(
        [
            ("program cache: cold compile", ms(t["cold"])),
            ("program cache: disk hit (new instance)", ms(t["disk"])),
            ("program cache: in-process hit", f"{t['mem'] * 1e6:9.3f} µs"),
            ("program cache: damaged entry recompiled", ms(t["rec"])),
            (
                "global cacher this run",
                f"{table.plural(stats.hits, 'hit')}, {table.plural(stats.compiles, 'compile')}",
            ),
            (f"graph: {len(plan.order)} nodes, normal step (median)", ms(med_normal)),
            (f"capture: {c.launches} launches, replay step (median)", ms(med_replay)),
            ("replay speed-up over normal step", f"{med_normal / med_replay:9.2f} x"),
            ("scheduled step: copy in + replay + copy out", ms(statistics.median(scheduled))),
            ("saved step: file size", f"{table.human(saved['bytes']):>9}"),
            ("saved step loaded elsewhere: first result", ms(saved["first"])),
            ("pool peak (plan) / lower bound", f"{plan.peak_bytes} B / {plan.lower_bound} B"),
            ("pool device bytes, layout", f"{plan.pool_device_bytes} B, {plan.strategy}"),
            ("pool peak without reuse", f"{plan.no_reuse_bytes} B"),
            ("steps checked against numpy", f"{steps + 1}"),
            ("loaded step's calls checked against numpy", f"{saved['calls']:9d}"),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
