"""The error Scheduler.run raises (exposed as ``Scheduler.Error``), and the short, readable names
of ops, plans and values that error messages use."""

from __future__ import annotations

import functools
import os
from dataclasses import KW_ONLY, dataclass

import pyopencl as cl

from netcl.runtime.scheduler._plan import EventLike, ExecutionPlan, Op

__all__ = ["SchedulerError", "describe_op", "describe_plan", "describe_value"]


@dataclass(eq=False, repr=False)
class SchedulerError(RuntimeError):
    """A run stopped: an op raised (the exception is ``__cause__``) or returned something that is
    not an event, or an event failed. ``plan_index`` is -1 for a plan of an earlier run (a plan
    of this run comes ``after`` it); ``event`` is None when the op itself failed;
    ``unrun_plans`` are the plans to resubmit; ``events`` every event the run collected (they
    may still be running). The package's guide describes each attribute."""

    message: str
    _: KW_ONLY
    plan: ExecutionPlan
    plan_index: int
    op: Op
    op_index: int
    event: EventLike | None
    unrun_plans: list[ExecutionPlan]
    events: list[EventLike]

    def __post_init__(self) -> None:
        super().__init__(self.message)


_MAX = 100  # characters of a repr in a message


def _clip(text: str) -> str:
    return text if len(text) <= _MAX else text[: _MAX - 3] + "..."


def describe_op(op: object) -> str:
    """``name (file.py:line)`` for functions and lambdas, the command type for OpenCL events."""
    if isinstance(op, cl.Event):
        try:
            kind = cl.command_type.to_string(op.command_type)
        except Exception:  # an event whose info query fails still needs a name
            kind = "?"
        return f"pyopencl.{type(op).__name__}({kind})"
    if isinstance(op, functools.partial):
        return f"functools.partial({describe_op(op.func)})"
    name = getattr(op, "__qualname__", None)
    if not isinstance(name, str):
        return _clip(repr(op))
    if (code := getattr(op, "__code__", None)) is None:
        return name
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def describe_plan(plan: ExecutionPlan, index: int | None) -> str:
    """``plan 2 'compute'``; ``index`` None names a plan of an earlier run."""
    where = "of an earlier run" if index is None else str(index)
    name = plan.description
    if not isinstance(name, str) or not name:  # empty, or the field was reassigned
        return f"plan {where} (no description)"
    return f"plan {name!r} {where}" if index is None else f"plan {where} {name!r}"


def describe_value(value: object) -> str:
    """A value and its type, for a ``TypeError`` or an op's bad return value."""
    return f"{_clip(repr(value))} ({type(value).__name__})"
