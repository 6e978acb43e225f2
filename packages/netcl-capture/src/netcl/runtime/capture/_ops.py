"""The commands of a replay: a launch, a transfer (copy, fill, marker, barrier) or a finish."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import pyopencl as cl

from netcl.runtime.capture._contract import EntryPoint, mem_ptr
from netcl.runtime.capture._kernels import BoundLaunch
from netcl.runtime.capture._recording import RawLaunch, RawTransfer
from netcl.runtime.capture._records import (
    CapturedLaunch,
    CapturedTransfer,
    launch_record,
    transfer_record,
)

__all__ = ["FinishOp", "LaunchOp", "Op", "TransferOp", "substituted"]

# (position or keyword, buffer) of a memory object among a command's arguments
Where = tuple[int | str, cl.MemoryObjectHolder]


class LaunchOp(NamedTuple):
    """A recorded launch and the replay kernel bound for it (one per launch: a tuple)."""

    raw: RawLaunch
    bound: BoundLaunch

    @property
    def queue(self) -> cl.CommandQueue:
        return self.raw.queue

    @property
    def buffers(self) -> tuple[tuple[int, cl.MemoryObjectHolder], ...]:
        return self.bound.buffers

    @property
    def record(self) -> CapturedLaunch:
        return launch_record(self.raw)

    def call(self) -> tuple[Any, ...]:
        """(queue, kernel, global size, local size, offset) for enqueue_nd_range_kernel."""
        return (self.raw.queue, self.bound.kernel, *self.bound.sizes)


class TransferOp:
    """A recorded copy, fill, marker or barrier: pyopencl's primitive and its arguments."""

    __slots__ = ("buffers", "raw")

    def __init__(self, raw: RawTransfer) -> None:
        self.raw = raw
        found: list[Where] = [
            (i, a) for i, a in enumerate(raw.args) if isinstance(a, cl.MemoryObjectHolder)
        ]
        found += [(k, v) for k, v in raw.kwargs.items() if isinstance(v, cl.MemoryObjectHolder)]
        self.buffers: tuple[Where, ...] = tuple(found)

    @property
    def entry(self) -> EntryPoint:
        return self.raw.entry

    @property
    def fn(self) -> Callable[..., Any]:
        return self.raw.fn

    @property
    def queue(self) -> cl.CommandQueue:
        raw = self.raw
        return raw.args[0] if raw.args else raw.kwargs["queue"]

    @property
    def record(self) -> CapturedTransfer:
        return transfer_record(self.raw)

    def bound(self) -> dict[str, Any]:
        """The arguments by pyopencl's parameter names."""
        found = dict(zip(self.entry.params, self.raw.args, strict=False))
        found.update(self.raw.kwargs)
        return found


class FinishOp(NamedTuple):
    """A recorded ``queue.finish()`` (replayed only when the capture spans queues or is out of
    order: on one in-order queue it orders nothing the queue does not)."""

    queue: cl.CommandQueue

    @property
    def buffers(self) -> tuple[Where, ...]:
        return ()


Op = LaunchOp | TransferOp | FinishOp


def substituted(
    op: TransferOp, subst: Mapping[int, cl.MemoryObjectHolder]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A transfer's arguments with the substitutes of this replay (keys: recorded int_ptr)."""
    raw = op.raw
    if not subst:
        return raw.args, raw.kwargs
    args, kwargs = list(raw.args), dict(raw.kwargs)
    for where, buf in op.buffers:
        new = subst.get(mem_ptr(buf))
        if new is None:
            continue
        if isinstance(where, int):
            args[where] = new
        else:
            kwargs[where] = new
    return tuple(args), kwargs
