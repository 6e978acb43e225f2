"""ExecutionPlan: an ordered list of ops with a label, a queue and the plans it follows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, runtime_checkable

import pyopencl as cl

__all__ = ["EventLike", "ExecutionPlan", "Op", "after_of", "plan_of"]

_NO_PLANS: tuple[ExecutionPlan, ...] = ()  # the default of ``after``: normalised already


@runtime_checkable
class EventLike(Protocol):
    """Anything with a ``wait()`` method: a ``pyopencl.Event`` in practice."""

    def wait(self) -> object: ...


# A callable (run by the scheduler; a non-None return value is an event) or an event-like object.
Op: TypeAlias = Callable[[], object] | EventLike


@dataclass
class ExecutionPlan:
    """An ordered list of ops (callables or event-like objects) plus an optional label.

    A plain dataclass: ``Scheduler.submit`` appends to :attr:`ops`, and ``Scheduler.run`` runs
    every op the plan holds, in order, without modifying the plan. Instances never share their
    op list (the default is a new list per instance).

    ``queue`` (optional) is the command queue the plan's ops enqueue on; ``after`` (optional) is
    the plan, or the plans, it must follow (None: none). In async mode the scheduler orders such
    a plan on the device with a barrier on ``queue`` waiting for the earlier plans' events (a
    host wait when the plan has no ``queue``). ``ExecutionPlan(queue=q, after=prev)`` chains a
    plan after the previous one (``prev`` None for the first). ``after`` is normalised to a
    tuple and is left out of ``==`` and ``repr``.
    """

    ops: list[Op] = field(default_factory=list)
    description: str = ""
    queue: cl.CommandQueue | None = None
    after: ExecutionPlan | Sequence[ExecutionPlan] | None = field(
        default=_NO_PLANS, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.description, str):
            raise TypeError(
                f"ExecutionPlan: description must be a str, got {self.description!r} "
                f"({type(self.description).__name__})"
            )
        if not isinstance(self.ops, list):
            if isinstance(self.ops, (str, bytes)) or not hasattr(self.ops, "__iter__"):
                raise TypeError(
                    f"ExecutionPlan {self.description!r}: ops must be a list of callables or "
                    f"events, got {self.ops!r} ({type(self.ops).__name__})"
                )
            # a tuple or another iterable: keep a list of our own, so submit can append
            self.ops = list(self.ops)
        if self.queue is not None and not isinstance(self.queue, cl.CommandQueue):
            raise TypeError(
                f"ExecutionPlan {self.description!r}: queue must be a pyopencl.CommandQueue or "
                f"None, got {self.queue!r} ({type(self.queue).__name__})"
            )
        if self.after is not _NO_PLANS:
            self.after = after_of(self)


def plan_of(op: Op) -> ExecutionPlan:
    """``ExecutionPlan([op])`` without running the field checks, which the defaults pass: the
    plan ``Scheduler.submit(op)`` makes for every op (a third of its cost otherwise)."""
    plan = _new_plan(ExecutionPlan)
    plan.ops = [op]
    plan.description = ""
    plan.queue = None
    plan.after = _NO_PLANS
    return plan


_new_plan = object.__new__


def after_of(plan: ExecutionPlan) -> tuple[ExecutionPlan, ...]:
    """``plan.after`` as a tuple of plans (it may have been reassigned since construction)."""
    after = plan.after
    if type(after) is tuple and all(isinstance(p, ExecutionPlan) for p in after):
        return after
    if isinstance(after, ExecutionPlan):
        return (after,)
    if after is None:  # the first plan of a chain: ``ExecutionPlan(after=prev)`` with prev None
        return ()
    if not isinstance(after, (str, bytes)) and hasattr(after, "__iter__"):
        items = tuple(after)
        if all(isinstance(p, ExecutionPlan) for p in items):
            return items
        bad = next(p for p in items if not isinstance(p, ExecutionPlan))
        raise TypeError(
            f"ExecutionPlan {plan.description!r}: after must hold ExecutionPlans, got {bad!r} "
            f"({type(bad).__name__}) in it"
        )
    raise TypeError(
        f"ExecutionPlan {plan.description!r}: after must be an ExecutionPlan or a sequence of "
        f"them, got {after!r} ({type(after).__name__})"
    )
