"""BufferPool: device memory for Tensors, reused through pyopencl's MemoryPool."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pyopencl.tools as cltools
from opentelemetry.metrics import CallbackOptions, Observation

from netcl.core import telemetry
from netcl.core.tensor import _RELEASED, Shape, Tensor, normalize_shape
from netcl.core.version import __version__

__all__ = ["BufferPool", "PoolStats"]

#: Environment variable with the default pool limit: bytes (``1000000000``) or a percentage of
#: the device's global memory (``50%``). ``0`` or unset: no limit.
LIMIT_ENV = "NETCL_POOL_LIMIT"


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters. Bytes are block bytes (sizes as the pool rounds them).

    ``misses`` counts the blocks allocated on the device, ``hits`` the allocations served from
    a held block.
    """

    bytes_in_use: int
    peak_bytes: int
    bytes_held: int
    live_tensors: int
    hits: int
    misses: int


_ids = itertools.count(1)
_new_tensor = object.__new__
# pyopencl's read primitive, bound at import: netcl-capture intercepts the module attribute while
# it records, and the pool's backing read (on its own queue) is not part of the application's work
_read_buffer = cl._cl._enqueue_read_buffer

# pyopencl reports running out of device memory with these codes (MemoryError covers the first)
_OOM_CODES = frozenset(
    {
        cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
        cl.status_code.OUT_OF_RESOURCES,
        cl.status_code.OUT_OF_HOST_MEMORY,
    }
)


