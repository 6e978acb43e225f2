"""The error Scheduler.run raises (exposed as ``Scheduler.Error``) and its message."""

from __future__ import annotations

from typing import TYPE_CHECKING

from netcl.runtime.scheduler._describe import describe_op, describe_plan

if TYPE_CHECKING:
    from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op

__all__ = ["SchedulerError", "failed_run"]


class SchedulerError(RuntimeError):
    """A run stopped: an op raised or returned something that is not an event, or an event failed.

    Attributes:
        plan: the plan that failed; plan_index: its position in the run (0-based), -1 when the
            plan ran in an earlier run (a plan of this run comes ``after`` it and found its
            event failed).
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


def failed_run(
    *,
    plan: ExecutionPlan,
    plan_index: int | None,
    op: Op,
    op_index: int,
    event: EventLike | None,
    what: str,
    unrun: list[tuple[ExecutionPlan, int]],
    events: list[EventLike],
) -> SchedulerError:
    """The error of a run that stopped at op ``op_index`` of ``plan`` (at ``plan_index`` in the
    run, None for a plan of an earlier run): ``what`` happened; ``unrun``: the plans not run,
    with their positions."""
    if unrun:
        names = ", ".join(describe_plan(p, k) for p, k in unrun[:5])
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
        plan_index=-1 if plan_index is None else plan_index,
        op=op,
        op_index=op_index,
        event=event,
        unrun_plans=[p for p, _ in unrun],
        events=events,
    )
