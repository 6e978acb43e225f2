"""The scheduler's telemetry: its scope, span/attribute/metric names (they are API) and
instruments. Spans are opened through ``TEL.span``; the failure policy is netcl-core's."""

from __future__ import annotations

from netcl.core import telemetry
from netcl.runtime.scheduler.version import __version__

TEL = telemetry.Scope("netcl.runtime.scheduler", __version__)

RUN_SPAN = "netcl.scheduler.run"
PLAN_SPAN = "netcl.scheduler.plan"
ASYNC = "netcl.scheduler.async"
RUN_PLANS = "netcl.scheduler.plans"
RUN_OPS = "netcl.scheduler.ops"  # ops left to run in the scheduled plans
RUN_WAIT = "netcl.scheduler.wait"
RUN_EVENTS = "netcl.scheduler.events"
RESULT = "netcl.scheduler.result"  # of a run: ok / error
PLAN_DESCRIPTION = "netcl.plan.description"
PLAN_INDEX = "netcl.plan.index"
PLAN_OPS = "netcl.plan.ops"
ORDERING = "netcl.plan.ordering"  # how the plan was ordered after the plans before it
ORDER_DEVICE = "device"  # a barrier on the plan's queue waits for the earlier plans' events
ORDER_HOST = "host"  # the host waited for the earlier plans' events
ORDER_NONE = "none"  # nothing to wait for

#: Process totals, read by their observable counters when a metric reader collects (see Counts).
OPS = telemetry.Counts(ASYNC)  # by mode
HOST_WAITS = telemetry.Counts(ASYNC)
RUNS = {result: telemetry.Counts(ASYNC) for result in ("ok", "error")}  # by result, then mode

TEL.observable_counter(
    "netcl.scheduler.ops",
    OPS.points,
    "{op}",
    "Ops run by Scheduler.run (callables called and events collected)",
)
TEL.observable_counter(
    "netcl.scheduler.runs",
    lambda: [(n, {**attrs, RESULT: r}) for r, runs in RUNS.items() for n, attrs in runs.points()],
    "{run}",
    "Scheduler.run calls, by mode and result (ok / error)",
)
TEL.observable_counter(
    "netcl.scheduler.host_waits",
    HOST_WAITS.points,
    "{wait}",
    "Host waits Scheduler.run made to order a plan after earlier plans",
)
