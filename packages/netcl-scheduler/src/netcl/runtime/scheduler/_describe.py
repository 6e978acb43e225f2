"""Short, readable names of ops, plans and values for error messages."""

from __future__ import annotations

import functools
import os

import pyopencl as cl

from netcl.runtime.scheduler._plan import ExecutionPlan

__all__ = ["describe_op", "describe_plan", "describe_value"]

_MAX = 100


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
    code = getattr(op, "__code__", None)
    if isinstance(name, str) and code is not None:
        return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
    if isinstance(name, str):
        return name
    return _clip(repr(op))


def describe_plan(plan: ExecutionPlan, index: int | None) -> str:
    """``plan 2 'compute'``; ``index`` None names a plan of an earlier run."""
    where = "of an earlier run" if index is None else str(index)
    if isinstance(plan.description, str) and plan.description:
        if index is None:
            return f"plan {plan.description!r} {where}"
        return f"plan {where} {plan.description!r}"
    return f"plan {where} (no description)"


def describe_value(value: object) -> str:
    return f"{_clip(repr(value))} ({type(value).__name__})"
