"""One run of a Scheduler: its plans in run order, each with its :class:`Step`, and everything the
run does with them: ordering a plan after what it must follow (the one place that chooses between
a device barrier, a host wait and nothing), issuing its ops, waiting, and naming what failed.

State only moves forward, one store at a time, so an interrupt (KeyboardInterrupt, any
BaseException) leaves every step consistent wherever it lands:

- an op has run when its result is in ``step.results``: ``results.append(op())`` stores the
  result as the op returns, and the list's length is the count of ops done (no second counter);
- a step records how it was ordered once that is done (``step.ordering``); a step interrupted
  while being ordered is ordered again when resumed (a second barrier or wait changes nothing);
- ``run.done`` counts the plans that completed; the scheduler keeps the others for the next run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import pyopencl as cl
from opentelemetry.util.types import AttributeValue

from netcl.core import profiling
from netcl.core.telemetry import NO_SPAN, Span, tracing
from netcl.runtime.scheduler import _telemetry as tm
from netcl.runtime.scheduler._describe import describe_op, describe_value
from netcl.runtime.scheduler._errors import SchedulerError, failed_run
from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, after_of
from netcl.runtime.scheduler._step import Barriers, Source, Step, last_step

__all__ = ["Run"]

_Event = cl.Event


def _is_events(value: object) -> bool:
    """Whether an op's non-None return value is an event or a list/tuple of events."""
    if hasattr(value, "wait"):
        return True
    return isinstance(value, (list, tuple)) and all(v is None or hasattr(v, "wait") for v in value)


def _watch_plan(plan: ExecutionPlan, step: Step, span: Span) -> None:
    """Hand the OpenCL events the plan's ops returned in this run to the device-time collector
    (no wait), under the plan's span."""
    events: list[cl.Event] = []
    for r in step.results[step.first :]:
        if isinstance(r, (list, tuple)):
            events += [e for e in r if isinstance(e, _Event)]
        elif isinstance(r, _Event):
            events.append(r)
    if events:
        profiling.watch(profiling.SCHEDULER_PLAN, events, name=plan.description or None,
                        parent=span)  # fmt: skip


