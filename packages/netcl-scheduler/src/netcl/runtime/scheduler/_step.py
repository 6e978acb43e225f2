"""What a run records of each plan (:class:`Step`), which the plan keeps until it runs again, and
the scheduler's holder of barrier events."""

from __future__ import annotations

import threading
from typing import TypeAlias

import pyopencl as cl

from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op

__all__ = ["Barriers", "Source", "Step", "last_step"]

# A plan's last step is an attribute of the plan (not a dataclass field: fields are the plan's
# API), so it is kept exactly as long as the plan can be named in a later plan's ``after``. The
# step holds no reference back to its plan: a finished plan is freed as soon as it is dropped.
_STEP = "_netcl_step"


class Step:
    """A plan as the run that last reached it saw it: the ops it took (a resumed step adds the
    ops appended since), what each op that returned gave back, and how it was ordered."""

    __slots__ = ("barrier", "first", "ops", "ordering", "results", "settled", "via")

    def __init__(self) -> None:
        self.ops: tuple[Op, ...] | None = None  # None until a run reaches the plan
        self.results: list[object] = []  # one per op that returned, in op order
        self.first = 0  # len(results) when the current run reached it (for the ops counter)
        self.ordering: str | None = None  # how it was ordered (netcl.plan.ordering), once done
        self.via: tuple[Source, ...] = ()  # the plans (and steps) its ordering waited for
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

    def sources(self, plan: ExecutionPlan) -> tuple[Source, ...]:
        """Whose events a plan coming after ``plan`` (this step's plan) waits for: this step's
        when its ops returned events, else those its own ordering waited for (so the order
        passes through a plan that left nothing to wait for, e.g. one whose first op raised)."""
        return ((plan, self),) if self.events() else self.via


Source: TypeAlias = tuple[ExecutionPlan, Step]  # a plan and its step, whose events are followed


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
