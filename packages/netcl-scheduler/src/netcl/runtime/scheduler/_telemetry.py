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
PLAN_DESCRIPTION = "netcl.plan.description"
PLAN_INDEX = "netcl.plan.index"
PLAN_OPS = "netcl.plan.ops"
#: plan span attribute: how the plan was ordered after the plans before it
ORDERING = "netcl.plan.ordering"
ORDER_DEVICE = "device"  # a barrier on the plan's queue waits for the earlier plans' events
ORDER_HOST = "host"  # the host waited for the earlier plans' events
ORDER_NONE = "none"  # nothing to wait for

OPS = TEL.counter(
    "netcl.scheduler.ops",
    "{op}",
    "Ops run by Scheduler.run (callables called and events collected)",
)
RUNS = TEL.counter(
    "netcl.scheduler.runs", "{run}", "Scheduler.run calls, by mode and result (ok / error)"
)
HOST_WAITS = TEL.counter(
    "netcl.scheduler.host_waits",
    "{wait}",
    "Host waits Scheduler.run made to order a plan after earlier plans",
)

# Attribute sets built once: a run pays a few counter adds and no allocation for them.
OPS_ATTRS = {mode: {ASYNC: mode} for mode in (False, True)}
HOST_WAIT_ATTRS = OPS_ATTRS
RUN_ATTRS = {
    (mode, ok): {ASYNC: mode, "netcl.scheduler.result": "ok" if ok else "error"}
    for mode in (False, True)
    for ok in (False, True)
}
