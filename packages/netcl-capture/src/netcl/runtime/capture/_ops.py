"""The commands of a replay: a launch, a transfer (copy, fill, marker, barrier) or a finish.

A launch is replayed from its record (``RawLaunch``) and the ``BoundLaunch`` of its shape (one
per shape, looked up by ``id(shape)``: ``Binds``); a finish from its record (``RawFinish``); a
transfer from a ``TransferOp``, which knows where the memory objects sit among its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyopencl as cl

from netcl.runtime.capture._contract import EntryPoint, mem_ptr
from netcl.runtime.capture._kernels import BoundLaunch
from netcl.runtime.capture._recording import RawFinish, RawLaunch, RawTransfer
from netcl.runtime.capture._records import CapturedTransfer, transfer_record

__all__ = ["Binds", "Op", "TransferOp", "substituted"]

# (position or keyword, buffer) of a memory object among a command's arguments
Where = tuple[int | str, cl.MemoryObjectHolder]
# id(LaunchShape) -> what its launches replay with
Binds = Mapping[int, BoundLaunch]


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


Op = RawLaunch | TransferOp | RawFinish


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