class BufferPool:
    """Hands out Tensors whose buffers come back to the pool on :meth:`release`.

    Built on ``pyopencl.tools.MemoryPool``: a released block is handed out again for a request of
    the same size class. A new block is backed by device memory before it is handed out, so
    running out of memory shows here (see below). Safe to use from several threads (see the
    package README for what that rests on). A Tensor that is garbage-collected without being
    released returns its block too.

    ``limit`` caps the device bytes the pool holds (in use + held for reuse), as CuPy's
    ``set_limit``; ``None`` reads ``NETCL_POOL_LIMIT`` (bytes, or ``N%`` of the device's global
    memory), ``0`` means no limit. ``name`` labels the pool's metrics (``netcl.pool.id``).
    """

    def __init__(
        self, queue: cl.CommandQueue, *, limit: int | None = None, name: str | None = None
    ) -> None:
        self.queue = queue
        self.name = name if name is not None else f"pool-{next(_ids)}"
        device = queue.device
        self._device_name = str(device.name).strip()
        self._global_mem = int(device.global_mem_size)
        self._max_alloc = int(device.max_mem_alloc_size)
        self._limit = _resolve_limit(limit, self._global_mem)
        # Not pyopencl's ImmediateAllocator: it enqueues clEnqueueMigrateMemObjects for every new
        # block on the caller's queue, and NVIDIA's driver crashes when that runs while another
        # thread is inside a blocking read or write on the same queue (pyopencl releases the GIL
        # there). The pool makes plain buffers (clCreateBuffer only: no command) and backs each
        # new one itself with a blocking 1-byte read on a queue of its own (_back), so running
        # out of memory shows at allocation (NVIDIA allocates lazily, at first use), nothing of
        # the pool's lands on the caller's queue, and no allocation waits for the caller's work.
        self._alloc_queue = cl.CommandQueue(queue.context, device)
        self._scratch = np.empty(1, np.uint8)
        with warnings.catch_warnings():
            # pyopencl warns that a deferred allocator reports no memory errors: _back does
            warnings.filterwarnings("ignore", "Memory pools expect non-deferred", UserWarning)
            # 6 leading bits per size class: a block is at most 1/64 larger than asked for
            # (pyopencl's default of 4 wastes up to 1/16, which would show in graph plans).
            self._pool = cltools.MemoryPool(
                cltools.DeferredAllocator(queue.context), leading_bits_in_bin_id=6
            )
        # The fast path takes no lock: under the GIL, pyopencl's allocate and release run
        # without releasing it (a deferred allocation enqueues nothing), and the counters are
        # itertools.count objects (atomic under the GIL). Backing a new block releases the GIL
        # during its read, which is safe: a read never changes the block, reads on one queue
        # may come from any thread, and the block is not handed out yet. The lock serialises
        # the slow paths (a new peak, out of memory, the limit, free_held).
        self._pool_allocate = self._pool.allocate
        self._lock = threading.RLock()
        self._allocs = itertools.count()
        self._peak = 0
        self._freed_blocks = 0  # blocks given back to the device by free_held
        self._unbacked = itertools.count()  # new blocks the device could not back (not misses)
        # requests up to this size skip the slow path (-1 with a limit: every request checks it)
        self._fast_max = -1 if self._limit else self._max_alloc
        self._sizes: dict[Any, tuple[Shape, np.dtype[Any], int]] = {}
        self._on_free_held: list[Callable[[], None]] = []
        _POOLS.add(self)

    @property
    def limit(self) -> int:
        """The most device bytes the pool may hold (0: no limit)."""
        return self._limit

    def allocate(
        self, shape: int | Sequence[int], dtype: npt.DTypeLike, *, _nbytes: int = 0
    ) -> Tensor:
        """A Tensor of ``shape`` and ``dtype`` backed by a pool block (contents undefined).

        Raises MemoryError when the device (or the pool's limit) cannot provide the block, after
        freeing the blocks held for reuse and retrying.
        """
        # _nbytes (private, netcl-graph): a larger block, already rounded to a size class
        try:
            shape, dt, nbytes = self._sizes[shape, dtype]
        except (KeyError, TypeError):  # first time for this shape and dtype, or unhashable
            shape, dt, nbytes = self._size_of(shape, dtype)
        if _nbytes > nbytes:
            nbytes = _nbytes
        pool = self._pool
        if nbytes <= self._fast_max:
            # _allocate_with_retry inlined: a method call here would cost ~10% of the cycle
            before = pool.managed_bytes
            try:
                block = self._pool_allocate(nbytes)
                if pool.managed_bytes != before:  # a new device block (or another thread's)
                    self._back(block)
            except cl.Error as exc:
                block = self._allocate_again(nbytes, shape, dt, exc)
        else:
            block = self._allocate_checked(nbytes, shape, dt)
        # statistics: a count of allocations (misses are derived in stats); a new peak takes
        # the slow path
        next(self._allocs)
        if pool.active_bytes > self._peak:
            self._new_peak()
        t = _new_tensor(Tensor)
        t._buffer = block
        t._pool = self
        t.shape = shape
        t.dtype = dt
        t.queue = self.queue
        return t

    def _size_of(
        self, shape: int | Sequence[int], dtype: npt.DTypeLike
    ) -> tuple[Shape, np.dtype[Any], int]:
        dims = normalize_shape(shape)
        dt = np.dtype(dtype)
        # asking for the whole size class makes pyopencl's active_bytes count block bytes
        entry = (dims, dt, self.block_bytes(prod(dims) * dt.itemsize))
        if isinstance(shape, tuple) and len(self._sizes) < 4096:
            # an unhashable dtype spelling (a list of fields) is not cached
            with contextlib.suppress(TypeError):
                self._sizes[shape, dtype] = entry
        return entry

    def _back(self, block: cltools.PooledBuffer) -> None:
        """Make the device back a new block now: a blocking 1-byte read on the pool's queue (it
        waits for nothing of the caller's). Reading changes nothing, so a block that was not new
        after all (another thread's miss moved the counter) is read harmlessly. On an error the
        block goes back to the pool and the error is raised."""
        try:
            _read_buffer(self._alloc_queue, block, self._scratch, 0, None, True)
        except BaseException:
            next(self._unbacked)
            block.release()
            raise

    def _new_peak(self) -> None:
        with self._lock:
            self._peak = max(self._peak, self._pool.active_bytes)

    def _allocate_checked(
        self, nbytes: int, shape: Shape, dt: np.dtype[Any]
    ) -> cltools.PooledBuffer:
        """The slow path: sizes beyond the device's maximum allocation, and the pool limit."""
        if nbytes > self._max_alloc:
            raise self._oom(
                nbytes, shape, dt, f"the device allocates at most {self._max_alloc} bytes at once"
            )
        with self._lock:
            block = self._allocate_with_retry(nbytes, shape, dt)
            if self._pool.managed_bytes > self._limit:
                block.release()
                self._free_held()
                block = self._allocate_with_retry(nbytes, shape, dt)
                if self._pool.managed_bytes > self._limit:
                    block.release()
                    self._free_held()
                    raise self._oom(nbytes, shape, dt, f"the pool limit is {self._limit} bytes")
        return block

    def _allocate_with_retry(
        self, nbytes: int, shape: Shape, dt: np.dtype[Any]
    ) -> cltools.PooledBuffer:
        pool = self._pool
        before = pool.managed_bytes
        try:
            block = pool.allocate(nbytes)
            if pool.managed_bytes != before:
                self._back(block)
        except cl.Error as exc:
            return self._allocate_again(nbytes, shape, dt, exc)
        return block

    def _allocate_again(
        self, nbytes: int, shape: Shape, dt: np.dtype[Any], exc: cl.Error
    ) -> cltools.PooledBuffer:
        """After a failed allocation or backing: free what the pool holds, collect garbage
        (dropped tensors give their blocks back), and try once more."""
        if not _is_oom(exc):
            raise exc
        with self._lock:
            gc.collect()
            self._free_held()
            try:
                block = self._pool.allocate(nbytes)
                self._back(block)  # new, or given back by the collection: reading is harmless
                return block
            except cl.Error as again:
                if not _is_oom(again):
                    raise
                self._free_held()  # the block that could not be backed is not kept
                raise self._oom(nbytes, shape, dt, f"out of device memory ({again})") from again

    def _oom(self, nbytes: int, shape: Shape, dt: np.dtype[Any], why: str) -> MemoryError:
        in_use = self._pool.active_bytes
        held = self._pool.managed_bytes - in_use
        limit = f", limit {self._limit}" if self._limit else ""
        asked = prod(shape) * dt.itemsize
        block = f" (a block of {nbytes})" if nbytes != asked else ""
        return MemoryError(
            f"BufferPool {self.name!r}: cannot allocate {asked} bytes{block} for shape {shape} "
            f"{dt}: "
            f"{why}; pool: {in_use} bytes in use, {held} held{limit}; device {self._device_name}:"
            f" {self._global_mem} bytes of global memory, at most {self._max_alloc} per "
            "allocation"
        )

    def release(self, tensor: Tensor) -> None:
        """Give a tensor's block back to the pool; any later use of the tensor raises."""
        try:
            mine = tensor._pool is self
        except AttributeError:
            mine = False
        if not mine:
            self._bad_release(tensor)
        block = tensor._buffer
        tensor._buffer = _RELEASED
        tensor._pool = None
        block.release()

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
        return getattr(tensor, "_pool", None) is self

    @property
    def stats(self) -> PoolStats:
        pool = self._pool
        allocs = _peek(self._allocs)
        # every block the pool ever allocated on the device is live, held, or was freed by
        # free_held: so misses need no counting on the fast path
        misses = pool.active_blocks + pool.held_blocks + self._freed_blocks - _peek(self._unbacked)
        in_use = pool.active_bytes
        return PoolStats(
            bytes_in_use=in_use,
            peak_bytes=max(self._peak, in_use),
            bytes_held=pool.managed_bytes - in_use,
            live_tensors=pool.active_blocks,
            hits=allocs - misses,
            misses=misses,
        )

    def reset_peak(self) -> None:
        """Start peak tracking afresh from the bytes in use now."""
        with self._lock:
            self._peak = self._pool.active_bytes

    def free_held(self) -> None:
        """Free the blocks the pool holds for reuse (live tensors are untouched)."""
        with self._lock:
            self._free_held()

    def _free_held(self) -> None:
        # users that keep views of pool blocks (graph executors) drop them first, or the views
        # would keep the freed blocks' memory allocated
        for forget in list(self._on_free_held):
            forget()
        held = self._pool.held_blocks
        self._pool.free_held()
        self._freed_blocks += held - self._pool.held_blocks

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

    def block_bytes(self, nbytes: int) -> int:
        """The bytes a request of ``nbytes`` really takes (the pool's size class)."""
        if nbytes > self._max_alloc:
            return nbytes  # refused later with a MemoryError; pyopencl cannot size it
        # OpenCL refuses 0-byte buffers
        return int(self._pool.alloc_size(self._pool.bin_number(max(nbytes, 1))))

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"BufferPool({self.name!r}, in_use={s.bytes_in_use}, peak={s.peak_bytes}, "
            f"held={s.bytes_held})"
        )


