"""Read-only records of what a capture saw (``KernelCapture.launches`` / ``.commands``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pyopencl as cl

from netcl.runtime.capture._recording import LaunchShape, RawLaunch, RawTransfer

__all__ = ["CapturedLaunch", "CapturedTransfer", "launch_record", "launch_sizes",
           "transfer_record"]  # fmt: skip


@dataclass(frozen=True)
class CapturedLaunch:
    """One recorded kernel launch.

    ``args`` are the positional kernel arguments exactly as passed to ``Kernel.__call__`` (empty
    for a launch through ``cl.enqueue_nd_range_kernel`` with preset arguments).
    """

    kernel_name: str
    queue: cl.CommandQueue
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    offset: tuple[int, ...] | None
    args: tuple[Any, ...]


@dataclass(frozen=True)
class CapturedTransfer:
    """One recorded copy or fill (``cl.enqueue_copy`` / ``cl.enqueue_fill_buffer`` and friends).

    ``operation`` names pyopencl's primitive (``write_buffer``, ``read_buffer``, ``copy_buffer``,
    ``fill_buffer``, ...); ``args`` and ``kwargs`` are what it was called with, minus ``wait_for``.
    """

    operation: str
    queue: cl.CommandQueue
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


Sizes = tuple[tuple[int, ...], tuple[int, ...] | None, tuple[int, ...] | None]


def _dims(size: Any) -> tuple[int, ...]:
    if isinstance(size, int):
        return (size,)
    if type(size) is tuple and all(type(s) is int for s in size):
        return size
    return tuple(int(s) for s in size)


def launch_sizes(shape: LaunchShape) -> Sizes:
    """(global size, local size, offset) of a launch as tuples, ``g_times_l`` folded in."""
    gsize = _dims(shape.global_size)
    lsize = None if shape.local_size is None else _dims(shape.local_size)
    if shape.g_times_l and lsize is not None:
        gsize = tuple(g * ls for g, ls in zip(gsize, lsize, strict=True))
    return gsize, lsize, None if shape.offset is None else _dims(shape.offset)


def launch_record(raw: RawLaunch) -> CapturedLaunch:
    """The read-only record of a recorded launch."""
    gsize, lsize, offset = launch_sizes(raw.shape)
    return CapturedLaunch(
        kernel_name=raw.shape.kernel.function_name,
        queue=raw.shape.queue,
        global_size=gsize,
        local_size=lsize,
        offset=offset,
        args=tuple(raw.call[3:]) if raw.call is not None else (),
    )


def transfer_record(raw: RawTransfer) -> CapturedTransfer:
    """The read-only record of a recorded transfer."""
    return CapturedTransfer(
        operation=raw.entry.operation,
        queue=raw.args[0] if raw.args else raw.kwargs.get("queue"),
        args=raw.args,
        kwargs=MappingProxyType(dict(raw.kwargs)),
    )
