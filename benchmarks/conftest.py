"""Benchmark fixtures. No OpenTelemetry SDK is configured here: benchmarks measure the no-SDK
fast path unless a benchmark installs telemetry itself (in a subprocess)."""

from __future__ import annotations

import pyopencl as cl
import pytest

from netcl.core import device


@pytest.fixture(scope="session")
def ctx() -> cl.Context:
    return device.default_context()


@pytest.fixture(scope="session")
def queue(ctx: cl.Context) -> cl.CommandQueue:
    return device.default_queue(ctx)
