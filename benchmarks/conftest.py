"""Benchmark fixtures. No OpenTelemetry SDK is configured here: benchmarks measure the no-SDK
fast path unless a benchmark installs telemetry itself (in a subprocess).

Two hooks for the gate (benchmarks/tracking/gate.py):
- the OpenCL device the benchmarks ran on goes into the JSON's ``machine_info["opencl"]``, so the
  gate picks the limits of that device class and saved runs say what they measured;
- ``NETCL_BENCH_SLOWDOWN="target=fraction,..."`` (e.g. ``capture_replay=0.2``) wraps the code a
  target names with a busy-wait of ``fraction`` times each call's own duration: an injected
  regression to prove the gate catches one. Targets: see ``_SLOWDOWN_TARGETS``. It lives here
  only, never in the packages.
"""

from __future__ import annotations

import functools
import importlib
import os
import time
from collections.abc import Callable
from typing import Any

import pyopencl as cl
import pytest

from netcl.core import device

collect_ignore = ["tracking"]  # the gate and history that judge the benchmarks: no benchmarks

_SLOWDOWN_TARGETS: dict[str, list[tuple[str, str, str]]] = {
    "capture_replay": [("netcl.runtime.capture", "KernelCapture", "replay")],
    "cache_hit": [("netcl.runtime.cache", "ProgramCache", "get_program")],
    "graph_executor": [("netcl.runtime.graph", "GraphExecutor", "run")],
    "pool_allocation": [
        ("netcl.core.memory", "BufferPool", "allocate"),
        ("netcl.core.memory", "BufferPool", "release"),
    ],
    "scheduler": [
        ("netcl.runtime.scheduler", "Scheduler", "submit"),
        ("netcl.runtime.scheduler", "Scheduler", "run"),
    ],
}


def _slowed(fn: Callable[..., Any], fraction: float) -> Callable[..., Any]:
    clock = time.perf_counter

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        result = fn(*args, **kwargs)
        t1 = clock()
        end = t1 + (t1 - t0) * fraction
        while clock() < end:  # busy: a regression costs CPU, not an idle sleep
            pass
        return result

    return wrapper


def _inject_slowdowns(spec: str) -> list[str]:
    done = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, fraction = item.partition("=")
        if name not in _SLOWDOWN_TARGETS:
            raise pytest.UsageError(
                f"NETCL_BENCH_SLOWDOWN: unknown target {name!r}; expected one of "
                f"{', '.join(_SLOWDOWN_TARGETS)}"
            )
        for module, cls_name, attr in _SLOWDOWN_TARGETS[name]:
            cls = getattr(importlib.import_module(module), cls_name)
            setattr(cls, attr, _slowed(getattr(cls, attr), float(fraction or 0.2)))
            done.append(f"{cls_name}.{attr} +{float(fraction or 0.2):.0%}")
    return done


def pytest_configure(config: pytest.Config) -> None:
    spec = os.environ.get("NETCL_BENCH_SLOWDOWN", "")
    if spec:
        config.stash[_injected] = _inject_slowdowns(spec)


_injected = pytest.StashKey[list[str]]()


def pytest_report_header(config: pytest.Config) -> str | None:
    injected = config.stash.get(_injected, None)
    return f"NETCL_BENCH_SLOWDOWN injected: {', '.join(injected)}" if injected else None


def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    dev = device.default_context().devices[0]
    machine_info["opencl"] = {
        "platform": dev.platform.name,
        "vendor": dev.vendor,
        "device": dev.name,
        "version": dev.version,
        "driver": dev.driver_version,
        "pyopencl": cl.VERSION_TEXT,
    }
    injected = config.stash.get(_injected, None)
    if injected:
        machine_info["netcl_slowdown_injected"] = injected


@pytest.fixture(scope="session")
def ctx() -> cl.Context:
    return device.default_context()


@pytest.fixture(scope="session")
def queue(ctx: cl.Context) -> cl.CommandQueue:
    return device.default_queue(ctx)
