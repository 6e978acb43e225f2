"""Scheduler: runs ExecutionPlans in submission order (sync: host waits between plans; async:
back to back, plans with ``after`` ordered on the device), resumable after an interrupt."""

from __future__ import annotations

import contextlib
import threading
from typing import ClassVar

import pyopencl as cl
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from netcl.runtime.scheduler import _telemetry as tm
from netcl.runtime.scheduler._describe import describe_op, describe_plan, describe_value
from netcl.runtime.scheduler._errors import SchedulerError
from netcl.runtime.scheduler._order import run_order
from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op

__all__ = ["Scheduler"]

_Event = cl.Event
_Origin = tuple[int, int]  # (position of the plan in the run, index of the op in the plan)

# PoCL 3.0 aborts the process when a barrier event is released before the failure of an event
# in its wait list has reached it, so the scheduler holds its barriers until they are done
# (complete or failed); pruned when the list doubles.
_held: list[cl.Event] = []
_held_limit = [64]
_held_lock = threading.Lock()


def _hold(event: cl.Event) -> None:
    with _held_lock:
        if len(_held) >= _held_limit[0]:
            _held[:] = [e for e in _held if e.command_execution_status > 0]
            _held_limit[0] = max(64, 2 * len(_held))
        _held.append(event)


class _Entry:
    """A scheduled plan and how far runs got with it: ``results[k]`` is what op ``k`` returned,
    for every op before ``next_op`` (the ops that ran). Outlives a run that was interrupted."""

    __slots__ = ("first", "next_op", "ops", "plan", "results")

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.ops: tuple[Op, ...] = ()  # the ops as the first run that reached the plan saw them
        self.results: list[object] = []
        self.next_op = 0
        self.first = 0  # next_op when this run reached the plan (for the ops counter)


class _Run:
    """The state of one run: its plans in run order and how far it got."""

    __slots__ = ("done", "entries", "host_waits", "preds", "started", "waited")

    def __init__(self, entries: list[_Entry], preds: list[tuple[int, ...]] | None) -> None:
        self.entries = entries
        self.preds = preds  # per plan, the run positions of the plans it follows (None: no after)
        self.started = 0  # plans whose ops were reached; the ones after are "unrun" on an error
        self.done = 0  # entries[:done] are complete; the rest stay scheduled after an interrupt
        self.host_waits = 0
        self.waited = False  # sync mode: the host waited for the last plan's events


