"""BufferPool: device memory for Tensors, reused by size class (the package's guide has the
design: size classes, threads, out of memory, the limit, the gauges)."""

from __future__ import annotations

import contextlib
import gc
import itertools
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl
import pyopencl.tools as cltools

from netcl.core import contract, device, telemetry
from netcl.core.settings import CHECK_MEMORY, POOL_LIMIT
from netcl.core.tensor import _RELEASED, Gone, Shape, Tensor, normalize_shape
from netcl.core.version import __version__

__all__ = [
    "BufferPool",
    "Checker",
    "Guard",
    "MemoryCheckError",
    "PoolStats",
    "guard_byte",
    "guard_bytes",
]

# pyopencl's own primitives (the contract's originals): netcl-capture intercepts the module
# attributes while it records, and the pool's backing read (on its own queue) and checked mode's
# guard fills and reads are not part of the application's work
_read_buffer, _fill_buffer, _barrier = contract.read_buffer, contract.fill_buffer, contract.barrier

# pyopencl reports running out of device memory with these codes (MemoryError covers the first)
_OOM_CODES = frozenset(
    {
        cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
        cl.status_code.OUT_OF_RESOURCES,
        cl.status_code.OUT_OF_HOST_MEMORY,
    }
)


def _is_oom(exc: cl.Error) -> bool:
    return isinstance(exc, cl.MemoryError) or getattr(exc, "code", None) in _OOM_CODES


# -- the gauges: set whenever a pool looks at its exact figures (see BufferPool._look), and so
# by every live pool when a reader collects (keeping them current on each hit and release would
# cost the pool's fast path as much again)
_TEL = telemetry.Scope("netcl.core.memory", __version__)
_POOLS: weakref.WeakSet[BufferPool] = weakref.WeakSet()
_CHECKED_POOLS: weakref.WeakSet[_CheckedPool] = weakref.WeakSet()  # device.checker(): O(1)


def _look_all() -> None:
    for pool in list(_POOLS):
        pool.stats  # noqa: B018  (sets the pool's gauges)


_USED, _PEAK, _HELD = (telemetry.Counts("netcl.pool.id", _look_all) for _ in range(3))
for _name, _counts, _what in (
    ("used", _USED, "Device bytes held by the live tensors of a BufferPool (block bytes)"),
    ("peak", _PEAK, "Most bytes in use at once in a BufferPool since it was made or reset_peak()"),
    ("held", _HELD, "Device bytes a BufferPool holds for reuse (free blocks)"),
):
    _TEL.observable_gauge(f"netcl.pool.{_name}", _counts.points, "By", _what)


# -- checked mode (guide: When a kernel writes out of bounds) ------------------------------
_POISON = np.uint8(0xFF)  # what a freed block holds: NaN in every float dtype, -1 in signed ints


def guard_byte(turn: int) -> int:
    """What guard bytes hold: 0xB0 to 0xBF, a moderate float in every float dtype (so x + 1
    changes it) and a different byte for ``turn`` 0..15: a kernel copying past its input's
    end into past its output's end still changes the output's guard."""
    return 0xB0 | turn % 16


def guard_bytes(nbytes: int) -> int:
    """The guard after ``nbytes`` in checked mode: as many bytes again plus 4 KiB, so that a
    kernel run with twice its global size writes into the guard, not past it."""
    return nbytes + 4096


class MemoryCheckError(RuntimeError):
    """Checked mode found guard bytes overwritten: a kernel wrote out of bounds."""


