"""The graph package's telemetry scope, span and attribute names, and instruments (names are API:
dashboards use them)."""

from __future__ import annotations

from netcl.core import telemetry
from netcl.runtime.graph.version import __version__

TEL = telemetry.Scope("netcl.runtime.graph", __version__)

RUN_SPAN = "netcl.graph.run"
NODE_SPAN = "netcl.graph.node"  # a child of the run span per op; its attributes are the step's
NODES = "netcl.graph.nodes"
PEAK_BYTES = "netcl.pool.peak_bytes"
ARENA_BYTES = "netcl.graph.arena_bytes"
LOWER_BOUND_BYTES = "netcl.graph.lower_bound_bytes"
STRATEGY = "netcl.graph.strategy"
NODE_NAME = "netcl.node.name"
NODE_SHAPE = "netcl.node.shape"
NODE_DTYPE = "netcl.node.dtype"

#: Process totals, read by their observable counters when a metric reader collects (see Counts).
NODES_EXECUTED = telemetry.Counts()
PLANS_BUILT = telemetry.Counts()
TEL.observable_counter(
    "netcl.graph.nodes_executed", NODES_EXECUTED.points, "{node}", "Graph ops whose fn was called"
)
TEL.observable_counter(
    "netcl.graph.plans", PLANS_BUILT.points, "{plan}", "Graph plans built (cache misses)"
)
RUN_DURATION = TEL.histogram(
    "netcl.graph.run.duration",
    "s",
    "Host time of GraphExecutor.run (enqueueing every op; the device may still run)",
)
