"""Importing netcl loads only what the first use needs: structlog (and rich, which its console
renderer pulls in) only once an event is logged at an enabled level or logging is configured;
the OpenTelemetry API only once the application loads it (an SDK needs it), and netcl's spans and
instruments then follow."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

_LAZY = (
    "structlog",
    "rich",
    "opentelemetry.trace",
    "opentelemetry.metrics",
    "opentelemetry.context",
    "netcl.core.profiling",
)
_MODULES = [
    "netcl.core.memory",
    "netcl.core.device",
    "netcl.core.log",
    "netcl.core.cli",
    "netcl.runtime.cache",
    "netcl.runtime.graph",
    "netcl.runtime.capture",
    "netcl.runtime.scheduler",
]


def _loaded_after(code: str) -> list[str]:
    """The modules of _LAZY that a fresh interpreter holds after running ``code``."""
    check = f"\nimport sys\nprint(' '.join(m for m in {_LAZY!r} if m in sys.modules))"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + check],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize("module", _MODULES)
def test_importing_a_package_loads_no_structlog_nor_opentelemetry(module: str) -> None:
    """Nor device time: it loads with the first profiling queue."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    assert _loaded_after(f"import {module}") == []


def test_device_time_the_pool_and_the_planner_load_with_their_first_use() -> None:
    """A capture replayed on a plain queue loads neither device time nor the pool (checked
    mode's); the graph's planner loads with a first plan; a graph run and a scheduler run on a
    plain queue load no device time; a capture on a profiling queue does."""
    code = """
        import sys
        import numpy as np
        import pyopencl as cl
        from netcl.runtime.capture import KernelCapture
        ctx = cl.create_some_context(interactive=False)
        k = cl.Program(ctx, "__kernel void k(__global float *a) { a[0] += 1; }").build().k
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4)
        def loaded():
            return [m for m in ("netcl.core.profiling", "netcl.core.memory",
                                "netcl.runtime.graph._plan") if m in sys.modules]
        def replay(q):
            cap = KernelCapture()
            with cap:
                k(q, (1,), None, buf)
            cap.replay()
            q.finish()
        plain = cl.CommandQueue(ctx)
        replay(plain)
        print(loaded())
        from netcl.core.memory import BufferPool
        from netcl.core.tensor import Tensor
        from netcl.runtime.graph import Graph, GraphExecutor
        from netcl.runtime.scheduler import ExecutionPlan, Scheduler
        print(loaded())
        graph = Graph()
        x = Tensor.from_numpy(np.ones(1, np.float32), plain)
        graph.add_op("k", lambda ins, out: k(out.queue, (1,), None, out.buffer), [x], shape=(1,),
                     dtype="float32")
        GraphExecutor(BufferPool(plain)).run(graph)
        sched = Scheduler()
        sched.submit(ExecutionPlan([lambda: k(plain, (1,), None, buf)], queue=plain))
        sched.run()
        print(loaded())
        replay(cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE))
        print(loaded())
        """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    plan = "'netcl.runtime.graph._plan'"
    assert proc.stdout.splitlines() == [
        "[]",
        "['netcl.core.memory']",
        f"['netcl.core.memory', {plan}]",
        f"['netcl.core.profiling', 'netcl.core.memory', {plan}]",
    ], proc.stdout


def test_importing_capture_loads_no_step_machinery() -> None:
    """capture_step (its modules and pyopencl.array) loads on first use, and then works."""
    code = """
        import sys
        import netcl.runtime.capture as c
        print(' '.join(m for m in ('netcl.runtime.capture._step', 'pyopencl.array')
                       if m in sys.modules))
        from netcl.runtime.capture import capture_step, CapturedStep
        print(isinstance(capture_step(lambda: None), CapturedStep), 'capture_step' in vars(c))
        """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["", "True True"], proc.stdout


def test_netcl_info_loads_no_structlog() -> None:
    code = """
        import contextlib, io
        from netcl.core import cli
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(["info"])
        """
    assert _loaded_after(code) == []