@dataclass(frozen=True, slots=True)
class Guard:
    """The guard bytes around ``nbytes`` at ``start`` of a block: ``before`` bytes before them
    (0 where the block starts there), ``after`` bytes after them, each holding ``byte``."""

    start: int
    nbytes: int
    before: int
    after: int
    byte: int

    def fill(self, queue: cl.CommandQueue, block: Any) -> None:
        """Enqueue the fills of the guard bytes (ordered on an out-of-order queue too)."""
        if ooo := device.out_of_order(queue):
            _barrier(queue, None)
        pattern = np.uint8(self.byte)
        if self.before:
            _fill_buffer(queue, block, pattern, self.start - self.before, self.before)
        _fill_buffer(queue, block, pattern, self.start + self.nbytes, self.after)
        if ooo:
            _barrier(queue, None)

    def check(self, queue: cl.CommandQueue, block: Any, who: str, what: str) -> None:
        """Read the guard bytes (blocking, after everything enqueued before) and raise
        MemoryCheckError saying that ``who`` wrote out of ``what`` when one was overwritten."""
        host = np.empty(self.before + self.after, np.uint8)
        if device.out_of_order(queue):
            _barrier(queue, None)
        if self.before:
            _read_buffer(queue, block, host[: self.before], self.start - self.before, None, True)
        _read_buffer(queue, block, host[self.before :], self.start + self.nbytes, None, True)
        bad = np.flatnonzero(host != self.byte)
        if not len(bad):
            return
        # the farthest overwritten byte on each side: how far out of bounds the writes went
        before, after = max(self.before - int(bad[0]), 0), max(int(bad[-1]) + 1 - self.before, 0)
        where = [
            f"{n} bytes {side}"
            for n, side in ((after, "past the end"), (before, "before the start"))
            if n
        ]
        raise MemoryCheckError(
            f"{who} wrote {' and '.join(where)} of {what} (checked mode's guards: {self.after} "
            f"bytes after it, {self.before} before it): a kernel's global size or indexing is "
            "wrong; fix it, or give the tensor the size the kernel writes"
        )


class Checker:
    """Checked mode as the packages use it (:func:`netcl.core.device.checker`): the guards of
    every live block of the checked pools, looked up by buffer and checked."""

    __slots__ = ()

    def guarded(self, ptr: int) -> tuple[BufferPool, Any, Guard, str] | None:
        """The checked pool, block, guard and description of the live pool block at ``ptr``."""
        for pool in list(_CHECKED_POOLS):
            if (entry := pool._guards.get(ptr)) is not None:
                return (pool, *entry)
        return None

    def check_all(self, who: str) -> None:
        """Check every live block's guards (blocking): MemoryCheckError saying ``who`` overran."""
        for pool in list(_CHECKED_POOLS):
            for block, guard, what in list(pool._guards.values()):
                try:
                    guard.check(pool.queue, block, who, what)
                except MemoryCheckError:
                    guard.fill(pool.queue, block)  # named once: a later check blames new writes
                    raise


_CHECKER = Checker()


def _held_blocks() -> set[int]:
    """The ``int_ptr`` of every block the live BufferPools hold for reuse (released, not handed
    out again): memory that nothing outside its pool can reach (a capture's end() asks, through
    :func:`netcl.core.device.held_blocks`)."""
    found: set[int] = set()
    for pool in list(_POOLS):
        for bin_ in list(pool._bins.values()):
            found.update(block.int_ptr for block in list(bin_.free))
    return found


def _claim_held(ptrs: set[int]) -> list[Any]:
    """Take the held blocks whose ``int_ptr`` is in ``ptrs`` out of their pools, which count
    them as in use from here on, and return them (:func:`netcl.core.device.claim_held`)."""
    return [block for pool in list(_POOLS) for block in pool._claim(ptrs)]