class Scheduler:
    """Collects ops into :class:`ExecutionPlan` objects and runs the plans in submission order.

    ``async_mode=False`` (sync): each plan's events are waited for before the next plan starts,
    so plans on different queues are ordered. ``async_mode=True``: plans are issued back to
    back and ``run(wait=True)`` waits once, at the end; a plan with ``after`` is ordered after
    those plans on the device (a barrier on its ``queue``), or by a host wait without a queue.
    ``submit`` is safe from several threads. A failed run raises :attr:`Scheduler.Error`; an
    interrupted run (KeyboardInterrupt, any BaseException) keeps what it did not complete, and
    the next ``run`` resumes it.
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
        # id(plan) -> progress of a scheduled plan that an interrupted run had started
        self._progress: dict[int, _Entry] = {}

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
        """The plans scheduled for the next run, in submission order (an interrupted run's
        plans first)."""
        with self._lock:
            return tuple(self._plans.values())

    def run(self, wait: bool = True) -> list[EventLike]:
        """Run every scheduled plan in order; return the events the ops produced, in order.

        With ``wait=False`` the last events are returned without waiting for them (in sync mode
        plans are still waited for between each other: that ordering is the mode's contract).
        The plan list is emptied when the run starts, so the scheduler is reusable at once, and
        ops submitted while it runs go to the next run. Raises :attr:`Scheduler.Error` when an op
        raises or returns a non-event, or an event fails; the error carries the plans not run.
        Raises ``ValueError`` naming the cycle when plans follow each other (``after``) in a
        cycle; nothing runs then. Any other exception (KeyboardInterrupt included) propagates
        unchanged and the plans that did not complete stay scheduled: the interrupted plan from
        the interrupted op on, then the later plans; the next ``run`` resumes there.
        """
        if not isinstance(wait, bool):
            raise TypeError(f"Scheduler.run: wait must be a bool, got {describe_value(wait)}")
        taken: list[ExecutionPlan] = []
        progress: dict[int, _Entry] = {}
        state: _Run | None = None
        ok = False
        try:
            with self._lock:
                plans, preds = run_order(list(self._plans.values()))  # a cycle: nothing taken
                progress = self._progress
                taken = plans
                # no call between these stores: an interrupt cannot take the plans halfway
                self._plans = {}
                self._progress = {}
            state = _Run([progress.get(id(p)) or _Entry(p) for p in taken], preds)
            if tm.tracing():
                events = self._run_traced(state, wait)
            else:
                events = self._execute(state, wait, traced=False)
            ok = True
            return events
        except SchedulerError:
            raise  # its contract: the scheduler keeps nothing of the run, the error carries it
        except BaseException:
            self._keep(state, taken, progress)
            raise
        finally:
            if state is not None:
                ops = sum(e.next_op - e.first for e in state.entries[: state.started])
                tm.OPS.add(ops, tm.OPS_ATTRS[self.async_mode])
                tm.RUNS.add(1, tm.RUN_ATTRS[(self.async_mode, ok)])
                if state.host_waits:
                    tm.HOST_WAITS.add(state.host_waits, tm.HOST_WAIT_ATTRS[self.async_mode])

    def _keep(
        self, state: _Run | None, taken: list[ExecutionPlan], progress: dict[int, _Entry]
    ) -> None:
        """Put the plans an interrupted run did not complete back in front of the scheduled ones."""
        if state is None:
            left = [progress.get(id(p)) or _Entry(p) for p in taken]
        else:
            left = state.entries[state.done :]
        with self._lock:
            plans = {id(e.plan): e.plan for e in left}
            for key, plan in self._plans.items():  # submitted while the run ran
                plans.setdefault(key, plan)
            self._plans = plans
            for e in left:
                if e.next_op:
                    self._progress.setdefault(id(e.plan), e)

    def _run_traced(self, state: _Run, wait: bool) -> list[EventLike]:
        attributes: dict[str, AttributeValue] = {
            tm.RUN_PLANS: len(state.entries),
            tm.RUN_OPS: sum(len(e.plan.ops) - e.next_op for e in state.entries),
            tm.ASYNC: self.async_mode,
            tm.RUN_WAIT: wait,
        }
        handle = tm.start_span(tm.RUN_SPAN, attributes)
        try:
            events = self._execute(state, wait, traced=True)
        except BaseException as exc:
            tm.end_span(handle, exc)
            raise
        if handle is not None:
            handle[0].set_attribute(tm.RUN_EVENTS, len(events))
        tm.end_span(handle)
        return events

    def _execute(self, state: _Run, wait: bool, traced: bool) -> list[EventLike]:
        entries = state.entries
        last = len(entries) - 1
        sync = not self.async_mode
        events: list[EventLike] = []
        for index, entry in enumerate(entries):
            state.started = index
            wait_after = sync and (wait or index < last)
            if not traced:
                plan_events = self._run_plan(state, index, entry, wait_after, None)
            else:
                plan = entry.plan
                attributes: dict[str, AttributeValue] = {
                    tm.PLAN_DESCRIPTION: str(plan.description),
                    tm.PLAN_INDEX: index,
                    tm.PLAN_OPS: len(plan.ops),
                }
                handle = tm.start_span(tm.PLAN_SPAN, attributes)
                try:
                    plan_events = self._run_plan(
                        state, index, entry, wait_after, None if handle is None else handle[0]
                    )
                except BaseException as exc:
                    tm.end_span(handle, exc)
                    raise
                tm.end_span(handle)
            if sync:
                if plan_events:
                    events += plan_events
                state.done = index + 1
        if not sync:
            everything = range(len(entries))
            events = self._wait(state, everything) if wait else self._collect(state, everything)[0]
        state.done = len(entries)
        return events

    def _run_plan(
        self, state: _Run, index: int, entry: _Entry, wait_after: bool, span: trace.Span | None
    ) -> list[EventLike] | None:
        """Order, issue and (sync mode) wait for one plan; in sync mode return its events."""
        if self.async_mode:
            preds = state.preds
            ordering = (
                self._order_after(state, preds[index]) if preds and preds[index] else tm.ORDER_NONE
            )
        else:  # sync mode: ordered if the host waited for the plan before (it had events)
            ordering = tm.ORDER_HOST if state.waited else tm.ORDER_NONE
            state.waited = False
        if span is not None:
            span.set_attribute(tm.ORDERING, ordering)
        entry.first = entry.next_op  # before the plan counts as started: the ops counter
        state.started = index + 1
        if not self._issue(state, index, entry) or self.async_mode:
            return None
        if not wait_after:
            return self._collect(state, (index,))[0]
        events = self._wait(state, (index,))
        if index < len(state.entries) - 1:  # a wait that orders the next plan, not the final one
            state.host_waits += 1
            state.waited = True
        return events

    def _order_after(self, state: _Run, preds: tuple[int, ...]) -> str:
        """Make the plan at ``state.started`` follow the plans at ``preds``: a barrier on its
        queue waiting for their events, or a host wait; return how (a ``netcl.plan.ordering``)."""
        events, origins = self._collect(state, preds)
        if not events:
            return tm.ORDER_NONE
        entries = state.entries
        queue = entries[state.started].plan.queue
        if queue is not None and all(isinstance(e, _Event) for e in events):
            for k, ev in enumerate(events):
                status = ev.command_execution_status  # type: ignore[attr-defined]
                if status < 0:  # never issue a plan on top of a failure already known
                    self._raise_for_event(
                        state, events, origins, k, f"failed (command status {status})"
                    )
            try:
                # OpenCL starts commands another queue waits for only once their queue is
                # flushed; PoCL does not start them before that
                flushed = {id(queue)}
                for n in preds:
                    earlier = entries[n].plan.queue
                    if earlier is not None and id(earlier) not in flushed:
                        flushed.add(id(earlier))
                        earlier.flush()
                _hold(cl.enqueue_barrier(queue, wait_for=events))
                return tm.ORDER_DEVICE
            except cl.Error:
                pass  # events of another context, say: the host waits instead
        state.host_waits += 1
        self._wait_events(state, events, origins)
        return tm.ORDER_HOST

    def _issue(self, state: _Run, index: int, entry: _Entry) -> bool:
        """Run the ops of ``entry`` from ``entry.next_op`` on; return whether any op of the plan
        returned something (events to wait for)."""
        plan = entry.plan
        # a snapshot: an op that submits to its own plan must not extend this run's loop; a plan
        # resumed after an interrupt keeps the snapshot of its first run plus ops appended since
        if entry.ops:
            ops = entry.ops + tuple(plan.ops[len(entry.ops) :])
            results = entry.results
            results.extend([None] * (len(ops) - len(results)))
        else:
            ops = tuple(plan.ops)
            entry.results = results = [None] * len(ops)
        entry.ops = ops
        found = entry.next_op > 0
        for i in range(entry.next_op, len(ops)):
            op = ops[i]
            if callable(op):
                try:
                    result = op()
                except Exception as exc:
                    raise self._error(
                        state, index, i, op, None, f"raised {type(exc).__name__}: {exc}"
                    ) from exc
            elif callable(getattr(op, "wait", None)):
                result = op
            else:
                raise self._error(
                    state,
                    index,
                    i,
                    op,
                    None,
                    "is neither callable nor an event-like object with a wait() method "
                    f"(it is {describe_value(op)})",
                )
            # The op returned: keep its result and count it done before anything an interrupt
            # can land in (Python delivers a KeyboardInterrupt only at calls and loop jumps, and
            # there is none from the op's return to these two stores), so a resumed run neither
            # repeats nor loses it.
            results[i] = result
            entry.next_op = i + 1
            if result is None:
                continue
            found = True
            if (
                not isinstance(result, _Event)
                and not hasattr(result, "wait")
                and not (
                    isinstance(result, (list, tuple))
                    and all(r is None or hasattr(r, "wait") for r in result)
                )
            ):
                raise self._error(
                    state,
                    index,
                    i,
                    op,
                    None,
                    f"returned {describe_value(result)}; an op must return None, an event "
                    "(an object with wait()) or a list/tuple of events",
                )
        return found

    def _collect(
        self, state: _Run, positions: range | tuple[int, ...]
    ) -> tuple[list[EventLike], list[_Origin]]:
        """The events the ops of the plans at ``positions`` returned, and where each came from."""
        events: list[EventLike] = []
        origins: list[_Origin] = []
        entries = state.entries
        for n in positions:
            entry = entries[n]
            results = entry.results
            for i in range(entry.next_op):
                r = results[i]
                if r is None:
                    continue
                if isinstance(r, (list, tuple)):
                    for x in r:
                        if x is not None:
                            events.append(x)
                            origins.append((n, i))
                else:
                    events.append(r)  # type: ignore[arg-type]
                    origins.append((n, i))
        return events, origins

    def _wait(self, state: _Run, positions: range | tuple[int, ...]) -> list[EventLike]:
        events, origins = self._collect(state, positions)
        self._wait_events(state, events, origins)
        return events

    def _wait_events(self, state: _Run, events: list[EventLike], origins: list[_Origin]) -> None:
        """Wait for ``events``; raise naming the op of an event that failed."""
        cl_at = [k for k, e in enumerate(events) if isinstance(e, _Event)]
        if len(cl_at) < len(events):  # other event-likes: their own wait(), in order
            cl_set = set(cl_at)
            other = [k for k in range(len(events)) if k not in cl_set]
            self._wait_each(state, events, origins, other)
        if cl_at:
            # one clWaitForEvents for the lot (a separate wait() costs ~4 µs each on PoCL)
            try:
                cl.wait_for_events(
                    events if len(cl_at) == len(events) else [events[k] for k in cl_at]
                )
            except Exception:
                # find the culprit; a batch refused for another reason (events of several
                # contexts) passes here when every event waits fine on its own
                self._wait_each(state, events, origins, cl_at)
            for k in cl_at:
                status = events[k].command_execution_status  # type: ignore[attr-defined]
                if status < 0:
                    self._raise_for_event(
                        state, events, origins, k, f"failed (command status {status})"
                    )

    def _wait_each(
        self, state: _Run, events: list[EventLike], origins: list[_Origin], indexes: list[int]
    ) -> None:
        for k in indexes:
            ev = events[k]
            try:
                ev.wait()
            except Exception as exc:
                detail = ""
                if isinstance(ev, _Event):
                    with contextlib.suppress(Exception):
                        detail = f" (command status {ev.command_execution_status})"
                self._raise_for_event(
                    state,
                    events,
                    origins,
                    k,
                    f"failed{detail}: wait() raised {type(exc).__name__}: {exc}",
                    exc,
                )

    def _raise_for_event(
        self,
        state: _Run,
        events: list[EventLike],
        origins: list[_Origin],
        k: int,
        what: str,
        cause: BaseException | None = None,
    ) -> None:
        plan_index, op_index = origins[k]
        op = state.entries[plan_index].ops[op_index]
        event = events[k]
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
        entries = state.entries
        plan = entries[plan_index].plan
        unrun = list(range(state.started, len(entries)))
        if event is not None and state.preds is not None:
            # plans issued already that come after the failed one: held back on the device by
            # the failure (their commands fail with it), so they did not run either
            behind = {plan_index}
            for k in range(plan_index + 1, state.started):
                if any(j in behind for j in state.preds[k]):
                    behind.add(k)
            behind.discard(plan_index)
            unrun = sorted(behind) + unrun
        if unrun:
            names = ", ".join(describe_plan(entries[k].plan, k) for k in unrun[:5])
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
            unrun_plans=[entries[k].plan for k in unrun],
            events=self._collect(state, range(state.started))[0],
        )

    def __repr__(self) -> str:
        plans = self.plans
        ops = sum(len(p.ops) for p in plans)
        return f"Scheduler(async_mode={self.async_mode}, plans={len(plans)}, ops={ops})"
