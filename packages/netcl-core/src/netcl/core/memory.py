"""BufferPool: device memory for Tensors, reused through pyopencl's MemoryPool."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pyopencl.tools as cltools
from opentelemetry.metrics import CallbackOptions, Observation

from netcl.core import telemetry
from netcl.core.tensor import Tensor, normalize_shape

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


class BufferPool:
    """Hands out Tensors whose buffers come back to the pool on :meth:`release`.

    Built on ``pyopencl.tools.MemoryPool``: a released block is handed out again for a request of
    the same size class. Safe to use from several threads. A Tensor that is garbage-collected
    without being released returns its block too (counted as in use until then).
    """

    def __init__(self, queue: cl.CommandQueue) -> None:
        self.queue = queue
        # 6 leading bits per size class: a block is at most 1/64 larger than asked for (pyopencl's
        # default of 4 wastes up to 1/16, which would show in graph memory plans).
        self._pool = cltools.MemoryPool(
            cltools.ImmediateAllocator(queue), leading_bits_in_bin_id=6
        )
        # RLock: the reclaim callback of a dropped tensor may run (GC) while this thread holds it
        self._lock = threading.RLock()
        # id(tensor) -> (block, block bytes, weakref whose callback reclaims a dropped tensor)
        self._live: dict[int, tuple[cltools.PooledBuffer, int, weakref.ref[Tensor]]] = {}
        self._released: weakref.WeakSet[Tensor] = weakref.WeakSet()
        self._in_use = 0
        self._peak = 0
        self._hits = 0
        self._misses = 0
        _POOLS.add(self)

    def allocate(self, shape: int | Sequence[int], dtype: npt.DTypeLike) -> Tensor:
        """A Tensor of ``shape`` and ``dtype`` backed by a pool block (contents undefined)."""
        shape = normalize_shape(shape)
        dt = np.dtype(dtype)
        nbytes = max(prod(shape) * dt.itemsize, 1)  # OpenCL refuses 0-byte buffers
        pool = self._pool
        with self._lock:
            held = pool.held_blocks
            try:
                block = pool.allocate(nbytes)
            except cl.MemoryError as exc:
                raise MemoryError(
                    f"BufferPool: out of device memory allocating {nbytes} bytes for "
                    f"shape {shape} {dt} ({self._in_use} bytes in use, "
                    f"{pool.managed_bytes - self._in_use} held); call free_held() or release "
                    "tensors"
                ) from exc
            tensor = Tensor(block, shape, dt, self.queue)
            size = int(block.size)
            key = id(tensor)
            self._live[key] = (block, size, weakref.ref(tensor, self._make_reclaim(key)))
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
            entry = self._live.pop(id(tensor), None)
            if entry is None or entry[2]() is not tensor:
                if entry is not None:  # a different, dead tensor had this id: put it back
                    self._live[id(tensor)] = entry
                if tensor in self._released:
                    raise ValueError(f"BufferPool.release: {tensor!r} was already released")
                raise ValueError(f"BufferPool.release: {tensor!r} was not allocated by this pool")
            block, size, _ = entry
            self._in_use -= size
            self._released.add(tensor)
        block.release()

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
        return entry is not None and entry[2]() is tensor

    def _make_reclaim(self, key: int):  # type: ignore[no-untyped-def]
        pool_ref = weakref.ref(self)

        def reclaim(_: object) -> None:
            pool = pool_ref()
            if pool is None:
                return
            with pool._lock:
                entry = pool._live.pop(key, None)
                if entry is not None:
                    pool._in_use -= entry[1]
            # the block itself returns to the MemoryPool when its last reference goes

        return reclaim

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


# Pool gauges are observed when a metric reader collects, so allocation pays nothing for them.
_POOLS: weakref.WeakSet[BufferPool] = weakref.WeakSet()


def _observe(field: str):  # type: ignore[no-untyped-def]
    def callback(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(getattr(p.stats, field) for p in list(_POOLS)))]

    return callback


_meter = telemetry.meter("netcl.core.memory", "netcl-core")
_meter.create_observable_gauge(
    "netcl.pool.bytes_in_use", [_observe("bytes_in_use")], unit="By",
    description="Device bytes held by live tensors of all BufferPools",
)
_meter.create_observable_gauge(
    "netcl.pool.peak_bytes", [_observe("peak_bytes")], unit="By",
    description="Sum of peak bytes in use of all BufferPools",
)