def _checker() -> Checker | None:
    """The :class:`Checker` while a checked pool is alive, else None (``device.checker()``)."""
    return _CHECKER if _CHECKED_POOLS else None


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's figures, in block bytes (sizes as the pool rounds them). ``misses``
    counts allocations that needed a new device block, ``hits`` those served from a held one."""

    bytes_in_use: int
    peak_bytes: int
    bytes_held: int
    live_tensors: int
    hits: int
    misses: int


class _DirectBuffer(cl.Buffer):  # type: ignore[misc]
    """A block made by itself, of exactly its size class (a class pyopencl would round past the
    device's maximum allocation). Weakly referable: the pool counts it until it is freed."""

    __slots__ = ("__weakref__",)


@dataclass(eq=False, slots=True)
class _Bin:
    """One size class of a pool: the block size, and the blocks held for reuse (LIFO). ``owner``
    is the pool's token, not the pool: a reference cycle would keep a dropped pool's device
    memory until the next garbage collection."""

    owner: object
    nbytes: int
    direct: bool  # blocks are _DirectBuffers, not pyopencl pool blocks
    free: list[Any] = field(default_factory=list)


_ids = itertools.count(1)  # default pool names


class _PoolTensor(Tensor):
    """A pool's Tensor: the pool sets its fields itself (the block is known to fit), so it is
    made by calling a class without a Python ``__init__``, CPython's cheapest way to make an
    instance (``object.__new__(Tensor)`` costs ~100 ns more a call on 3.11 and 3.12)."""

    __slots__ = ()
    __init__ = object.__init__


class BufferPool:
    """Hands out Tensors whose blocks come back on :meth:`release` (or when a Tensor is dropped),
    to be handed out again for a request of the same size class (at most 1/64 larger). Safe to
    use from several threads. ``limit`` caps the device bytes the pool holds, in use or held
    (``None``: ``NETCL_POOL_LIMIT``; 0: no limit); ``name`` labels its gauges (``netcl.pool.id``).
    ``check_memory`` (``None``: ``NETCL_CHECK_MEMORY``) turns checked mode on: guard bytes after
    every block, checked at its release, and freed blocks poisoned (tests and debugging).
    """

    check_memory = False  #: whether this pool is in checked mode

    def __new__(
        cls, queue: cl.CommandQueue, *, check_memory: bool | None = None, **options: Any
    ) -> BufferPool:
        # the other arguments are __init__'s (type checkers read its signature)
        if check_memory is None:
            check_memory = CHECK_MEMORY.value(False)
        # checked mode is a subclass: the plain pool's fast path stays as it is
        return object.__new__(_CheckedPool if check_memory and cls is BufferPool else cls)

    __slots__ = (
        "__weakref__",
        "_backing",
        "_bins",
        "_device_bytes",
        "_device_name",
        "_direct_blocks",
        "_direct_bytes",
        "_global_mem",
        "_hits",
        "_limit",
        "_lock",
        "_max_alloc",
        "_mempool",
        "_misses",
        "_on_free_held",
        "_peak",
        "_room",
        "_scratch",
        "_sizes",
        "_sizes_kept",
        "_token",
        "name",
        "queue",
    )

    def __init__(
        self,
        queue: cl.CommandQueue,
        *,
        limit: int | None = None,
        name: str | None = None,
        check_memory: bool | None = None,
    ) -> None:
        self.queue = queue
        self.name = name if name is not None else f"pool-{next(_ids)}"
        device = queue.device
        self._device_name = str(device.name).strip()
        self._global_mem = int(device.global_mem_size)
        self._max_alloc = int(device.max_mem_alloc_size)
        if limit is None:
            limit = POOL_LIMIT.value(lambda _: 0)(self._global_mem)
        elif isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"BufferPool: limit={limit!r} must be an int >= 0 (bytes; 0 means no limit)"
            )
        self._limit: int = limit
        self._lock = threading.RLock()  # all but the fast path (guide: Threads)
        # new blocks are backed by a 1-byte read on a queue of the pool's own, never the caller's
        # (guide: not pyopencl's ImmediateAllocator, which crashes NVIDIA's driver)
        self._backing = cl.CommandQueue(queue.context, device)
        self._scratch = np.empty(1, np.uint8)
        with warnings.catch_warnings():
            # pyopencl warns that a deferred allocator reports no memory errors: the pool does
            warnings.filterwarnings("ignore", "Memory pools expect non-deferred", UserWarning)
            # 6 leading bits per size class: a block is at most 1/64 larger than asked for
            # (pyopencl's default of 4 wastes up to 1/16, which would show in graph plans).
            self._mempool = cltools.MemoryPool(
                cltools.DeferredAllocator(queue.context), leading_bits_in_bin_id=6
            )
        self._direct_bytes = self._direct_blocks = 0  # _DirectBuffers alive (out or held)
        self._token = object()  # what this pool's bins and their tensors know it by
        self._bins: dict[int, _Bin] = {}  # by block size
        self._sizes: dict[Any, dict[Any, tuple[Shape, np.dtype[Any], _Bin]]] = {}
        self._sizes_kept = self._hits = 0
        self._misses = self._peak = 0  # changed under the lock only
        # bytes of the blocks out or in the bins at the last look (a dropped tensor can only make
        # it too high, never too low)
        self._device_bytes = 0
        # peak - (_device_bytes - bytes in the bins): the fast path's peak check (guide). Only
        # ever changed by += and -=, so a change under the lock composes with the fast path's.
        self._room = 0
        self._on_free_held: list[weakref.WeakMethod[Callable[[], None]]] = []
        for counts in (_USED, _PEAK, _HELD):
            weakref.finalize(self, counts.discard, self.name)
        _POOLS.add(self)
        self._new_peak()  # the gauges start at 0

    @property
    def limit(self) -> int:
        """The most device bytes the pool may hold (0: no limit)."""
        return self._limit

    # _nbytes is private (netcl-graph: a larger block); not keyword-only because a call that
    # fills a keyword-only default takes CPython's slower call path
    def allocate(
        self, shape: int | Sequence[int], dtype: npt.DTypeLike, _nbytes: int = 0
    ) -> Tensor:
        """A Tensor of ``shape`` and ``dtype`` backed by a pool block (contents undefined); a
        MemoryError when the device or the limit cannot provide it (after freeing held blocks)."""
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
            self._room = room = self._room - bin_.nbytes  # one attribute read fewer
            if room < 0:
                self._new_peak()
        t: Tensor = _PoolTensor()
        t._buffer = block
        t._bin = bin_
        t.shape = shape
        t.dtype = dt
        t.queue = self.queue
        return t

    def release(self, tensor: Tensor) -> None:
        """Give a tensor's block back to the pool; any later use of the tensor raises."""
        try:  # cheaper than getattr on the fast path
            bin_ = tensor._bin
            owner = bin_.owner
        except AttributeError:  # not a Tensor, or not a live pool tensor (its _bin is None)
            owner = None
        if owner is not self._token:
            self._bad_release(tensor)
        bin_.free.append(tensor._buffer)
        tensor._buffer = _RELEASED
        tensor._bin = None
        self._room += bin_.nbytes

    def _bad_release(self, tensor: Tensor) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"BufferPool.release: expected a Tensor, got {tensor!r}")
        if type(gone := tensor._buffer) is Gone:
            what = "was already released" if gone is _RELEASED else gone.message
            raise ValueError(f"BufferPool.release: {tensor!r} {what}")
        raise ValueError(f"BufferPool.release: {tensor!r} was not allocated by this pool")

    def release_all(self, tensors: Iterable[Tensor]) -> None:
        """Release several tensors; every one is attempted, the first error is raised after."""
        first: Exception | None = None
        for t in tensors:
            try:
                self.release(t)
            except (ValueError, MemoryCheckError) as exc:
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
        return min(self._class_bytes(nbytes), self._max_alloc)

    def _size_of(
        self, shape: int | Sequence[int], dtype: npt.DTypeLike
    ) -> tuple[Shape, np.dtype[Any], _Bin]:
        dims = normalize_shape(shape)
        dt = np.dtype(dtype)
        entry = (dims, dt, self._bin_for(prod(dims) * dt.itemsize))
        if isinstance(shape, (tuple, int)) and self._sizes_kept < 4096:
            # an unhashable dtype spelling (a list of fields) is not cached
            with contextlib.suppress(TypeError):
                self._sizes.setdefault(dtype, {})[shape] = entry
                self._sizes_kept += 1
        return entry

    def _bin_for(self, nbytes: int) -> _Bin:
        if (size := self.block_bytes(nbytes)) > self._max_alloc:
            return _Bin(self._token, size, direct=True)  # not kept: allocating from it fails
        if (bin_ := self._bins.get(size)) is not None:
            return bin_
        with self._lock:  # one bin per size, whichever thread makes it
            if (bin_ := self._bins.get(size)) is None:
                # pyopencl's class of the device's maximum can be larger than the maximum
                bin_ = self._bins[size] = _Bin(self._token, size, self._class_bytes(size) != size)
            return bin_

    def _class_bytes(self, nbytes: int) -> int:
        """pyopencl's size class of a request (OpenCL refuses 0-byte buffers)."""
        return int(self._mempool.alloc_size(self._mempool.bin_number(max(nbytes, 1))))

    # -- the slow path: the size class holds no block (the lock is held) --------------------
    def _miss(self, bin_: _Bin, shape: Shape, dt: np.dtype[Any]) -> Any:
        with self._lock:
            try:
                block = bin_.free.pop()  # released by another thread meanwhile
            except IndexError:
                block = self._take(bin_, shape, dt)
            else:
                self._hits += 1
                self._room -= bin_.nbytes
            self._look()
        return block

    def _take(self, bin_: _Bin, shape: Shape, dt: np.dtype[Any]) -> Any:
        """A block from the device (or one a dropped tensor gave back), within the device's
        maximum allocation and the pool's limit; a new one counts as a miss."""
        if bin_.nbytes > self._max_alloc:
            raise self._oom(
                bin_, shape, dt, f"the device allocates at most {self._max_alloc} bytes at once"
            )
        for _ in range(2):  # over the limit: free the held blocks and try once more
            block, new = self._make(bin_, shape, dt)
            # the device bytes of every block: out, in the bins, held by pyopencl
            if not self._limit or self._mempool.managed_bytes + self._direct_bytes <= self._limit:
                if new:
                    self._misses += 1
                else:
                    self._hits += 1
                return block
            self._drop(block, bin_)
            del block  # a direct block is freed now, not kept by the traceback
            self._free_held()
        raise self._oom(bin_, shape, dt, f"the pool limit is {self._limit} bytes")

    def _make(self, bin_: _Bin, shape: Shape, dt: np.dtype[Any]) -> tuple[Any, bool]:
        """A block for ``bin_``. When the device cannot allocate or back it: free what the pool
        holds, collect garbage (dropped tensors give their blocks back), and try once more."""
        try:
            return self._new_block(bin_)
        except cl.Error as exc:
            if not _is_oom(exc):
                raise
        gc.collect()
        self._free_held()
        try:
            return self._new_block(bin_)
        except cl.Error as again:
            if not _is_oom(again):
                raise
            self._free_held()  # the block that could not be backed is not kept
            raise self._oom(bin_, shape, dt, f"out of device memory ({again})") from again

    def _new_block(self, bin_: _Bin) -> tuple[Any, bool]:
        """A block and whether it is new (backed here) rather than one a dropped tensor gave
        back to pyopencl's pool (whose counters are exact here: it allocates under the lock)."""
        if bin_.direct:
            block: Any = _DirectBuffer(self.queue.context, cl.mem_flags.READ_WRITE, bin_.nbytes)
            new = True
        else:
            before = self._mempool.managed_bytes
            block = self._mempool.allocate(bin_.nbytes)
            new = self._mempool.managed_bytes != before
        if new:
            try:  # back it now: a blocking read on the pool's own queue changes nothing
                _read_buffer(self._backing, block, self._scratch, 0, None, True)
            except BaseException:
                self._drop(block, bin_)
                del block  # not kept alive by the traceback
                raise
            if bin_.direct:
                self._direct_bytes += bin_.nbytes
                self._direct_blocks += 1
                freed = weakref.finalize(block, self._direct_freed, weakref.ref(self), bin_.nbytes)
                freed.atexit = False
        return block, new

    @staticmethod
    def _direct_freed(ref: weakref.ref[BufferPool], nbytes: int) -> None:
        """A direct block's finalizer: the pool (if still alive; a weak reference, not to keep
        it) counts the block gone."""
        if (pool := ref()) is not None:
            with pool._lock:
                pool._direct_bytes -= nbytes
                pool._direct_blocks -= 1

    @staticmethod
    def _drop(block: Any, bin_: _Bin) -> None:
        """Give up a block that is not handed out: a pool block goes back to pyopencl's pool
        (freed by the next free_held); a direct block is freed with the caller's reference."""
        if not bin_.direct:
            block.release()

    def _oom(self, bin_: _Bin, shape: Shape, dt: np.dtype[Any], why: str) -> MemoryError:
        s = self._look()
        limit = f", limit {self._limit}" if self._limit else ""
        asked = prod(shape) * dt.itemsize
        block = f" (a block of {bin_.nbytes})" if bin_.nbytes != asked else ""
        return MemoryError(
            f"BufferPool {self.name!r}: cannot allocate {asked} bytes{block} for shape {shape} "
            f"{dt}: {why}; pool: {s.bytes_in_use} bytes in use, {s.bytes_held} held{limit}; "
            f"device {self._device_name}: {self._global_mem} bytes of global memory, at most "
            f"{self._max_alloc} per allocation"
        )

    # -- figures ----------------------------------------------------------------------------
    def _new_peak(self) -> None:
        """The fast path's estimate passed the peak: look at the exact bytes in use."""
        with self._lock:
            self._look()

    def _look(self, reset: bool = False) -> PoolStats:
        """The exact figures (with the lock held), the peak raised to the bytes in use (``reset``:
        set to them); brings the fast path's room and the gauges up to date."""
        # pyopencl's counters are read before the bins: a concurrent hit or release moves a
        # block that is already counted as active, so no figure can go below zero
        pool = self._mempool  # pyopencl counts the blocks out and in the bins as active
        active = int(pool.active_bytes) + self._direct_bytes
        blocks = int(pool.active_blocks) + self._direct_blocks
        held = int(pool.managed_bytes) - int(pool.active_bytes)  # dropped tensors' blocks
        in_bins = in_bins_blocks = 0
        for bin_ in list(self._bins.values()):
            n = len(bin_.free)
            in_bins_blocks += n
            in_bins += n * bin_.nbytes
        in_use = active - in_bins
        peak = in_use if reset else max(self._peak, in_use)
        # _room = peak - (_device_bytes - bytes in the bins), kept by increments (see __init__)
        self._room += (peak - self._peak) - (active - self._device_bytes)
        self._peak, self._device_bytes = peak, active
        _USED.set(in_use, self.name)
        _PEAK.set(peak, self.name)
        _HELD.set(held + in_bins, self.name)
        return PoolStats(
            in_use, peak, held + in_bins, blocks - in_bins_blocks, self._hits, self._misses
        )

    @property
    def stats(self) -> PoolStats:
        """The pool's figures now (exact; also brings its gauges up to date)."""
        with self._lock:
            return self._look()

    def reset_peak(self) -> None:
        """Start peak tracking afresh from the bytes in use now."""
        with self._lock:
            self._look(reset=True)

    def free_held(self) -> None:
        """Free the blocks the pool holds for reuse (live tensors are untouched)."""
        with self._lock:
            self._free_held()

    def _free_held(self) -> None:
        for ref in list(self._on_free_held):
            if (forget := ref()) is None:
                self._on_free_held.remove(ref)
            else:
                forget()
        for bin_ in list(self._bins.values()):
            while True:
                try:  # not `while bin_.free`: another thread's hit may take the last block
                    block = bin_.free.pop()
                except IndexError:
                    break
                self._room -= bin_.nbytes
                self._drop(block, bin_)
                del block  # a direct block is freed here
        self._mempool.free_held()
        self._look()

    def _claim(self, ptrs: set[int]) -> list[Any]:
        """Take the held blocks of ``ptrs`` out of the bins: in use from here on (a capture
        keeps them, see _claim_held)."""
        taken: list[Any] = []
        with self._lock:
            for bin_ in list(self._bins.values()):
                for block in [b for b in bin_.free if b.int_ptr in ptrs]:
                    bin_.free.remove(block)
                    self._room -= bin_.nbytes
                    taken.append(block)
        return taken

    def on_free_held(self, hook: Callable[[], None]) -> None:
        """Call ``hook``, a bound method (kept weakly), each time before the pool frees the
        blocks it holds for reuse: for users that keep views of its blocks (a graph executor's
        sub-buffers), which would otherwise keep the freed blocks' memory allocated."""
        self._on_free_held.append(weakref.WeakMethod(hook))  # type: ignore[arg-type]

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"BufferPool({self.name!r}, in_use={s.bytes_in_use}, peak={s.peak_bytes}, "
            f"held={s.bytes_held})"
        )


