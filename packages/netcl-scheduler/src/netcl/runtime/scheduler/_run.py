"""One run of a Scheduler: its plans in run order, each with the :class:`PlanRecord` of what the
run did with it: ordering it after what it must follow (the one place that chooses between a
device barrier, a host wait and nothing), issuing its ops, waiting, and naming what failed.

State only moves forward, one store at a time, so an interrupt leaves every record consistent
wherever it lands: an op has run once its result is in ``record.results``, a plan is ordered
once ``record.ordering`` is set (one interrupted before is ordered again, harmlessly), and
``run.done`` counts the plans that completed (the scheduler keeps the others).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

import pyopencl as cl

from netcl.core.device import Checking, checker, watcher
from netcl.core.packing import dependency_order
from netcl.core.telemetry import NO_SPAN, Span, tracing
from netcl.runtime.scheduler import _telemetry as tm
from netcl.runtime.scheduler._errors import (
    SchedulerError,
    describe_op,
    describe_plan,
    describe_value,
)
from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op, after_of

if TYPE_CHECKING:
    from netcl.core.profiling import Collector

__all__ = ["Barriers", "PlanRecord", "Run", "run_order"]

_Event = cl.Event
_is_cl_event = _Event.__instancecheck__  # isinstance(e, cl.Event) that map calls in C (no frame)
_STATUS = cl.event_info.COMMAND_EXECUTION_STATUS  # read by get_info: the property adds a call


class PlanRecord:
    """A plan as the run that last reached it saw it: the ops it took (a resumed record adds the
    ops appended since), what each op that returned gave back, and how it was ordered. It holds
    no reference to its own plan."""

    __slots__ = ("barrier", "first", "ops", "ordering", "results", "settled", "via")

    def __init__(self) -> None:  # by hand: a dataclass's __init__ takes half as long again
        self.ops: tuple[Op, ...] | None = None  # None until a run reaches the plan
        self.results: list[object] = []  # one per op that returned, in op order
        self.first = 0  # len(results) when the current run reached it (for the ops counter)
        self.ordering: str | None = None  # how it was ordered (netcl.plan.ordering), once done
        self.via: tuple[_Source, ...] = ()  # what its ordering waited for
        self.barrier: cl.Event | None = None  # the barrier that ordered it (see Barriers)
        self.settled = False  # its events were waited for and succeeded


# A plan and its record, whose events a later plan follows: a plain pair (zip makes them in C)
_Source: TypeAlias = tuple[ExecutionPlan, PlanRecord]


class _LastRecord(weakref.ref[ExecutionPlan]):
    """A weak reference to a plan, with the record of the run that last reached it."""

    __slots__ = ("record",)
    record: PlanRecord


# The last records, for the plans that come after theirs in later runs, by id(plan): plans are
# unhashable dataclasses, and nothing is written onto them. An entry leaves with its plan: its
# callback is _last_records.pop bound to the key, C code that no interrupt can cut short. Records
# that leave nothing to follow (no events, no ordering) are left out, like no record at all.
_last_records: dict[int, _LastRecord] = {}


@dataclass(slots=True, eq=False)
class Barriers:
    """Barrier events kept until they are done. PoCL 3.0 aborts the process when a barrier is
    released before the failure of an event in its wait list has reached it."""

    _events: list[cl.Event] = field(default_factory=list)
    _limit: int = 64  # pruned when the list reaches it; then twice what is left
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, barrier: cl.Event) -> None:
        with self._lock:
            if len(self._events) >= self._limit:
                self._events = [e for e in self._events if e.command_execution_status > 0]
                self._limit = max(64, 2 * len(self._events))
            self._events.append(barrier)


def run_order(plans: list[ExecutionPlan]) -> list[ExecutionPlan]:
    """The plans in run order: submission order unless a plan comes ``after`` one submitted
    later; then the stable topological order (the earliest submitted ready plan first). Raises
    ``ValueError`` naming a cycle, ``TypeError`` naming an ``after`` that holds no plans."""
    position = {id(p): k for k, p in enumerate(plans)}
    late = False  # a plan comes after one submitted later (plain loops: no frame per plan)
    for k, plan in enumerate(plans):
        for q in after_of(plan):  # -1: a plan of no run, or of an earlier one
            late = late or position.get(id(q), -1) >= k
    if not late:
        return plans
    # per plan: the positions of the plans of this run it comes after
    order, cycle = dependency_order(
        [[position[id(q)] for q in after_of(plan) if id(q) in position] for plan in plans]
    )
    if not cycle:
        return [plans[k] for k in order]
    start = cycle.index(min(cycle))  # from the plan submitted first: the same text every time
    names = " -> ".join(describe_plan(plans[j], j) for j in [*cycle[start:], *cycle[: start + 1]])
    raise ValueError(
        f"Scheduler.run: the plans' after= fields form a cycle: {names} (each comes after the "
        "one before it); nothing was run and the plans stay scheduled"
    )


def _begin_watch(
    plan: ExecutionPlan, watched: dict[int, Collector | None]
) -> tuple[Collector | None, cl.Event | None]:
    """Device time only for a plan that names a watched queue (one attribute test per plan
    otherwise: plans made by submit(op) have no queue); a plain queue's plan starts from a stamp
    made before its ops. ``watched`` holds watcher() by id(queue), asked once a run."""
    queue = plan.queue
    if queue is None:
        return None, None
    if id(queue) not in watched:
        watched[id(queue)] = watcher(queue)
    collector = watched[id(queue)]
    if collector is None:
        return None, None
    return collector, collector.begin(queue)


def _watch_plan(
    collector: Collector,
    plan: ExecutionPlan,
    record: PlanRecord,
    span: Span,
    begin: cl.Event | None,
) -> None:
    """Hand the cl.Events the plan's ops returned in this run to the device-time collector
    (``begin``: a plain queue's start stamp)."""
    if events := [e for e in _events(record.results[record.first :]) if isinstance(e, _Event)]:
        name = plan.description or None
        collector.watch(
            "scheduler.plan", events, name=name, parent=span, queue=plan.queue, begin=begin
        )


def _events(results: Iterable[object]) -> list[EventLike]:
    """The events in ops' results, in order (a returned list or tuple item by item, no None)."""
    return [  # type: ignore[misc]
        x for r in results for x in (r if isinstance(r, (list, tuple)) else (r,)) if x is not None
    ]


def _is_events(value: object) -> bool:
    """Whether an op's non-None return value is an event or a list/tuple of events."""
    return hasattr(value, "wait") or (
        isinstance(value, (list, tuple)) and all(v is None or hasattr(v, "wait") for v in value)
    )


@dataclass(slots=True, eq=False)
class Run:
    """One ``Scheduler.run``: the plans in run order, their records, and how far the run got."""

    async_mode: bool
    barriers: Barriers
    plans: list[ExecutionPlan] = field(default_factory=list)
    records: list[PlanRecord] = field(default_factory=list)  # records[k]: that of plans[k]
    taken: bool = False  # the scheduler handed its plans over (a refused run takes none)
    started: int = 0  # plans whose ops were reached; on an error the later ones are unrun
    done: int = 0  # plans[:done] completed; after an interrupt the scheduler keeps the rest
    host_waits: int = 0
    waited: bool = False  # sync mode: the host waited for the previous plan's events

    def execute(self, wait: bool) -> list[EventLike]:
        """Order, issue and (sync mode) wait for each plan in turn; return the run's events."""
        plans, records = self.plans, self.records
        last = len(plans) - 1
        sync = not self.async_mode
        traced = tracing()
        # checked mode (a checked BufferPool alive): each op's writes checked after it
        checked = checker()
        run_span = NO_SPAN
        if traced:
            left = sum(len(p.ops) - len(r.results) for p, r in zip(plans, records, strict=True))
            attributes = {
                tm.RUN_PLANS: len(plans),
                tm.RUN_OPS: left,
                tm.ASYNC: self.async_mode,
                tm.RUN_WAIT: wait,
            }
            run_span = tm.TEL.span(tm.RUN_SPAN, attributes)
        events: list[EventLike] = []
        watched: dict[int, Collector | None] = {}  # watcher() by id(queue), once a run
        with run_span:
            for k, plan in enumerate(plans):
                record = records[k]
                span = NO_SPAN
                if traced:
                    span = tm.TEL.span(
                        tm.PLAN_SPAN,
                        {
                            tm.PLAN_DESCRIPTION: str(plan.description),
                            tm.PLAN_INDEX: k,
                            tm.PLAN_OPS: len(plan.ops),
                        },
                    )
                try:
                    if record.ordering is None:  # a resumed record was ordered by its first run
                        if self.waited or plan.after:
                            record.ordering = self._order(plan, record)
                        else:
                            record.ordering = tm.ORDER_NONE
                    self.waited = False
                    record.first = len(record.results)  # before the plan counts as started
                    self.started = k + 1
                    collector, begin = _begin_watch(plan, watched)
                    found = self._issue(plan, record, k, checked)
                    if found and collector is not None:
                        _watch_plan(collector, plan, record, span, begin)
                    if found and sync:
                        plan_events = _events(record.results)
                        if plan_events and (wait or k < last):  # a wait that orders the next
                            self._wait(plan_events, [(plan, record)])
                            record.settled = True
                            if k < last:
                                self.host_waits += 1
                                self.waited = True
                        events += plan_events
                except BaseException as exc:
                    if record.ordering is not None:
                        span.set(tm.ORDERING, record.ordering)
                    span.end(exc)
                    raise
                if traced:
                    span.set(tm.ORDERING, record.ordering)
                    span.end()
                if sync:
                    self.done = k + 1
            if not sync:  # the events in one pass (not one a plan, as they are issued)
                events = _events([x for r in records for x in r.results])
                if wait:
                    self._wait(events, list(zip(plans, records, strict=True)))
                    for r in records:
                        r.settled = True
            self.done = len(plans)
            run_span.set(tm.RUN_EVENTS, len(events))
        return events

    def _order(self, plan: ExecutionPlan, record: PlanRecord) -> str:
        """Order ``plan`` after the unfinished last events of the plans it comes ``after`` (of
        this run or an earlier one): a barrier on its ``queue`` in async mode, else on the host.
        Return how (netcl.plan.ordering; in sync mode the host waited for the plan before)."""
        followed: dict[int, _Source] = {}  # by id(record): each record followed once
        events: list[EventLike] = []  # the events of the records followed
        after = plan.after  # a tuple that run_order checked (reassigned since: after_of checks)
        for earlier in after if type(after) is tuple else after_of(plan):
            entry = _last_records.get(id(earlier))
            if entry is not None:  # a run reached it: its last events, else what its ordering
                # waited for (the order passes through a plan that left nothing to wait for)
                last = entry.record
                theirs = _events(last.results)
                for p, r in ((earlier, last),) if theirs else last.via:
                    if not r.settled and id(r) not in followed:
                        followed[id(r)] = (p, r)
                        events += theirs if r is last else _events(r.results)
        if not events:
            return tm.ORDER_HOST if self.waited else tm.ORDER_NONE
        queue = plan.queue
        if self.async_mode and queue is not None and all(map(_is_cl_event, events)):
            for ev in events:  # never issue a plan on top of a failure already known
                if (status := ev.get_info(_STATUS)) < 0:  # type: ignore[attr-defined]
                    where = followed.values()
                    raise self._event_error(ev, f"failed (command status {status})", where)
            try:
                # OpenCL starts commands another queue waits for only once their queue is
                # flushed; PoCL does not start them before that (one followed twice: two flushes)
                for p, _ in followed.values():
                    if p.queue is not None and p.queue is not queue:
                        p.queue.flush()
                barrier = cl.enqueue_barrier(queue, wait_for=events)
            except cl.Error:
                pass  # events of another context, say: the host waits instead
            else:
                self.barriers.hold(barrier)
                record.barrier, record.via = barrier, tuple(followed.values())
                return tm.ORDER_DEVICE
        self.host_waits += 1
        self._wait(events, followed.values())
        for _, r in followed.values():
            r.settled = True
        return tm.ORDER_HOST

    def _issue(
        self, plan: ExecutionPlan, record: PlanRecord, index: int, checked: Checking | None
    ) -> bool:
        """Run the plan's ops that have not returned yet; return whether its record has events.
        ``checked``: wait for each op's events and check the checked pools' guards after it."""
        ops = record.ops
        if ops is None:  # the first run to reach the plan takes its ops as they are now
            ops = record.ops = tuple(plan.ops)
        elif len(plan.ops) > len(ops):  # resumed: add the ops appended since
            ops = record.ops = ops + tuple(plan.ops[len(ops) :])
        results = record.results
        start = len(results)
        found = start > 0 and any(r is not None for r in results)
        try:
            for op in ops[start:] if start else ops:
                if callable(op):
                    try:
                        results.append(result := op())  # the op has run: its result is stored
                    except Exception as exc:
                        why = f"raised {type(exc).__name__}: {exc}"
                        raise self._error(plan, record, len(results), None, why) from exc
                    if result is not None:
                        found = True
                        if not isinstance(result, _Event) and not _is_events(result):
                            why = (
                                f"returned {describe_value(result)}; an op must return None, "
                                "an event (an object with wait()) or a list/tuple of events"
                            )
                            raise self._error(plan, record, len(results) - 1, None, why)
                elif callable(getattr(op, "wait", None)):
                    results.append(op)
                    found = True
                else:
                    why = (
                        "is neither callable nor an event-like object with a wait() method "
                        f"(it is {describe_value(op)})"
                    )
                    raise self._error(plan, record, len(results), None, why)
                if checked is not None:
                    self._check_memory(checked, plan, record, index, len(results) - 1)
        finally:  # the plans after this one follow what it did, whether or not an op raised
            if found or record.via:
                key = id(plan)
                if (entry := _last_records.get(key)) is None:
                    drop = functools.partial(_last_records.pop, key)  # called as drop(entry)
                    entry = _last_records[key] = _LastRecord(plan, drop)
                entry.record = record
            elif _last_records:
                _last_records.pop(id(plan), None)
        return found

    def _check_memory(
        self, checked: Checking, plan: ExecutionPlan, record: PlanRecord, index: int, i: int
    ) -> None:
        """Checked mode, after op ``i`` of ``plan`` (run ``index``): wait for its events, then
        check every guard of the checked pools; MemoryCheckError names the op and the plan."""
        self._wait(_events(record.results[i : i + 1]), [(plan, record)])
        assert record.ops is not None
        op = describe_op(record.ops[i])
        checked.check_all(f"Scheduler.run: op {i} ({op}) of {describe_plan(plan, index)}")

    def _wait(self, events: list[EventLike], where: Collection[_Source]) -> None:
        """Wait for ``events`` (of the plans ``where``); raise naming the op of one that failed."""
        # other event-likes first, by their own wait(); then the cl.Events in one
        # clWaitForEvents (a separate wait() costs ~4 µs each on PoCL)
        self._wait_each([e for e in events if not isinstance(e, _Event)], where)
        cl_events = [e for e in events if isinstance(e, _Event)]
        try:
            if cl_events:
                cl.wait_for_events(cl_events)
        except Exception:
            # find the culprit; a batch refused for another reason (events of several
            # contexts) passes here when every event waits fine on its own
            self._wait_each(cl_events, where)
        # each status read too: NVIDIA's clWaitForEvents succeeds over failed events (against
        # OpenCL's CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST, which PoCL returns)
        for ev in cl_events:
            if (status := ev.get_info(_STATUS)) < 0:
                raise self._event_error(ev, f"failed (command status {status})", where)

    def _wait_each(self, events: Iterable[EventLike], where: Collection[_Source]) -> None:
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

    def _event_error(self, event: EventLike, what: str, where: Iterable[_Source]) -> SchedulerError:
        """The error for ``event`` failing, named after the op (of a plan in ``where``) that
        returned it or was it."""
        plan, record, i = next(
            (plan, record, i)
            for plan, record in where
            for i, r in enumerate(record.results)
            if r is event or (isinstance(r, (list, tuple)) and any(x is event for x in r))
        )
        if record.ops is not None and record.ops[i] is event:
            what = f"(an event submitted as op) {what}"
        else:
            what = f"returned an event ({describe_op(event)}) that {what}"
        return self._error(plan, record, i, event, what)

    def _error(
        self,
        plan: ExecutionPlan,
        record: PlanRecord,
        op_index: int,
        event: EventLike | None,
        what: str,
    ) -> SchedulerError:
        """The error of a run that stopped at op ``op_index`` of ``plan``: ``what`` happened."""
        records = self.records
        index = next((k for k, r in enumerate(records) if r is record), None)  # None: earlier run
        unrun = list(range(self.started, len(records)))
        if event is not None and index is not None:
            # plans issued already that come after the failed one: held back on the device by
            # the failure (their commands fail with it), so they did not run either
            behind = {id(record)}
            held = []
            for k in range(index + 1, self.started):
                if any(id(r) in behind for _, r in records[k].via):
                    behind.add(id(records[k]))
                    held.append(k)
            unrun = held + unrun
        tail = "; no plan was left unrun"
        if unrun:
            names = ", ".join(describe_plan(self.plans[k], k) for k in unrun[:5])
            more = f", ... ({len(unrun) - 5} more)" if len(unrun) > 5 else ""
            tail = (
                f"; {len(unrun)} later plan(s) not run: {names}{more} "
                "(on the error's .unrun_plans; resubmit with scheduler.submit(plan))"
            )
        assert record.ops is not None  # a run reached the plan
        op = record.ops[op_index]
        return SchedulerError(
            f"Scheduler.run: op {op_index} ({describe_op(op)}) of {describe_plan(plan, index)} "
            f"{what}{tail}",
            plan=plan,
            plan_index=-1 if index is None else index,
            op=op,
            op_index=op_index,
            event=event,
            unrun_plans=[self.plans[k] for k in unrun],
            events=_events(x for r in records[: self.started] for x in r.results),
        )

    def count(self, ok: bool) -> None:
        """Add this run to the scheduler's counters (ops that returned, runs, host waits)."""
        mode = self.async_mode
        tm.OPS.add(sum(len(r.results) - r.first for r in self.records[: self.started]), mode)
        tm.RUNS["ok" if ok else "error"].add(1, mode)
        if self.host_waits:
            tm.HOST_WAITS.add(self.host_waits, mode)
