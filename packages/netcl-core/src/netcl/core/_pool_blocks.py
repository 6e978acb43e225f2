"""Where a BufferPool's blocks come from, and what the device holds for it.

Blocks come from ``pyopencl.tools.MemoryPool`` over plain buffers, and each new one is backed by
device memory before it is handed out. A size class that pyopencl would round past the device's
maximum allocation gets blocks of exactly the class size, made one by one (:class:`DirectBuffer`).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.tools as cltools

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


def is_oom(exc: cl.Error) -> bool:
    """Whether a pyopencl error means the device ran out of memory."""
    return isinstance(exc, cl.MemoryError) or getattr(exc, "code", None) in _OOM_CODES


class DirectBuffer(cl.Buffer):  # type: ignore[misc]
    """A block made by itself, of exactly its size class. Weakly referable: the pool counts it
    until it is freed."""

    __slots__ = ("__weakref__",)


class Bin:
    """One size class of a pool: the block size, and the blocks held for reuse (LIFO).

    ``owner`` is the pool's token, not the pool: a bin referring to its pool would make a
    reference cycle, and a dropped pool would free its device memory only at the next garbage
    collection."""

    __slots__ = ("direct", "free", "nbytes", "owner")

    def __init__(self, owner: object, nbytes: int, direct: bool) -> None:
        self.owner = owner
        self.nbytes = nbytes
        self.direct = direct  # blocks are DirectBuffers, not pyopencl pool blocks
        self.free: list[Any] = []


class Blocks:
    """A pool's source of device blocks (every method but the counters' reads is called with
    ``lock`` held: pyopencl's pool allocates under it only, so its counters are exact there)."""

    def __init__(self, queue: cl.CommandQueue, lock: threading.RLock) -> None:
        self.context = queue.context
        self.max_alloc = int(queue.device.max_mem_alloc_size)
        self._lock = lock
        # Not pyopencl's ImmediateAllocator: it enqueues clEnqueueMigrateMemObjects for every new
        # block on the caller's queue, and NVIDIA's driver crashes when that runs while another
        # thread is inside a blocking read or write on the same queue (pyopencl releases the GIL
        # there). The pool makes plain buffers (clCreateBuffer only: no command) and backs each
        # new one itself with a blocking 1-byte read on a queue of its own, so running out of
        # memory shows at allocation (NVIDIA allocates lazily, at first use), nothing of the
        # pool's lands on the caller's queue, and no allocation waits for the caller's work.
        self.queue = cl.CommandQueue(queue.context, queue.device)
        self._scratch = np.empty(1, np.uint8)
        with warnings.catch_warnings():
            # pyopencl warns that a deferred allocator reports no memory errors: back() does
            warnings.filterwarnings("ignore", "Memory pools expect non-deferred", UserWarning)
            # 6 leading bits per size class: a block is at most 1/64 larger than asked for
            # (pyopencl's default of 4 wastes up to 1/16, which would show in graph plans).
            self.pool = cltools.MemoryPool(
                cltools.DeferredAllocator(queue.context), leading_bits_in_bin_id=6
            )
        self.direct_bytes = 0  # DirectBuffers alive (out or held)
        self.direct_blocks = 0

    def class_bytes(self, nbytes: int) -> int:
        """pyopencl's size class of a request (OpenCL refuses 0-byte buffers)."""
        return int(self.pool.alloc_size(self.pool.bin_number(max(nbytes, 1))))

    def make(self, bin_: Bin) -> tuple[Any, bool]:
        """A block and whether it is new (backed here); pyopencl's pool hands out a block a
        dropped tensor gave back before it makes a new one."""
        if bin_.direct:
            block: Any = DirectBuffer(self.context, cl.mem_flags.READ_WRITE, bin_.nbytes)
            new = True
        else:
            pool = self.pool
            before = pool.managed_bytes
            block = pool.allocate(bin_.nbytes)
            new = pool.managed_bytes != before
        if new:
            try:
                self.back(block)
            except BaseException:
                self.drop(block, bin_)
                del block  # not kept alive by the traceback
                raise
            if bin_.direct:
                self.direct_bytes += bin_.nbytes
                self.direct_blocks += 1
                ref = weakref.ref(self)
                weakref.finalize(block, _direct_freed, ref, bin_.nbytes).atexit = False
        return block, new

    def back(self, block: Any) -> None:
        """Make the device back a new block now: a blocking 1-byte read on the pool's own queue
        (it waits for nothing of the caller's; a read changes nothing)."""
        _read_buffer(self.queue, block, self._scratch, 0, None, True)

    @staticmethod
    def drop(block: Any, bin_: Bin) -> None:
        """Give up a block that is not handed out: a pool block goes back to pyopencl's pool
        (freed by the next free_held); a direct block is freed with the caller's reference."""
        if not bin_.direct:
            block.release()

    def free_held(self) -> None:
        """Free the blocks pyopencl's pool holds."""
        self.pool.free_held()

    def active(self) -> tuple[int, int]:
        """Bytes and blocks that are out or held in the bins (pyopencl counts those as active)."""
        pool = self.pool
        return int(pool.active_bytes) + self.direct_bytes, int(
            pool.active_blocks
        ) + self.direct_blocks

    def held_by_pyopencl(self) -> int:
        """Bytes pyopencl's pool holds (dropped tensors' blocks)."""
        return int(self.pool.managed_bytes) - int(self.pool.active_bytes)

    def total(self) -> int:
        """Device bytes of every block: out, in the bins, held by pyopencl."""
        return int(self.pool.managed_bytes) + self.direct_bytes


def _direct_freed(ref: weakref.ref[Blocks], nbytes: int) -> None:
    blocks = ref()
    if blocks is not None:
        with blocks._lock:
            blocks.direct_bytes -= nbytes
            blocks.direct_blocks -= 1