class _CheckedPool(BufferPool):
    """A BufferPool in checked mode: a guard after the bytes asked for in every block, filled
    at allocation and checked at release, when the block's bytes are also poisoned."""

    __slots__ = ("_guards", "_turn")
    check_memory = True

    def __init__(self, queue: cl.CommandQueue, **options: Any) -> None:
        super().__init__(queue, **options)
        _CHECKED_POOLS.add(self)
        self._guards: dict[int, tuple[Any, Guard, str]] = {}  # int_ptr -> block, guard, what
        self._turn = itertools.count()  # each block's guard byte in turn

    def allocate(
        self, shape: int | Sequence[int], dtype: npt.DTypeLike, _nbytes: int = 0
    ) -> Tensor:
        dims = normalize_shape(shape)
        nbytes = max(prod(dims) * np.dtype(dtype).itemsize, _nbytes)
        t = super().allocate(dims, dtype, nbytes + guard_bytes(nbytes))
        guard = Guard(0, nbytes, 0, guard_bytes(nbytes), guard_byte(next(self._turn)))
        guard.fill(self.queue, t._buffer)
        self._guards[t._buffer.int_ptr] = (t._buffer, guard, repr(t))
        return t

    def release(self, tensor: Tensor) -> None:
        block: Any = getattr(tensor, "_buffer", None)
        super().release(tensor)
        _, guard, what = self._guards.pop(block.int_ptr)
        try:
            guard.check(
                self.queue,
                block,
                "a kernel",
                f"{what} (found as it went back to BufferPool {self.name!r})",
            )
        finally:
            if guard.nbytes:  # a read of freed memory shows up as NaN (or -1) in results
                _fill_buffer(self.queue, block, _POISON, 0, guard.nbytes)


# the seam: device.checker(), device.held_blocks(), device.claim_held()
device._use_pools((_checker, _held_blocks, _claim_held))
