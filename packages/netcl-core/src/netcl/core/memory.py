"""BufferPool: device memory for Tensors, reused by size class."""

from __future__ import annotations

import contextlib
import gc
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl

from netcl.core._pool_blocks import Bin, Blocks, is_oom
from netcl.core._pool_limit import LIMIT_ENV as LIMIT_ENV
from netcl.core._pool_limit import resolve_limit
from netcl.core._pool_telemetry import POOLS
from netcl.core.tensor import _RELEASED, Shape, Tensor, normalize_shape

__all__ = ["BufferPool", "PoolStats"]


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters. Bytes are block bytes (sizes as the pool rounds them).

    ``misses`` counts the allocations that needed a new device block, ``hits`` those served
    from a block the pool held; an allocation that failed counts as neither.
    """

    bytes_in_use: int
    peak_bytes: int
    bytes_held: int
    live_tensors: int
    hits: int
    misses: int


_ids = itertools.count(1)  # default pool names
_new_tensor = object.__new__


class BufferPool:
    """Hands out Tensors whose buffers come back to the pool on :meth:`release`.

    A released block is handed out again for a request of the same size class (requests are
    rounded up by at most 1/64, never past the device's maximum allocation). New blocks come from
    ``pyopencl.tools.MemoryPool`` and are backed by device memory before they are handed out, so
    running out of memory shows here. Safe to use from several threads (see the package README
    for what that rests on). A Tensor that is garbage-collected without being released returns
    its block too.

    ``limit`` caps the device bytes the pool holds (in use + held for reuse), as CuPy's
    ``set_limit``; ``None`` reads ``NETCL_POOL_LIMIT`` (bytes, or ``N%`` of the device's global
    memory), ``0`` means no limit. ``name`` labels the pool's metrics (``netcl.pool.id``).
    """

    __slots__ = (
        "__weakref__", "_bins", "_blocks", "_device_bytes", "_device_name", "_global_mem",
        "_hits", "_limit", "_lock", "_max_alloc", "_misses", "_on_free_held", "_peak", "_room",
        "_sizes", "_sizes_kept", "_token", "name", "queue",
    )  # fmt: skip

    def __init__(
        self, queue: cl.CommandQueue, *, limit: int | None = None, name: str | None = None
    ) -> None:
        self.queue = queue
        self.name = name if name is not None else f"pool-{next(_ids)}"
        device = queue.device
        self._device_name = str(device.name).strip()
        self._global_mem = int(device.global_mem_size)
        self._max_alloc = int(device.max_mem_alloc_size)
        self._limit = resolve_limit(limit, self._global_mem)
        # Threads (see the README): a hit is a list pop and a release a list append, both
        # atomic under the GIL, plus plain int counters; the lock serialises the rest (new
        # blocks, the limit, free_held, the exact figures behind stats and the peak).
        self._lock = threading.RLock()
        self._blocks = Blocks(queue, self._lock)
        self._token = object()  # what this pool's bins and their tensors know it by
        self._bins: dict[int, Bin] = {}  # by block size
        self._sizes: dict[Any, dict[Any, tuple[Shape, np.dtype[Any], Bin]]] = {}
        self._sizes_kept = 0
        self._hits = 0
        self._misses = 0  # changed under the lock only
        self._peak = 0  # under the lock only
        # bytes of the blocks out or in the bins, as of the last look (under the lock): a
        # dropped tensor can only make it too high, never too low
        self._device_bytes = 0
        # peak - (_device_bytes - bytes in the bins): the fast path's whole peak check. A hit
        # takes its block's bytes, a release gives them back; below 0 the bytes in use may have
        # passed the peak, and _new_peak looks at the exact figure. Only ever changed by += and
        # -=, so a change made under the lock composes with those of the fast path.
        self._room = 0
        self._on_free_held: list[Callable[[], None]] = []
        POOLS.add(self)

    @property
    def limit(self) -> int:
        """The most device bytes the pool may hold (0: no limit)."""
        return self._limit

    # _nbytes is private (netcl-graph: a larger block); not keyword-only because a call that
    # fills a keyword-only default takes CPython's slower call path
    def allocate(
        self, shape: int | Sequence[int], dtype: npt.DTypeLike, _nbytes: int = 0
    ) -> Tensor:
        """A Tensor of ``shape`` and ``dtype`` backed by a pool block (contents undefined).

        Raises MemoryError when the device (or the pool's limit) cannot provide the block, after
        freeing the blocks held for reuse and retrying.
        """
        try:
            # by dtype, then shape: two lookups cost less than building and hashing a pair
            shape, dt, bin_ = self._sizes[dtype][shape]
        except (KeyError, TypeError):  # first time for this shape and dtype, or unhashable
            shape, dt, bin_ = self._size_of(shape, dtype)
        if _nbytes and _nbytes > bin_.nbytes:
            bin_ = self._bin_for(_nbytes)
        try:
            block = bin_.free.pop()
        except IndexError:
            block = self._miss(bin_, shape, dt)
        else:
            self._hits += 1
            self._room -= bin_.nbytes
            if self._room < 0:
                self._new_peak()
        t = _new_tensor(Tensor)
        t._buffer = block
        t._bin = bin_
        t.shape = shape
        t.dtype = dt
        t.queue = self.queue
        return t

    def release(self, tensor: Tensor) -> None:
        """Give a tensor's block back to the pool; any later use of the tensor raises."""
        try:
            bin_ = tensor._bin
        except AttributeError:
            bin_ = None
        if bin_ is None or bin_.owner is not self._token:
            self._bad_release(tensor)
        bin_.free.append(tensor._buffer)
        tensor._buffer = _RELEASED
        tensor._bin = None
        self._room += bin_.nbytes

    def _bad_release(self, tensor: Tensor) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"BufferPool.release: expected a Tensor, got {tensor!r}")
        if tensor._buffer is _RELEASED:
            raise ValueError(f"BufferPool.release: {tensor!r} was already released")
        raise ValueError(f"BufferPool.release: {tensor!r} was not allocated by this pool")

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
        return getattr(getattr(tensor, "_bin", None), "owner", None) is self._token

    # -- size classes -----------------------------------------------------------------------
    def block_bytes(self, nbytes: int) -> int:
        """The bytes a request of ``nbytes`` really takes (the pool's size class): at most 1/64
        more, and never more than the device's maximum allocation."""
        if nbytes > self._max_alloc:
            return nbytes  # refused at allocation with a MemoryError
        return min(self._blocks.class_bytes(nbytes), self._max_alloc)

    def _size_of(
        self, shape: int | Sequence[int], dtype: npt.DTypeLike
    ) -> tuple[Shape, np.dtype[Any], Bin]:
        dims = normalize_shape(shape)
        dt = np.dtype(dtype)
        entry = (dims, dt, self._bin_for(prod(dims) * dt.itemsize))
        if isinstance(shape, (tuple, int)) and self._sizes_kept < 4096:
            # an unhashable dtype spelling (a list of fields) is not cached
            with contextlib.suppress(TypeError):
                self._sizes.setdefault(dtype, {})[shape] = entry
                self._sizes_kept += 1
        return entry

    def _bin_for(self, nbytes: int) -> Bin:
        size = self.block_bytes(nbytes)
        if size > self._max_alloc:
            return Bin(self._token, size, direct=True)  # not kept: allocating from it fails
        bin_ = self._bins.get(size)
        if bin_ is not None:
            return bin_
        with self._lock:  # one bin per size, whichever thread makes it
            bin_ = self._bins.get(size)
            if bin_ is None:
                # pyopencl's class of the device's maximum can be larger than the maximum
                direct = self._blocks.class_bytes(size) != size
                bin_ = self._bins[size] = Bin(self._token, size, direct)
            return bin_

    # -- the slow path: the size class holds no block ---------------------------------------
    def _miss(self, bin_: Bin, shape: Shape, dt: np.dtype[Any]) -> Any:
        with self._lock:
            try:
                block = bin_.free.pop()  # released by another thread meanwhile
            except IndexError:
                block = self._take(bin_, shape, dt)
            else:
                self._hits += 1
                self._room -= bin_.nbytes
            self._new_peak()
        return block

    def _new_peak(self) -> None:
        """Look at the exact bytes in use (the fast path's estimate passed the peak, or new
        blocks were made)."""
        with self._lock:
            self._look(max(self._peak, self._figures()[0]))

    def _look(self, peak: int) -> None:
        # _room = peak - (_device_bytes - bytes in the bins), kept by increments (see __init__)
        device = self._blocks.active()[0]
        self._room += (peak - self._peak) - (device - self._device_bytes)
        self._peak, self._device_bytes = peak, device

    def _take(self, bin_: Bin, shape: Shape, dt: np.dtype[Any]) -> Any:
        """A block from the device (or one a dropped tensor gave back), within the device's
        maximum allocation and the pool's limit; a new one counts as a miss."""
        if bin_.nbytes > self._max_alloc:
            raise self._oom(
                bin_, shape, dt, f"the device allocates at most {self._max_alloc} bytes at once"
            )
        block, new = self._make(bin_, shape, dt)
        if self._limit and self._blocks.total() > self._limit:
            self._blocks.drop(block, bin_)
            del block
            self._free_held()
            block, new = self._make(bin_, shape, dt)
            if self._blocks.total() > self._limit:
                self._blocks.drop(block, bin_)
                del block  # a direct block is freed now, not kept by the traceback
                self._free_held()
                raise self._oom(bin_, shape, dt, f"the pool limit is {self._limit} bytes")
        if new:
            self._misses += 1
        else:
            self._hits += 1
        return block

    def _make(self, bin_: Bin, shape: Shape, dt: np.dtype[Any]) -> tuple[Any, bool]:
        """A block for ``bin_``. When the device cannot allocate or back it: free what the pool
        holds, collect garbage (dropped tensors give their blocks back), and try once more."""
        try:
            return self._blocks.make(bin_)
        except cl.Error as exc:
            if not is_oom(exc):
                raise
        gc.collect()
        self._free_held()
        try:
            return self._blocks.make(bin_)
        except cl.Error as again:
            if not is_oom(again):
                raise
            self._free_held()  # the block that could not be backed is not kept
            raise self._oom(bin_, shape, dt, f"out of device memory ({again})") from again

    def _oom(self, bin_: Bin, shape: Shape, dt: np.dtype[Any], why: str) -> MemoryError:
        in_use, held, _ = self._figures()
        limit = f", limit {self._limit}" if self._limit else ""
        asked = prod(shape) * dt.itemsize
        block = f" (a block of {bin_.nbytes})" if bin_.nbytes != asked else ""
        return MemoryError(
            f"BufferPool {self.name!r}: cannot allocate {asked} bytes{block} for shape {shape} "
            f"{dt}: {why}; pool: {in_use} bytes in use, {held} held{limit}; device "
            f"{self._device_name}: {self._global_mem} bytes of global memory, at most "
            f"{self._max_alloc} per allocation"
        )

    # -- figures ----------------------------------------------------------------------------
    def _figures(self) -> tuple[int, int, int]:
        """Exact bytes in use, bytes held and live tensors (with the lock held). pyopencl's
        counters are read before the bins: a concurrent hit or release moves a block that is
        already counted as active, so no figure can go below zero."""
        active, blocks = self._blocks.active()
        held = self._blocks.held_by_pyopencl()
        in_bins = in_bins_blocks = 0
        for bin_ in list(self._bins.values()):
            n = len(bin_.free)
            in_bins_blocks += n
            in_bins += n * bin_.nbytes
        return active - in_bins, held + in_bins, blocks - in_bins_blocks

    @property
    def stats(self) -> PoolStats:
        with self._lock:
            in_use, held, live = self._figures()
            return PoolStats(
                bytes_in_use=in_use,
                peak_bytes=max(self._peak, in_use),
                bytes_held=held,
                live_tensors=live,
                hits=self._hits,
                misses=self._misses,
            )

    def reset_peak(self) -> None:
        """Start peak tracking afresh from the bytes in use now."""
        with self._lock:
            self._look(self._figures()[0])

    def free_held(self) -> None:
        """Free the blocks the pool holds for reuse (live tensors are untouched)."""
        with self._lock:
            self._free_held()

    def _free_held(self) -> None:
        # users that keep views of pool blocks (graph executors) drop them first, or the views
        # would keep the freed blocks' memory allocated
        for forget in list(self._on_free_held):
            forget()
        for bin_ in list(self._bins.values()):
            while True:
                try:
                    block = bin_.free.pop()
                except IndexError:
                    break
                self._room -= bin_.nbytes
                self._blocks.drop(block, bin_)
                del block  # a direct block is freed here
        self._blocks.free_held()
        self._look(self._peak)

    def _add_free_held_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (a weak method is kept) before held blocks are freed."""
        ref = weakref.WeakMethod(hook)  # type: ignore[arg-type]

        def call() -> None:
            fn = ref()
            if fn is None:
                self._on_free_held.remove(call)
            else:
                fn()

        self._on_free_held.append(call)

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"BufferPool({self.name!r}, in_use={s.bytes_in_use}, peak={s.peak_bytes}, "
            f"held={s.bytes_held})"
        )
