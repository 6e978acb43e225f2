"""BufferPool: device memory for Tensors, reused through pyopencl's MemoryPool."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pyopencl.tools as cltools
from opentelemetry.metrics import CallbackOptions, Observation

from netcl.core import telemetry
from netcl.core.tensor import Tensor, normalize_shape
from netcl.core.version import __version__

__all__ = ["BufferPool", "PoolStats"]


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters. Bytes are block bytes (sizes as the pool rounds them)."""

    bytes_in_use: int
    peak_bytes: int
    bytes_held: int
    live_tensors: int
    hits: int
    misses: int


class _Released:
    """Stands in for the buffer of a released tensor: a later use fails instead of silently
    touching a block that may already belong to another tensor."""

    size = 0
    int_ptr = 0

    def __repr__(self) -> str:
        return "<released pool buffer>"


_RELEASED: Any = _Released()


class _Entry(weakref.ref):  # type: ignore[type-arg]
    # A weak reference to a live tensor that carries its block; its callback reclaims the block
    # when the tensor is garbage-collected without release().
    __slots__ = ("block", "key", "nbytes")
    block: cltools.PooledBuffer
    key: int
    nbytes: int


class BufferPool:
    """Hands out Tensors whose buffers come back to the pool on :meth:`release`.

    Built on ``pyopencl.tools.MemoryPool``: a released block is handed out again for a request of
    the same size class. Safe to use from several threads. A Tensor that is garbage-collected
    without being released returns its block too.
    """

    def __init__(self, queue: cl.CommandQueue) -> None:
        self.queue = queue
        # 6 leading bits per size class: a block is at most 1/64 larger than asked for (pyopencl's
        # default of 4 wastes up to 1/16, which would show in graph memory plans).
        self._pool = cltools.MemoryPool(
            cltools.ImmediateAllocator(queue), leading_bits_in_bin_id=6
        )
        # RLock: the reclaim callback of a dropped tensor may run (GC) while this thread holds it.
        self._lock = threading.RLock()
        self._live: dict[int, _Entry] = {}  # id(tensor) -> entry
        self._in_use = 0
        self._peak = 0
        self._hits = 0
        self._misses = 0
        self._reclaim_cb = _make_reclaim(weakref.ref(self))
        _POOLS.add(self)

    def allocate(self, shape: int | Sequence[int], dtype: npt.DTypeLike) -> Tensor:
        """A Tensor of ``shape`` and ``dtype`` backed by a pool block (contents undefined)."""
        shape = normalize_shape(shape)
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        nbytes = max(prod(shape) * dt.itemsize, 1)  # OpenCL refuses 0-byte buffers
        pool = self._pool
        with self._lock:
            held = pool.held_blocks
            try:
                block = pool.allocate(nbytes)
            except cl.MemoryError as exc:
                raise MemoryError(
                    f"BufferPool: out of device memory allocating {nbytes} bytes for shape "
                    f"{shape} {dt} ({self._in_use} bytes in use, {self.stats.bytes_held} held); "
                    "release tensors or call free_held()"
                ) from exc
            tensor = Tensor._wrap(block, shape, dt, self.queue)
            entry = _Entry(tensor, self._reclaim_cb)
            entry.block = block
            entry.nbytes = size = block.size
            entry.key = key = id(tensor)
            self._live[key] = entry
            if pool.held_blocks < held:
                self._hits += 1
            else:
                self._misses += 1
            self._in_use += size
            if self._in_use > self._peak:
                self._peak = self._in_use
        return tensor

    def release(self, tensor: Tensor) -> None:
        """Give a tensor's block back to the pool; the tensor must not be used afterwards."""
        with self._lock:
            entry = self._live.get(id(tensor))
            if entry is None or entry() is not tensor:
                if tensor.buffer is _RELEASED:
                    raise ValueError(f"BufferPool.release: {tensor!r} was already released")
                raise ValueError(f"BufferPool.release: {tensor!r} was not allocated by this pool")
            del self._live[id(tensor)]
            self._in_use -= entry.nbytes
            tensor.buffer = _RELEASED
        entry.block.release()

    def release_all(self, tensors: Iterable[Tensor]) -> None:
        """Release several tensors; every one is attempted, the first error is raised after."""
        first: ValueError | None = None
        for t in tensors:
            try:
                self.release(t)
            except ValueError as exc:
                first = first or exc
        if first is not None:
            raise first

    def owns(self, tensor: Tensor) -> bool:
        """Whether ``tensor`` is a live allocation of this pool."""
        entry = self._live.get(id(tensor))
        return entry is not None and entry() is tensor

    @property
    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                bytes_in_use=self._in_use,
                peak_bytes=self._peak,
                bytes_held=int(self._pool.managed_bytes) - self._in_use,
                live_tensors=len(self._live),
                hits=self._hits,
                misses=self._misses,
            )

    def reset_peak(self) -> None:
        """Start peak tracking afresh from the bytes in use now."""
        with self._lock:
            self._peak = self._in_use

    def free_held(self) -> None:
        """Free the blocks the pool holds for reuse (live tensors are untouched)."""
        with self._lock:
            self._pool.free_held()

    def block_bytes(self, nbytes: int) -> int:
        """The bytes a request of ``nbytes`` really takes (the pool's size class)."""
        return int(self._pool.alloc_size(self._pool.bin_number(max(nbytes, 1))))

    def __repr__(self) -> str:
        s = self.stats
        return f"BufferPool(in_use={s.bytes_in_use}, peak={s.peak_bytes}, held={s.bytes_held})"


def _make_reclaim(pool_ref: weakref.ref[BufferPool]) -> Any:
    def reclaim(entry: _Entry) -> None:
        pool = pool_ref()
        if pool is None:
            return
        with pool._lock:
            # the id may already name a new tensor: only drop the entry that died
            if pool._live.get(entry.key) is entry:
                del pool._live[entry.key]
                pool._in_use -= entry.nbytes
        # the block returns to the MemoryPool when the entry, its last holder, goes

    return reclaim


# Pool gauges are observed when a metric reader collects, so allocation pays nothing for them.
_POOLS: weakref.WeakSet[BufferPool] = weakref.WeakSet()


def _observe(field: str) -> Any:
    def callback(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(getattr(p.stats, field) for p in list(_POOLS)))]

    return callback


_meter = telemetry.meter("netcl.core.memory", __version__)
_meter.create_observable_gauge(
    "netcl.pool.bytes_in_use", [_observe("bytes_in_use")], unit="By",
    description="Device bytes held by live tensors of all BufferPools",
)
_meter.create_observable_gauge(
    "netcl.pool.peak_bytes", [_observe("peak_bytes")], unit="By",
    description="Sum of peak bytes in use of all BufferPools",
)
