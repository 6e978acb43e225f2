"""The scheduler's telemetry: its scope, span/attribute/metric names (they are API) and
instruments. Spans are opened through ``TEL.span``; the failure policy is netcl-core's."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.util.types import AttributeValue

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
#: plan span attribute: how the plan was ordered after the plans before it
ORDERING = "netcl.plan.ordering"
ORDER_DEVICE = "device"  # a barrier on the plan's queue waits for the earlier plans' events
ORDER_HOST = "host"  # the host waited for the earlier plans' events
ORDER_NONE = "none"  # nothing to wait for

#: Process totals, read by the observable counters when a metric reader collects: a run adds to
#: a number (a synchronous counter would cost microseconds per add with an SDK installed).
OPS = telemetry.Counts(ASYNC)  # by mode
HOST_WAITS = telemetry.Counts(ASYNC)
RUNS = {result: telemetry.Counts(ASYNC) for result in ("ok", "error")}  # by result, then mode


def _runs() -> list[tuple[float, Mapping[str, AttributeValue]]]:
    return [
        (value, {**attributes, RESULT: result})
        for result, counts in RUNS.items()
        for value, attributes in counts.points()
    ]


TEL.observable_counter(
    "netcl.scheduler.ops", OPS.points, "{op}",
    "Ops run by Scheduler.run (callables called and events collected)",
)  # fmt: skip
TEL.observable_counter(
    "netcl.scheduler.runs", _runs, "{run}", "Scheduler.run calls, by mode and result (ok / error)"
)
TEL.observable_counter(
    "netcl.scheduler.host_waits", HOST_WAITS.points, "{wait}",
    "Host waits Scheduler.run made to order a plan after earlier plans",
)  # fmt: skip
