"""The scheduler's tracer, instruments and telemetry names (span, attribute and metric names are
API), and spans that a failing span processor cannot break."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import Token

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from netcl.core import telemetry
from netcl.core.log import get_logger
from netcl.runtime.scheduler.version import __version__

__all__ = [
    "ASYNC",
    "PLAN_DESCRIPTION",
    "PLAN_INDEX",
    "PLAN_OPS",
    "RUN_EVENTS",
    "RUN_OPS",
    "RUN_PLANS",
    "RUN_WAIT",
    "ERROR_TYPE",
    "HOST_WAITS",
    "HOST_WAIT_ATTRS",
    "OPS",
    "OPS_ATTRS",
    "ORDERING",
    "ORDER_DEVICE",
    "ORDER_HOST",
    "ORDER_NONE",
    "PLAN_SPAN",
    "RUNS",
    "RUN_ATTRS",
    "RUN_SPAN",
    "SpanHandle",
    "TRACER",
    "end_span",
    "start_span",
    "tracing",
]

tracing = telemetry.tracing

TRACER = telemetry.tracer("netcl.runtime.scheduler", __version__)
_meter = telemetry.meter("netcl.runtime.scheduler", __version__)
_log = get_logger("netcl.runtime.scheduler")

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
ERROR_TYPE = "error.type"  # on failed spans: the exception type that ended the span

OPS = _meter.create_counter(
    "netcl.scheduler.ops",
    unit="{op}",
    description="Ops run by Scheduler.run (callables called and events collected)",
)
RUNS = _meter.create_counter(
    "netcl.scheduler.runs",
    unit="{run}",
    description="Scheduler.run calls, by mode and result (ok / error)",
)
HOST_WAITS = _meter.create_counter(
    "netcl.scheduler.host_waits",
    unit="{wait}",
    description="Host waits Scheduler.run made to order a plan after earlier plans",
)

# Attribute sets built once: a run pays a few counter adds and no allocation for them.
OPS_ATTRS = {mode: {ASYNC: mode} for mode in (False, True)}
HOST_WAIT_ATTRS = OPS_ATTRS
RUN_ATTRS = {
    (mode, ok): {ASYNC: mode, "netcl.scheduler.result": "ok" if ok else "error"}
    for mode in (False, True)
    for ok in (False, True)
}

SpanHandle = tuple[trace.Span, Token[Context]]


def start_span(name: str, attributes: Mapping[str, AttributeValue]) -> SpanHandle | None:
    """Start ``name`` as the current span; None (and a warning log event) when the SDK raises,
    e.g. a span processor failing in ``on_start``: telemetry never stops a run."""
    try:
        span = TRACER.start_span(name, attributes=attributes)
    except Exception as exc:
        _log.warning("telemetry_failed", span=name, stage="start", error=repr(exc))
        return None
    return span, context.attach(trace.set_span_in_context(span))


def end_span(handle: SpanHandle | None, exc: BaseException | None = None) -> None:
    """End a span of :func:`start_span`, recording ``exc`` (status ERROR, ``error.type``).

    An exception of the SDK (a span processor failing in ``on_end``) is logged, never raised:
    it must not replace the run's own outcome.
    """
    if handle is None:
        return
    span, token = handle
    context.detach(token)
    try:
        if exc is not None:
            span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()
    except Exception as failure:
        _log.warning("telemetry_failed", stage="end", error=repr(failure))
