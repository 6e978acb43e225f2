"""One run of a Scheduler: its plans in run order, each as a :class:`Step`, and everything the run
does with them: ordering a plan after what it must follow (the one place that chooses between a
device barrier, a host wait and nothing), issuing its ops, waiting, and naming what failed.

State only moves forward, one store at a time, so an interrupt (KeyboardInterrupt, any
BaseException) leaves every step consistent wherever it lands:

- an op has run when its result is in ``step.results``: ``results.append(op())`` stores the
  result as the op returns, and the list's length is the count of ops done (no second counter);
- a step records how it was ordered once that is done (``step.ordering``); a step interrupted
  while being ordered is ordered again when resumed (a second barrier or wait changes nothing);
- ``run.done`` counts the steps that completed; the scheduler keeps the others for the next run.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import pyopencl as cl
from opentelemetry.util.types import AttributeValue

from netcl.core.telemetry import NO_SPAN, Span, tracing
from netcl.runtime.scheduler import _telemetry as tm
from netcl.runtime.scheduler._describe import describe_op, describe_value
from netcl.runtime.scheduler._errors import SchedulerError, failed_run
from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op, after_of

__all__ = ["Barriers", "Run", "Step"]

_Event = cl.Event
# A plan's last step is an attribute of the plan (not a dataclass field: fields are the plan's
# API), so it is kept exactly as long as the plan can be named in a later plan's ``after``.
_STEP = "_netcl_step"


class Step:
    """A plan as a run saw it: the ops the run that first reached it took (a resumed step adds
    the ops appended since), what each op that returned gave back, and how it was ordered."""

    __slots__ = ("barrier", "first", "ops", "ordering", "plan", "results", "settled", "via")

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.ops: tuple[Op, ...] | None = None  # None until a run reaches the plan
        self.results: list[object] = []  # one per op that returned, in op order
        self.first = 0  # len(results) when the current run reached it (for the ops counter)
        self.ordering: str | None = None  # how it was ordered (netcl.plan.ordering), once done
        self.via: tuple[Step, ...] = ()  # the steps whose events its ordering waited for
        self.barrier: cl.Event | None = None  # the barrier that ordered it on the device
        self.settled = False  # its events were waited for and succeeded

    def events(self) -> list[EventLike]:
        """The events its ops returned (or were), in op order."""
        out: list[EventLike] = []
        for r in self.results:
            if r is None:
                continue
            if isinstance(r, (list, tuple)):
                out += [x for x in r if x is not None]
            else:
                out.append(r)  # type: ignore[arg-type]
        return out

    def sources(self) -> tuple[Step, ...]:
        """The steps whose events a plan coming after this one waits for: this one when its ops
        returned events, else those its own ordering waited for (so the order passes through a
        plan that left nothing to wait for, e.g. one whose first op raised)."""
        return (self,) if self.events() else self.via


def last_step(plan: ExecutionPlan) -> Step | None:
    """The step of the run that last reached ``plan``; None when no run did."""
    step: Step | None = getattr(plan, _STEP, None)
    return step


class Barriers:
    """Barrier events kept until they are done. PoCL 3.0 aborts the process when a barrier is
    released before the failure of an event in its wait list has reached it."""

    __slots__ = ("_events", "_limit", "_lock")

    def __init__(self) -> None:
        self._events: list[cl.Event] = []
        self._limit = 64  # pruned when the list reaches it; then twice what is left
        self._lock = threading.Lock()

    def hold(self, barrier: cl.Event) -> None:
        with self._lock:
            if len(self._events) >= self._limit:
                self._events = [e for e in self._events if e.command_execution_status > 0]
                self._limit = max(64, 2 * len(self._events))
            self._events.append(barrier)


def _is_events(value: object) -> bool:
    """Whether an op's non-None return value is an event or a list/tuple of events."""
    if hasattr(value, "wait"):
        return True
    return isinstance(value, (list, tuple)) and all(v is None or hasattr(v, "wait") for v in value)