def _peek(counter: itertools.count[int]) -> int:
    """The next value of an itertools.count without consuming it (its repr is ``count(N)``;
    a count is used because ``next()`` on it is atomic under the GIL, unlike ``+= 1``)."""
    return int(repr(counter)[6:-1])


def _is_oom(exc: cl.Error) -> bool:
    return isinstance(exc, cl.MemoryError) or getattr(exc, "code", None) in _OOM_CODES


def _resolve_limit(limit: int | None, global_mem: int) -> int:
    if limit is None:
        raw = os.environ.get(LIMIT_ENV, "").strip()
        if not raw:
            return 0
        try:
            pct = raw.endswith("%")
            value = int(global_mem * float(raw[:-1]) / 100) if pct else int(raw)
        except ValueError:
            raise ValueError(
                f"{LIMIT_ENV}={raw!r}: expected a number of bytes or a percentage such as '50%'"
            ) from None
        what = f"{LIMIT_ENV}={raw!r}"
    else:
        value, what = limit, f"limit={limit!r}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"BufferPool: {what} must be an int >= 0 (bytes; 0 means no limit)")
    return value


# Pool gauges are observed when a metric reader collects, so allocation pays nothing for them.
_POOLS: weakref.WeakSet[BufferPool] = weakref.WeakSet()


def _observe(field: str) -> Any:
    def callback(_: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(getattr(p.stats, field), {"netcl.pool.id": p.name}) for p in list(_POOLS)
        ]

    return callback


_meter = telemetry.meter("netcl.core.memory", __version__)
_meter.create_observable_gauge(
    "netcl.pool.used", [_observe("bytes_in_use")], unit="By",
    description="Device bytes held by the live tensors of a BufferPool (block bytes)",
)
_meter.create_observable_gauge(
    "netcl.pool.peak", [_observe("peak_bytes")], unit="By",
    description="Most bytes in use at once in a BufferPool since it was made or reset_peak()",
)
_meter.create_observable_gauge(
    "netcl.pool.held", [_observe("bytes_held")], unit="By",
    description="Device bytes a BufferPool holds for reuse (free blocks)",
)