class Run:
    """One ``Scheduler.run``: the plans in run order, their steps, and how far the run got."""

    __slots__ = ("async_mode", "barriers", "done", "host_waits", "ops", "plans", "started",
                 "steps", "taken", "traced", "waited")  # fmt: skip

    def __init__(self, async_mode: bool, barriers: Barriers) -> None:
        self.async_mode = async_mode
        self.barriers = barriers
        self.plans: list[ExecutionPlan] = []
        self.steps: list[Step] = []  # steps[k] is the step of plans[k]
        self.taken = False  # the scheduler handed its plans over (a refused run takes none)
        self.started = 0  # plans whose ops were reached; on an error the later ones are unrun
        self.done = 0  # plans[:done] completed; after an interrupt the scheduler keeps the rest
        self.host_waits = 0
        self.ops = 0  # ops that returned in this run (exact when the run completes)
        self.waited = False  # sync mode: the host waited for the previous plan's events
        self.traced = False

    def execute(self, wait: bool) -> list[EventLike]:
        """Run every plan; return the events of the run, in op order."""
        self.traced = tracing()
        span = tm.TEL.span(tm.RUN_SPAN, self._attributes(wait)) if self.traced else NO_SPAN
        with span:
            events = self._run_all(wait)
            span.set(tm.RUN_EVENTS, len(events))
        return events

    def _run_all(self, wait: bool) -> list[EventLike]:
        """Order, issue and (sync mode) wait for each plan in turn; return the run's events."""
        plans, steps = self.plans, self.steps
        last = len(plans) - 1
        sync = not self.async_mode
        traced = self.traced
        events: list[EventLike] = []
        for k, plan in enumerate(plans):
            step = steps[k]
            span = self._plan_span(k, plan) if traced else NO_SPAN
            try:
                if step.ordering is None:  # a resumed step was ordered by the run it began in
                    step.ordering = (
                        self._order(plan, step) if self.waited or plan.after else tm.ORDER_NONE
                    )
                self.waited = False
                step.first = len(step.results)  # before the plan counts as started (ops counter)
                self.started = k + 1
                found = self._issue(plan, step)
                # device time only for a plan that names a profiling queue (one attribute
                # test per plan otherwise: plans made by submit(op) have no queue)
                if found and plan.queue is not None and profiling.enabled(plan.queue):
                    _watch_plan(plan, step, span)
                if found and sync:
                    plan_events = step.events()
                    if plan_events and (wait or k < last):
                        self._settle(plan, step, plan_events, orders_next=k < last)
                    events += plan_events
            except BaseException as exc:
                if step.ordering is not None:
                    span.set(tm.ORDERING, step.ordering)
                span.end(exc)
                raise
            if traced:
                span.set(tm.ORDERING, step.ordering)
                span.end()
            if sync:
                self.done = k + 1
        if not sync:
            events = [e for s in steps for e in s.events()]
            if wait:
                self._wait(events, zip(plans, steps, strict=True))
                for s in steps:
                    s.settled = True
        self.done = len(plans)
        return events

    def _settle(
        self, plan: ExecutionPlan, step: Step, events: list[EventLike], orders_next: bool
    ) -> None:
        """Sync mode: wait for a plan's events; a wait before the next plan orders it."""
        self._wait(events, ((plan, step),))
        step.settled = True
        if orders_next:
            self.host_waits += 1
            self.waited = True

    # -- ordering: the one place that decides -------------------------------------------------
    def _order(self, plan: ExecutionPlan, step: Step) -> str:
        """Order ``plan`` after what it must follow; return how (a netcl.plan.ordering).

        Sync mode: the host waited for the previous plan already (``host`` when it had events).
        A plan with ``after`` waits for the last events of those plans (of this run or an earlier
        one) that are not known to be finished: async mode with a ``queue``, a barrier on it;
        otherwise, on the host.
        """
        ordering = tm.ORDER_HOST if self.waited else tm.ORDER_NONE
        if plan.after:
            sources: dict[int, Source] = {}
            for earlier in after_of(plan):
                last = last_step(earlier)
                if last is not None:
                    followed = last.sources(earlier)
                    sources.update((id(s), (p, s)) for p, s in followed if not s.settled)
            if sources:
                how = self._follow(plan, step, tuple(sources.values()))
                if how is not tm.ORDER_NONE:
                    ordering = how
        return ordering

    def _follow(self, plan: ExecutionPlan, step: Step, sources: tuple[Source, ...]) -> str:
        events = [e for _, s in sources for e in s.events()]
        if not events:
            return tm.ORDER_NONE
        queue = plan.queue
        if self.async_mode and queue is not None and all(isinstance(e, _Event) for e in events):
            for ev in events:
                status = ev.command_execution_status  # type: ignore[attr-defined]
                if status < 0:  # never issue a plan on top of a failure already known
                    raise self._event_error(ev, f"failed (command status {status})", sources)
            try:
                # OpenCL starts commands another queue waits for only once their queue is
                # flushed; PoCL does not start them before that
                flushed = {id(queue)}
                for earlier, _ in sources:
                    q = earlier.queue
                    if q is not None and id(q) not in flushed:
                        flushed.add(id(q))
                        q.flush()
                barrier = cl.enqueue_barrier(queue, wait_for=events)
            except cl.Error:
                pass  # events of another context, say: the host waits instead
            else:
                self.barriers.hold(barrier)
                step.barrier, step.via = barrier, sources
                return tm.ORDER_DEVICE
        self.host_waits += 1
        self._wait(events, sources)
        for _, s in sources:
            s.settled = True
        return tm.ORDER_HOST

    # -- issuing ------------------------------------------------------------------------------
    def _issue(self, plan: ExecutionPlan, step: Step) -> bool:
        """Run the plan's ops that have not returned yet; return whether its step has events."""
        ops = step.ops
        if ops is None:  # the first run to reach the plan takes its ops as they are now
            ops = step.ops = tuple(plan.ops)
        elif len(plan.ops) > len(ops):  # resumed: add the ops appended since
            ops = step.ops = ops + tuple(plan.ops[len(ops) :])
        plan._netcl_step = step  # type: ignore[attr-defined]  # its last step (_step.last_step)
        results = step.results
        start = len(results)
        found = start > 0 and any(r is not None for r in results)
        for op in ops[start:] if start else ops:
            if callable(op):
                try:
                    results.append(result := op())  # the op has run: its result is stored
                except Exception as exc:
                    why = f"raised {type(exc).__name__}: {exc}"
                    raise self._error(plan, step, len(results), None, why) from exc
                if result is None:
                    continue
                if type(result) is not _Event and not _is_events(result):
                    raise self._error(
                        plan, step, len(results) - 1, None,
                        f"returned {describe_value(result)}; an op must return None, an event "
                        "(an object with wait()) or a list/tuple of events",
                    )  # fmt: skip
            elif callable(getattr(op, "wait", None)):
                results.append(op)
            else:
                raise self._error(
                    plan, step, len(results), None,
                    "is neither callable nor an event-like object with a wait() method "
                    f"(it is {describe_value(op)})",
                )  # fmt: skip
            found = True
        self.ops += len(results) - start
        return found

    # -- waiting ------------------------------------------------------------------------------
    def _wait(self, events: list[EventLike], where: Iterable[Source]) -> None:
        """Wait for ``events`` (of the plans ``where``); raise naming the op of one that failed."""
        cl_events = [e for e in events if isinstance(e, _Event)]
        if len(cl_events) < len(events):  # other event-likes: their own wait(), in order
            where = list(where)
            self._wait_each([e for e in events if not isinstance(e, _Event)], where)
        if not cl_events:
            return
        try:  # one clWaitForEvents for the lot (a separate wait() costs ~4 µs each on PoCL)
            cl.wait_for_events(cl_events)
        except Exception:
            # find the culprit; a batch refused for another reason (events of several
            # contexts) passes here when every event waits fine on its own
            self._wait_each(cl_events, where := list(where))
        for ev in cl_events:
            status = ev.command_execution_status
            if status < 0:
                raise self._event_error(ev, f"failed (command status {status})", where)

    def _wait_each(self, events: list[EventLike], where: list[Source]) -> None:
        for ev in events:
            try:
                ev.wait()
            except Exception as exc:
                detail = ""
                if isinstance(ev, _Event):
                    with contextlib.suppress(Exception):
                        detail = f" (command status {ev.command_execution_status})"
                what = f"failed{detail}: wait() raised {type(exc).__name__}: {exc}"
                raise self._event_error(ev, what, where) from exc

    # -- errors -------------------------------------------------------------------------------
    def _event_error(self, event: EventLike, what: str, where: Iterable[Source]) -> SchedulerError:
        """The error for ``event`` failing: named after the op (of a plan in ``where``) that
        returned it or was it."""
        for plan, step in where:
            for i, r in enumerate(step.results):
                if r is event or (isinstance(r, (list, tuple)) and any(x is event for x in r)):
                    if r is event and step.ops is not None and step.ops[i] is event:
                        what = f"(an event submitted as op) {what}"
                    else:
                        what = f"returned an event ({describe_op(event)}) that {what}"
                    return self._error(plan, step, i, event, what)
        raise LookupError(f"Scheduler.run: no op returned the failed event {event!r}")

    def _error(
        self, plan: ExecutionPlan, step: Step, op_index: int, event: EventLike | None, what: str
    ) -> SchedulerError:
        steps = self.steps
        index = next((k for k, s in enumerate(steps) if s is step), None)
        unrun = list(range(self.started, len(steps)))
        if event is not None and index is not None:
            # plans issued already that come after the failed one: held back on the device by
            # the failure (their commands fail with it), so they did not run either
            behind = {id(step)}
            held = []
            for k in range(index + 1, self.started):
                if any(id(s) in behind for _, s in steps[k].via):
                    behind.add(id(steps[k]))
                    held.append(k)
            unrun = held + unrun
        assert step.ops is not None
        return failed_run(
            plan=plan,
            plan_index=index,
            op=step.ops[op_index],
            op_index=op_index,
            event=event,
            what=what,
            unrun=[(self.plans[k], k) for k in unrun],
            events=[e for s in steps[: self.started] for e in s.events()],
        )

    # -- telemetry ----------------------------------------------------------------------------
    def _attributes(self, wait: bool) -> dict[str, AttributeValue]:
        return {
            tm.RUN_PLANS: len(self.plans),
            tm.RUN_OPS: sum(
                len(p.ops) - len(s.results) for p, s in zip(self.plans, self.steps, strict=True)
            ),
            tm.ASYNC: self.async_mode,
            tm.RUN_WAIT: wait,
        }

    def _plan_span(self, k: int, plan: ExecutionPlan) -> Span:
        return tm.TEL.span(
            tm.PLAN_SPAN,
            {
                tm.PLAN_DESCRIPTION: str(plan.description),
                tm.PLAN_INDEX: k,
                tm.PLAN_OPS: len(plan.ops),
            },
        )

    def count(self, ok: bool) -> None:
        """Add this run to the scheduler's counters (ops that returned, runs, host waits)."""
        mode = self.async_mode
        ops = self.ops
        if not ok:  # stopped anywhere: count what the steps hold
            ops = sum(len(s.results) - s.first for s in self.steps[: self.started])
        tm.OPS.add(ops, tm.OPS_ATTRS[mode])
        tm.RUNS.add(1, tm.RUN_ATTRS[(mode, ok)])
        if self.host_waits:
            tm.HOST_WAITS.add(self.host_waits, tm.HOST_WAIT_ATTRS[mode])
