"""ExecutionPlan: an ordered list of ops with a label, a queue and the plans it follows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

import pyopencl as cl

__all__ = ["EventLike", "ExecutionPlan", "Op", "after_of", "plan_of"]

_NO_PLANS: tuple[ExecutionPlan, ...] = ()  # the default of ``after``: normalised already


class EventLike(Protocol):
    """Anything with a ``wait()`` method: a ``pyopencl.Event`` in practice."""

    def wait(self) -> object: ...


# A callable (run by the scheduler; a non-None return value is an event) or an event-like object.
Op: TypeAlias = Callable[[], object] | EventLike


@dataclass
class ExecutionPlan:
    """An ordered list of ops (callables or event-like objects) plus an optional label.

    A plain dataclass that ``Scheduler.run`` never modifies. ``queue`` is the command queue the
    plan's ops enqueue on, ``after`` the plan, or plans, it comes after (None: none; kept as a
    tuple, left out of ``==`` and ``repr``): ``ExecutionPlan(queue=q, after=prev)`` chains it.
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
        after = self.after
        if type(after) is ExecutionPlan:  # the usual chain, after=prev: no call to after_of
            self.after = (after,)
        elif after is not _NO_PLANS:
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
    if type(after) is not tuple:  # a tuple (as normalised) has only its items to check
        if isinstance(after, ExecutionPlan):
            return (after,)
        if after is None:  # the first plan of a chain: ``ExecutionPlan(after=prev)``, prev None
            return ()
        if isinstance(after, (str, bytes)) or not hasattr(after, "__iter__"):
            raise TypeError(
                f"ExecutionPlan {plan.description!r}: after must be an ExecutionPlan or a "
                f"sequence of them, got {after!r} ({type(after).__name__})"
            )
        after = tuple(after)
    for p in after:
        if not isinstance(p, ExecutionPlan):
            raise TypeError(
                f"ExecutionPlan {plan.description!r}: after must hold ExecutionPlans, got {p!r} "
                f"({type(p).__name__}) in it"
            )
    return after