def test_events_below_the_level_load_no_structlog() -> None:
    code = """
        from netcl.core.log import get_logger
        log = get_logger("netcl.runtime.cache").bind(key="abc")
        log.debug("cache_hit", n=1)
        log.info("cache_stats_saved", path="/x")  # the stdlib default level is WARNING
        """
    assert _loaded_after(code) == []


def test_structlog_loads_for_an_event_that_passes_and_for_configure_logging() -> None:
    warn = """
        from netcl.core.log import get_logger
        get_logger("netcl.runtime.cache").warning("cache_dir_unusable", path="/proc/x")
        """
    assert "structlog" in _loaded_after(warn)
    assert "structlog" in _loaded_after(
        "from netcl.core.log import configure_logging\nconfigure_logging()"
    )


def test_a_bound_logger_keeps_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    from netcl.core.log import get_logger

    log = get_logger("netcl.test.lazy").bind(plan="p1").bind(op=3)
    with caplog.at_level("INFO", logger="netcl.test.lazy"):
        log.info("op_done", seconds=0.5)
        log.debug("not_shown")
        try:
            raise KeyError("k")
        except KeyError:
            log.exception("op_failed")
    done, failed = caplog.records
    assert done.getMessage() == "op_done plan=p1 op=3 seconds=0.5"
    assert failed.levelname == "ERROR" and failed.exc_info and failed.exc_info[0] is KeyError
    assert log.new(x=1) is not None  # the rest of structlog's API is passed through


def test_an_sdk_installed_after_import_gets_the_spans_and_instruments() -> None:
    """A package imported before the application loads OpenTelemetry: once an SDK is installed,
    its runs record spans, its histogram and its observable counters (made when the API loaded,
    reporting totals from before)."""
    code = """
        import numpy as np
        from netcl.core import device
        from netcl.core.memory import BufferPool
        from netcl.runtime.graph import Graph, GraphExecutor

        queue = device.default_queue()
        g = Graph()
        g.add_op("a", lambda inputs, out: None, [], (4,), np.float32)
        pool = BufferPool(queue)
        ex = GraphExecutor(pool)
        pool.release(ex.run(g))  # before any OpenTelemetry: nothing can record
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        for _ in range(1025):  # netcl sees a provider set by hand within 1024 checks
            pool.release(ex.run(g))
        points = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
                  for sm in rm.scope_metrics for m in sm.metrics}
        runs = sum(s.name == "netcl.graph.run" for s in spans.get_finished_spans())
        print(points["netcl.graph.nodes_executed"][0].value, 1 <= runs <= 1025,
              points["netcl.graph.run.duration"][0].count >= 1)
        """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1026", "True", "True"], proc.stdout


def test_what_waits_for_the_metrics_api_runs_once_the_application_loads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In this process, as if the application had not loaded the metrics API: netcl does not
    load it to look, keeps what waits for it, and runs that once (and only once) the API is
    there; a provider named by ``OTEL_PYTHON_METER_PROVIDER`` is the one case where netcl loads
    the API itself."""
    import opentelemetry

    from netcl.core import _sdk

    api = "opentelemetry.metrics"
    loaded = sys.modules[api]
    monkeypatch.setattr(opentelemetry, "metrics", loaded)  # put back whatever a load rebinds
    monkeypatch.delitem(sys.modules, api)
    monkeypatch.setitem(_sdk._NAMED, api, False)
    ran: list[str] = []
    _sdk.when_metrics_loaded(lambda: ran.append("made"))
    assert (_sdk._loaded(api), _sdk.metrics_loaded(), ran) == (None, False, [])
    assert api not in sys.modules  # not loaded to look
    monkeypatch.setitem(sys.modules, api, loaded)  # the application loads it
    assert (_sdk._loaded(api), _sdk.metrics_loaded(), ran) == (loaded, True, ["made"])
    assert _sdk.metrics_loaded() is True and ran == ["made"]
    monkeypatch.delitem(sys.modules, api)
    monkeypatch.setitem(_sdk._NAMED, api, True)  # OTEL_PYTHON_METER_PROVIDER was set
    assert _sdk._loaded(api) is sys.modules[api]
