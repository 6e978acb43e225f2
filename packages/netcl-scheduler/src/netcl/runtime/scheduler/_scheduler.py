"""Scheduler: runs ExecutionPlans in submission order, waiting between plans in sync mode."""

from __future__ import annotations

import contextlib
import threading
from typing import ClassVar

import pyopencl as cl
from opentelemetry.util.types import AttributeValue

from netcl.runtime.scheduler import _telemetry as tm
from netcl.runtime.scheduler._describe import describe_op, describe_plan, describe_value
from netcl.runtime.scheduler._errors import SchedulerError
from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op

__all__ = ["Scheduler"]

_Event = cl.Event


class _Run:
    """The state of one run: its plans and what it has issued so far."""

    __slots__ = ("events", "ops_done", "origins", "plans", "started")

    def __init__(self, plans: list[ExecutionPlan]) -> None:
        self.plans = plans
        self.events: list[EventLike] = []
        # per event: (plan index, op index, op), to name the culprit when an event fails
        self.origins: list[tuple[int, int, Op]] = []
        self.started = 0  # plans started; the ones after are "unrun" if the run stops
        self.ops_done = 0


class Scheduler:
    """Collects ops into :class:`ExecutionPlan` objects and runs the plans in submission order.

    ``async_mode=False`` (sync): each plan's events are waited for before the next plan starts,
    so plans on different queues are ordered. ``async_mode=True``: plans are issued back to
    back and ``run(wait=True)`` waits once, at the end. ``submit`` is safe from several threads.
    A failed run raises :attr:`Scheduler.Error`.
    """

    #: The exception ``run`` raises; see ``SchedulerError`` for its attributes.
    Error: ClassVar[type[SchedulerError]] = SchedulerError

    def __init__(self, async_mode: bool = False) -> None:
        if not isinstance(async_mode, bool):
            raise TypeError(
                f"Scheduler: async_mode must be a bool, got {describe_value(async_mode)}"
            )
        self.async_mode = async_mode
        self._lock = threading.Lock()
        # id(plan) -> plan, in first-submission order. A scheduled plan is referenced here, so
        # its id cannot be reused by another object while it waits.
        self._plans: dict[int, ExecutionPlan] = {}

    def submit(self, op: Op | ExecutionPlan, plan: ExecutionPlan | None = None) -> ExecutionPlan:
        """Append ``op`` to ``plan`` (a new plan when None) and schedule the plan; return it.

        ``op`` is a callable taking no arguments (its non-None return value is an event, or a
        list/tuple of events, to wait for) or an event-like object (anything with ``wait()``).
        A plan keeps the position of its first submission. ``submit(plan)`` with an
        ``ExecutionPlan`` schedules that plan as it is, adding no op (e.g. to rerun a plan, or
        the ``unrun_plans`` of a failed run).
        """
        if isinstance(op, ExecutionPlan):
            if plan is not None and plan is not op:
                raise TypeError(
                    "Scheduler.submit: an ExecutionPlan given as op is scheduled as it is; "
                    f"plan must then be None, got {describe_value(plan)}"
                )
            target, new_op = op, None
        else:
            if not callable(op) and not callable(getattr(op, "wait", None)):
                raise TypeError(
                    "Scheduler.submit: op must be a callable or an event-like object with a "
                    f"wait() method, got {describe_value(op)}"
                )
            if plan is None:
                target = ExecutionPlan()
            elif isinstance(plan, ExecutionPlan):
                target = plan
            else:
                raise TypeError(
                    "Scheduler.submit: plan must be an ExecutionPlan or None, got "
                    f"{describe_value(plan)}"
                )
            new_op = op
        with self._lock:
            if id(target) not in self._plans:
                self._plans[id(target)] = target
            if new_op is not None:
                target.ops.append(new_op)
        return target

    @property
    def plans(self) -> tuple[ExecutionPlan, ...]:
        """The plans scheduled for the next run, in the order they will run."""
        with self._lock:
            return tuple(self._plans.values())

    def run(self, wait: bool = True) -> list[EventLike]:
        """Run every scheduled plan in order; return the events the ops produced, in order.

        With ``wait=False`` the last events are returned without waiting for them (in sync mode
        plans are still waited for between each other: that ordering is the mode's contract).
        The plan list is emptied when the run starts, so the scheduler is reusable at once, and
        ops submitted while it runs go to the next run. Raises :attr:`Scheduler.Error` when an op
        raises or returns a non-event, or an event fails; the error carries the plans not run.
        """
        if not isinstance(wait, bool):
            raise TypeError(f"Scheduler.run: wait must be a bool, got {describe_value(wait)}")
        with self._lock:
            plans = list(self._plans.values())
            self._plans.clear()
        state = _Run(plans)
        ok = False
        try:
            if tm.tracing():
                self._run_traced(state, wait)
            else:
                self._execute(state, wait, traced=False)
            ok = True
            return state.events
        finally:
            tm.OPS.add(state.ops_done, tm.OPS_ATTRS[self.async_mode])
            tm.RUNS.add(1, tm.RUN_ATTRS[(self.async_mode, ok)])

    def _run_traced(self, state: _Run, wait: bool) -> None:
        attributes: dict[str, AttributeValue] = {
            "netcl.scheduler.plans": len(state.plans),
            "netcl.scheduler.ops": sum(len(p.ops) for p in state.plans),
            "netcl.scheduler.async": self.async_mode,
            "netcl.scheduler.wait": wait,
        }
        with tm.TRACER.start_as_current_span("netcl.scheduler.run", attributes=attributes) as span:
            self._execute(state, wait, traced=True)
            span.set_attribute("netcl.scheduler.events", len(state.events))

    def _execute(self, state: _Run, wait: bool, traced: bool) -> None:
        plans = state.plans
        last = len(plans) - 1
        sync = not self.async_mode
        for index, plan in enumerate(plans):
            state.started = index + 1
            wait_after = sync and (wait or index < last)
            if not traced:
                self._run_plan(state, index, plan, wait_after)
                continue
            attributes: dict[str, AttributeValue] = {
                "netcl.plan.description": str(plan.description),
                "netcl.plan.index": index,
                "netcl.plan.ops": len(plan.ops),
            }
            with tm.TRACER.start_as_current_span("netcl.scheduler.plan", attributes=attributes):
                self._run_plan(state, index, plan, wait_after)
        if not sync and wait:
            self._wait(state, 0)

    def _run_plan(self, state: _Run, index: int, plan: ExecutionPlan, wait_after: bool) -> None:
        events = state.events
        origins = state.origins
        first_event = len(events)
        # a snapshot: an op that submits to its own plan must not extend this run's loop
        ops = tuple(plan.ops)
        for i, op in enumerate(ops):
            if callable(op):
                try:
                    result = op()
                except Exception as exc:
                    raise self._op_error(
                        state, index, i, op, f"raised {type(exc).__name__}: {exc}"
                    ) from exc
                if result is None:
                    continue
                if isinstance(result, _Event) or hasattr(result, "wait"):
                    events.append(result)
                    origins.append((index, i, op))
                elif isinstance(result, (list, tuple)) and all(
                    r is None or hasattr(r, "wait") for r in result
                ):
                    for r in result:
                        if r is not None:
                            events.append(r)
                            origins.append((index, i, op))
                else:
                    raise self._op_error(
                        state,
                        index,
                        i,
                        op,
                        f"returned {describe_value(result)}; an op must return None, an event "
                        "(an object with wait()) or a list/tuple of events",
                    )
            elif callable(getattr(op, "wait", None)):
                events.append(op)
                origins.append((index, i, op))
            else:
                raise self._op_error(
                    state,
                    index,
                    i,
                    op,
                    "is neither callable nor an event-like object with a wait() method "
                    f"(it is {describe_value(op)})",
                )
        state.ops_done += len(ops)
        if wait_after:
            self._wait(state, first_event)

    def _op_error(
        self, state: _Run, plan_index: int, op_index: int, op: Op, what: str
    ) -> SchedulerError:
        """The error for an op that failed itself (no event); the ops before it count as run."""
        state.ops_done += op_index
        return self._error(state, plan_index, op_index, op, None, what)

    def _wait(self, state: _Run, first: int) -> None:
        """Wait for ``state.events[first:]``; raise naming the op of an event that failed."""
        events = state.events
        cl_at = [k for k in range(first, len(events)) if isinstance(events[k], _Event)]
        if len(cl_at) < len(events) - first:  # other event-likes: their own wait(), in order
            cl_set = set(cl_at)
            self._wait_each(state, [k for k in range(first, len(events)) if k not in cl_set])
        if cl_at:
            # one clWaitForEvents for the lot (a separate wait() costs ~4 µs each on PoCL)
            try:
                cl.wait_for_events([events[k] for k in cl_at])
            except Exception:
                # find the culprit; a batch refused for another reason (events of several
                # contexts) passes here when every event waits fine on its own
                self._wait_each(state, cl_at)
            for k in cl_at:
                status = events[k].command_execution_status  # type: ignore[attr-defined]
                if status < 0:
                    self._raise_for_event(state, k, f"failed (command status {status})")

    def _wait_each(self, state: _Run, indexes: list[int]) -> None:
        for k in indexes:
            ev = state.events[k]
            try:
                ev.wait()
            except Exception as exc:
                detail = ""
                if isinstance(ev, _Event):
                    with contextlib.suppress(Exception):
                        detail = f" (command status {ev.command_execution_status})"
                self._raise_for_event(
                    state, k, f"failed{detail}: wait() raised {type(exc).__name__}: {exc}", exc
                )

    def _raise_for_event(
        self, state: _Run, k: int, what: str, cause: BaseException | None = None
    ) -> None:
        plan_index, op_index, op = state.origins[k]
        event = state.events[k]
        if event is op:
            what = f"(an event submitted as op) {what}"
        else:
            what = f"returned an event ({describe_op(event)}) that {what}"
        raise self._error(state, plan_index, op_index, op, event, what) from cause

    def _error(
        self,
        state: _Run,
        plan_index: int,
        op_index: int,
        op: Op,
        event: EventLike | None,
        what: str,
    ) -> SchedulerError:
        plan = state.plans[plan_index]
        unrun = state.plans[state.started :]
        if unrun:
            names = ", ".join(describe_plan(p, state.started + j) for j, p in enumerate(unrun[:5]))
            more = f", ... ({len(unrun) - 5} more)" if len(unrun) > 5 else ""
            tail = (
                f"; {len(unrun)} later plan(s) not run: {names}{more} "
                "(on the error's .unrun_plans; resubmit with scheduler.submit(plan))"
            )
        else:
            tail = "; no plan was left unrun"
        message = (
            f"Scheduler.run: op {op_index} ({describe_op(op)}) of "
            f"{describe_plan(plan, plan_index)} {what}{tail}"
        )
        return SchedulerError(
            message,
            plan=plan,
            plan_index=plan_index,
            op=op,
            op_index=op_index,
            event=event,
            unrun_plans=unrun,
            events=list(state.events),
        )

    def __repr__(self) -> str:
        plans = self.plans
        ops = sum(len(p.ops) for p in plans)
        return f"Scheduler(async_mode={self.async_mode}, plans={len(plans)}, ops={ops})"