class Run:
    """One ``Scheduler.run``: the steps in run order and how far the run got with them."""

    __slots__ = ("async_mode", "barriers", "done", "host_waits", "ops", "started", "steps",
                 "taken", "traced", "waited")  # fmt: skip

    def __init__(self, async_mode: bool, barriers: Barriers) -> None:
        self.async_mode = async_mode
        self.barriers = barriers
        self.steps: list[Step] = []
        self.taken = False  # the scheduler handed its plans over (a refused run takes none)
        self.started = 0  # steps whose ops were reached; on an error the later ones are unrun
        self.done = 0  # steps[:done] completed; after an interrupt the scheduler keeps the rest
        self.host_waits = 0
        self.ops = 0  # ops that returned in this run (exact when the run completes)
        self.waited = False  # sync mode: the host waited for the previous plan's events
        self.traced = False

    def execute(self, wait: bool) -> list[EventLike]:
        """Run every step; return the events of the run, in op order."""
        self.traced = tracing()
        span = tm.TEL.span(tm.RUN_SPAN, self._attributes(wait)) if self.traced else NO_SPAN
        with span:
            events = self._steps(wait)
            span.set(tm.RUN_EVENTS, len(events))
        return events

    def _steps(self, wait: bool) -> list[EventLike]:
        """Order, issue and (sync mode) wait for each plan in turn; return the run's events."""
        steps = self.steps
        last = len(steps) - 1
        sync = not self.async_mode
        traced = self.traced
        events: list[EventLike] = []
        for k, step in enumerate(steps):
            span = self._plan_span(k, step.plan) if traced else NO_SPAN
            try:
                if step.ordering is None:  # a resumed step was ordered by the run it began in
                    step.ordering = (
                        self._order(step) if self.waited or step.plan.after else tm.ORDER_NONE
                    )
                self.waited = False
                step.first = len(step.results)  # before the step counts as started (ops counter)
                self.started = k + 1
                if self._issue(step) and sync:
                    plan_events = step.events()
                    if plan_events and (wait or k < last):
                        self._settle(step, plan_events, orders_next=k < last)
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
                self._wait(events, steps)
                for s in steps:
                    s.settled = True
        self.done = len(steps)
        return events

    def _settle(self, step: Step, events: list[EventLike], orders_next: bool) -> None:
        """Sync mode: wait for a plan's events; a wait before the next plan orders it."""
        self._wait(events, (step,))
        step.settled = True
        if orders_next:
            self.host_waits += 1
            self.waited = True

    # -- ordering: the one place that decides -------------------------------------------------
    def _order(self, step: Step) -> str:
        """Order ``step``'s plan after what it must follow; return how (a netcl.plan.ordering).

        Sync mode: the host waited for the previous plan already (``host`` when it had events).
        A plan with ``after`` waits for the last events of those plans (of this run or an earlier
        one) that are not known to be finished: async mode with a ``queue``, a barrier on it;
        otherwise, on the host.
        """
        ordering = tm.ORDER_HOST if self.waited else tm.ORDER_NONE
        if step.plan.after:
            sources: dict[int, Step] = {}
            for plan in after_of(step.plan):
                last = last_step(plan)
                if last is not None:
                    sources.update((id(s), s) for s in last.sources() if not s.settled)
            if sources:
                how = self._follow(step, tuple(sources.values()))
                if how is not tm.ORDER_NONE:
                    ordering = how
        return ordering

    def _follow(self, step: Step, sources: tuple[Step, ...]) -> str:
        events = [e for s in sources for e in s.events()]
        if not events:
            return tm.ORDER_NONE
        queue = step.plan.queue
        if self.async_mode and queue is not None and all(isinstance(e, _Event) for e in events):
            for ev in events:
                status = ev.command_execution_status  # type: ignore[attr-defined]
                if status < 0:  # never issue a plan on top of a failure already known
                    raise self._event_error(ev, f"failed (command status {status})", sources)
            try:
                # OpenCL starts commands another queue waits for only once their queue is
                # flushed; PoCL does not start them before that
                flushed = {id(queue)}
                for s in sources:
                    earlier = s.plan.queue
                    if earlier is not None and id(earlier) not in flushed:
                        flushed.add(id(earlier))
                        earlier.flush()
                barrier = cl.enqueue_barrier(queue, wait_for=events)
            except cl.Error:
                pass  # events of another context, say: the host waits instead
            else:
                self.barriers.hold(barrier)
                step.barrier, step.via = barrier, sources
                return tm.ORDER_DEVICE
        self.host_waits += 1
        self._wait(events, sources)
        for s in sources:
            s.settled = True
        return tm.ORDER_HOST

    # -- issuing ------------------------------------------------------------------------------
    def _issue(self, step: Step) -> bool:
        """Run the step's ops that have not returned yet; return whether it has events."""
        plan = step.plan
        ops = step.ops
        if ops is None:  # the first run to reach the plan takes its ops as they are now
            ops = step.ops = tuple(plan.ops)
        elif len(plan.ops) > len(ops):  # resumed: add the ops appended since
            ops = step.ops = ops + tuple(plan.ops[len(ops) :])
        plan._netcl_step = step  # type: ignore[attr-defined]  # its last step (see _STEP)
        results = step.results
        start = len(results)
        found = start > 0 and any(r is not None for r in results)
        for op in ops[start:] if start else ops:
            if callable(op):
                try:
                    results.append(result := op())  # the op has run: its result is stored
                except Exception as exc:
                    why = f"raised {type(exc).__name__}: {exc}"
                    raise self._error(step, len(results), None, why) from exc
                if result is None:
                    continue
                if type(result) is not _Event and not _is_events(result):
                    raise self._error(
                        step, len(results) - 1, None,
                        f"returned {describe_value(result)}; an op must return None, an event "
                        "(an object with wait()) or a list/tuple of events",
                    )  # fmt: skip
            elif callable(getattr(op, "wait", None)):
                results.append(op)
            else:
                raise self._error(
                    step, len(results), None,
                    "is neither callable nor an event-like object with a wait() method "
                    f"(it is {describe_value(op)})",
                )  # fmt: skip
            found = True
        self.ops += len(results) - start
        return found

    # -- waiting ------------------------------------------------------------------------------
    def _wait(self, events: list[EventLike], where: Sequence[Step]) -> None:
        """Wait for ``events`` (of the steps ``where``); raise naming the op of one that failed."""
        cl_events = [e for e in events if isinstance(e, _Event)]
        if len(cl_events) < len(events):  # other event-likes: their own wait(), in order
            self._wait_each([e for e in events if not isinstance(e, _Event)], where)
        if not cl_events:
            return
        try:  # one clWaitForEvents for the lot (a separate wait() costs ~4 µs each on PoCL)
            cl.wait_for_events(cl_events)
        except Exception:
            # find the culprit; a batch refused for another reason (events of several
            # contexts) passes here when every event waits fine on its own
            self._wait_each(cl_events, where)
        for ev in cl_events:
            status = ev.command_execution_status
            if status < 0:
                raise self._event_error(ev, f"failed (command status {status})", where)

    def _wait_each(self, events: list[EventLike], where: Sequence[Step]) -> None:
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
    def _event_error(self, event: EventLike, what: str, where: Sequence[Step]) -> SchedulerError:
        """The error for ``event`` failing: named after the op (of a step in ``where``) that
        returned it or was it."""
        for step in where:
            for i, r in enumerate(step.results):
                if r is event or (isinstance(r, (list, tuple)) and any(x is event for x in r)):
                    if r is event and step.ops is not None and step.ops[i] is event:
                        what = f"(an event submitted as op) {what}"
                    else:
                        what = f"returned an event ({describe_op(event)}) that {what}"
                    return self._error(step, i, event, what)
        raise LookupError(f"Scheduler.run: no op returned the failed event {event!r}")

    def _error(
        self, step: Step, op_index: int, event: EventLike | None, what: str
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
                if any(id(v) in behind for v in steps[k].via):
                    behind.add(id(steps[k]))
                    held.append(k)
            unrun = held + unrun
        assert step.ops is not None
        return failed_run(
            plan=step.plan,
            plan_index=index,
            op=step.ops[op_index],
            op_index=op_index,
            event=event,
            what=what,
            unrun=[(steps[k].plan, k) for k in unrun],
            events=[e for s in steps[: self.started] for e in s.events()],
        )

    # -- telemetry ----------------------------------------------------------------------------
    def _attributes(self, wait: bool) -> dict[str, AttributeValue]:
        return {
            tm.RUN_PLANS: len(self.steps),
            tm.RUN_OPS: sum(len(s.plan.ops) - len(s.results) for s in self.steps),
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

