"""Scheduler: keeps the plans for the next run and hands them to a :class:`Run`, which does the
work; after an interrupt it takes back what the run did not complete."""

from __future__ import annotations

import threading
from typing import ClassVar

from netcl.runtime.scheduler._errors import SchedulerError, describe_value
from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op, plan_of
from netcl.runtime.scheduler._run import Barriers, PlanRecord, Run, run_order

__all__ = ["Scheduler"]


class Scheduler:
    """Collects ops into :class:`ExecutionPlan` objects and runs the plans in submission order.

    ``async_mode=False`` (sync): each plan's events are waited for before the next plan starts.
    ``async_mode=True``: plans are issued back to back and ``run(wait=True)`` waits once, at the
    end; a plan with ``after`` is ordered after those plans (on the device with a ``queue``).
    Thread-safe. The package's guide describes the semantics in full.

    In checked mode (a checked :class:`~netcl.core.memory.BufferPool` alive) the host waits for
    each op's events and checks the guards of the checked pools' blocks after it: a kernel that
    wrote out of bounds raises :class:`~netcl.core.memory.MemoryCheckError` naming the op and its
    plan, and the plans not completed stay scheduled, as after an interrupt.
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
        # the plans of the next run by id (referenced here: no id is reused), in submission order
        self._plans: dict[int, ExecutionPlan] = {}
        # the records of scheduled plans that an interrupted run began: resumed where they stopped
        self._kept: dict[int, PlanRecord] = {}
        self._barriers = Barriers()

    def submit(self, op: Op | ExecutionPlan, plan: ExecutionPlan | None = None) -> ExecutionPlan:
        """Append ``op`` to ``plan`` (a new plan when None) and schedule the plan; return it.

        ``op`` is a callable taking no arguments (its non-None return value is an event, or a
        list/tuple of events, to wait for) or an event-like object (anything with ``wait()``).
        ``submit(plan)`` schedules an ``ExecutionPlan`` as it is, adding no op. A plan keeps the
        position of its first submission.
        """
        if isinstance(op, ExecutionPlan):
            if plan is not None and plan is not op:
                raise TypeError(
                    "Scheduler.submit: an ExecutionPlan given as op is scheduled as it is; "
                    f"plan must then be None, got {describe_value(plan)}"
                )
            with self._lock:
                self._plans.setdefault(id(op), op)
            return op
        if not callable(op) and not callable(getattr(op, "wait", None)):
            raise TypeError(
                "Scheduler.submit: op must be a callable or an event-like object with a "
                f"wait() method, got {describe_value(op)}"
            )
        if plan is None:  # the common case: a new plan of one op, scheduled once
            plan = plan_of(op)
            with self._lock:
                self._plans[id(plan)] = plan
            return plan
        if not isinstance(plan, ExecutionPlan):
            raise TypeError(
                "Scheduler.submit: plan must be an ExecutionPlan or None, got "
                f"{describe_value(plan)}"
            )
        with self._lock:
            self._plans.setdefault(id(plan), plan)
            plan.ops.append(op)
        return plan

    @property
    def plans(self) -> tuple[ExecutionPlan, ...]:
        """The plans scheduled for the next run, in order (an interrupted run's plans first)."""
        with self._lock:
            return tuple(self._plans.values())

    def run(self, wait: bool = True) -> list[EventLike]:
        """Run every scheduled plan in order; return the events the ops produced, in order.

        ``wait=False`` returns the last events without waiting for them. Ops submitted while it
        runs go to the next run. Raises :attr:`Scheduler.Error` when an op raises or returns a
        non-event, or an event fails (the error carries the plans not run); ``ValueError``
        naming a cycle of ``after``, before running anything. Any other exception (an interrupt)
        propagates unchanged, and the next ``run`` resumes what did not complete.
        """
        if not isinstance(wait, bool):
            raise TypeError(f"Scheduler.run: wait must be a bool, got {describe_value(wait)}")
        run = Run(self.async_mode, self._barriers)
        ok = False
        try:
            self._take(run)
            events = run.execute(wait)
            ok = True
            return events
        except SchedulerError:
            raise  # its contract: the scheduler keeps nothing of the run, the error carries it
        except BaseException:
            self._keep(run)
            raise
        finally:
            if run.taken:
                run.count(ok)

    def _take(self, run: Run) -> None:
        """Hand the scheduled plans to ``run``, in run order. The run holds them before the
        scheduler lets go (an interrupt in between leaves them in both: :meth:`_keep` merges)."""
        with self._lock:
            plans = list(self._plans.values())
            if any(p.after for p in plans):
                plans = run_order(plans)  # refused (a cycle, a bad after): nothing is taken
            if self._kept:  # the records of an interrupted run, resumed
                run.records = [self._kept.get(id(p)) or PlanRecord() for p in plans]
            else:  # the usual case, made fast: every plan gets a new record
                run.records = [PlanRecord() for _ in plans]
            run.plans = plans
            run.taken = True
            self._plans, self._kept = {}, {}

    def _keep(self, run: Run) -> None:
        """Put what an interrupted run did not complete back in front of the scheduled plans."""
        left = range(run.done, len(run.plans))
        plans = {id(run.plans[k]): run.plans[k] for k in left}
        # the records a run reached (one interrupted before that is made again)
        kept = {id(run.plans[k]): run.records[k] for k in left if run.records[k].ops is not None}
        with self._lock:
            self._plans = plans | self._plans  # then the plans submitted while the run ran
            self._kept = self._kept | kept

    def __repr__(self) -> str:
        plans = self.plans
        ops = sum(len(p.ops) for p in plans)
        return f"Scheduler(async_mode={self.async_mode}, plans={len(plans)}, ops={ops})"
