"""The BufferPool's telemetry: its scope and instruments, nothing else.

The gauges are observed when a metric reader collects (each pool's ``stats``), so allocation
and release pay nothing for them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from opentelemetry.util.types import AttributeValue

from netcl.core import telemetry
from netcl.core.version import __version__

if TYPE_CHECKING:
    from netcl.core.memory import BufferPool, PoolStats

TEL = telemetry.Scope("netcl.core.memory", __version__)

#: Every live pool; the gauges report each under its name.
POOLS: weakref.WeakSet[BufferPool] = weakref.WeakSet()

POOL_ID = "netcl.pool.id"


def _observe(
    field: Callable[[PoolStats], int],
) -> Callable[[], Iterable[tuple[float, Mapping[str, AttributeValue]]]]:
    def observe() -> list[tuple[float, Mapping[str, AttributeValue]]]:
        return [(field(p.stats), {POOL_ID: p.name}) for p in list(POOLS)]

    return observe


TEL.observable_gauge(
    "netcl.pool.used", _observe(lambda s: s.bytes_in_use), "By",
    "Device bytes held by the live tensors of a BufferPool (block bytes)",
)  # fmt: skip
TEL.observable_gauge(
    "netcl.pool.peak", _observe(lambda s: s.peak_bytes), "By",
    "Most bytes in use at once in a BufferPool since it was made or reset_peak()",
)  # fmt: skip
TEL.observable_gauge(
    "netcl.pool.held", _observe(lambda s: s.bytes_held), "By",
    "Device bytes a BufferPool holds for reuse (free blocks)",
)  # fmt: skip
