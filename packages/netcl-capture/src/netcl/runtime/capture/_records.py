"""Read-only records of what a capture saw."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

__all__ = ["CapturedLaunch", "CapturedTransfer"]


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
