"""ExecutionPlan: an ordered list of ops with a label."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, runtime_checkable

__all__ = ["EventLike", "ExecutionPlan", "Op"]


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
    """

    ops: list[Op] = field(default_factory=list)
    description: str = ""

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
