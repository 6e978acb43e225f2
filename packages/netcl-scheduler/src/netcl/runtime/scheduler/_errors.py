"""The error Scheduler.run raises (exposed as ``Scheduler.Error``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op

__all__ = ["SchedulerError"]


class SchedulerError(RuntimeError):
    """A run stopped: an op raised or returned something that is not an event, or an event failed.

    Attributes:
        plan: the plan that failed; plan_index: its position in the run (0-based).
        op: the op that failed; op_index: its position in ``plan.ops``.
        event: the failed event, or None when the op itself raised or returned a bad value.
        unrun_plans: the plans of this run that were not started (in order), preceded, when an
            event failed, by the plans already issued that come ``after`` the failed plan (their
            commands fail with it on the device); resubmit them with ``scheduler.submit(plan)``.
        events: every event the run collected before the failure (they may still be running).
    The original exception, if any, is ``__cause__``.
    """

    def __init__(
        self,
        message: str,
        *,
        plan: ExecutionPlan,
        plan_index: int,
        op: Op,
        op_index: int,
        event: EventLike | None,
        unrun_plans: list[ExecutionPlan],
        events: list[EventLike],
    ) -> None:
        super().__init__(message)
        self.plan = plan
        self.plan_index = plan_index
        self.op = op
        self.op_index = op_index
        self.event = event
        self.unrun_plans = unrun_plans
        self.events = events
