"""Tensor: a typed, shaped view of an OpenCL buffer."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyopencl as cl

if TYPE_CHECKING:
    import pyopencl.array as cla

__all__ = ["Gone", "Shape", "Tensor", "normalize_shape"]

Shape = tuple[int, ...]


def normalize_shape(shape: int | Sequence[int]) -> Shape:
    """Return ``shape`` as a tuple of non-negative ints, or raise ``ValueError`` naming it."""
    if type(shape) is tuple:  # the common case, checked without building a new tuple
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
            raise ValueError(f"shape {shape!r}: every dimension must be an int >= 0, got {d!r}")
    return tuple(int(d) for d in dims)


class Gone:
    """Stands in for the buffer of a tensor whose memory is no longer its own (released to its
    pool, or a graph intermediate whose run ended; see :meth:`Tensor.revoke`): a later use
    raises RuntimeError with ``message`` instead of touching a block that may already hold
    another tensor's values."""

    __slots__ = ("message",)
    size = 0
    int_ptr = 0

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"<gone: {self.message}>"


_RELEASED: Any = Gone("was released to its BufferPool; a released tensor cannot be used")


class Tensor:
    """An on-device value: an OpenCL buffer with a shape, a dtype and the queue it lives on;
    freed with the Tensor, except a pool's (which go back through ``pool.release(tensor)``)."""

    __slots__ = ("__weakref__", "_bin", "_buffer", "dtype", "queue", "shape")

    def __init__(
        self,
        buffer: cl.MemoryObjectHolder,
        shape: int | Sequence[int],
        dtype: npt.DTypeLike,
        queue: cl.CommandQueue,
    ) -> None:
        self.shape: Shape = normalize_shape(shape)
        self.dtype: np.dtype[Any] = np.dtype(dtype)
        if int(buffer.size) < self.nbytes:
            raise ValueError(
                f"Tensor{self.shape} of {self.dtype} needs {self.nbytes} bytes, "
                f"but the buffer holds only {buffer.size}"
            )
        self._buffer = buffer
        # while a BufferPool tensor is live: the pool size class its buffer goes back to
        self._bin: Any = None
        self.queue = queue

    @property
    def buffer(self) -> cl.MemoryObjectHolder:
        """The OpenCL buffer (``RuntimeError`` once the tensor was released to its pool, or once
        the run of the graph it was an intermediate of ended)."""
        if type(buf := self._buffer) is Gone:
            raise RuntimeError(f"{self!r} {buf.message}")
        return buf

    def lend(self, buffer: cl.MemoryObjectHolder) -> None:
        """Let the tensor view ``buffer`` (again), which must hold its :attr:`nbytes`: for code
        that hands out tensors over memory it owns and takes back (a graph's intermediates)."""
        self._buffer = buffer

    def revoke(self, gone: Gone) -> None:
        """Take the tensor's buffer back: any later use raises RuntimeError with ``gone``'s
        message. A pool's tensor goes back with ``pool.release``, which revokes it itself."""
        self._buffer = gone

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def empty(
        cls, shape: int | Sequence[int], dtype: npt.DTypeLike, queue: cl.CommandQueue
    ) -> Tensor:
        """A new uninitialised tensor with a buffer of its own."""
        shape = normalize_shape(shape)
        nbytes = max(prod(shape) * np.dtype(dtype).itemsize, 1)  # OpenCL refuses 0-byte buffers
        return cls(cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, nbytes), shape, dtype, queue)

    @classmethod
    def from_numpy(cls, array: npt.ArrayLike, queue: cl.CommandQueue) -> Tensor:
        """Copy a host array to a new tensor (blocking)."""
        host = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
        tensor = cls.empty(host.shape, host.dtype, queue)
        tensor.write(host)
        return tensor

    def write(self, array: npt.ArrayLike, *, wait: bool = True) -> cl.Event | None:
        """Copy a host array of the same shape and dtype into this tensor, in place."""
        host = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
        if host.shape != self.shape or host.dtype != self.dtype:
            raise ValueError(
                f"write: expected shape {self.shape} and dtype {self.dtype}, "
                f"got shape {host.shape} and dtype {host.dtype}"
            )
        if not host.nbytes:
            return None
        return cl.enqueue_copy(self.queue, self.buffer, host, is_blocking=wait)

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """Copy the tensor to a new host array (blocking)."""
        host = np.empty(self.shape, self.dtype)
        if host.nbytes:
            cl.enqueue_copy(self.queue, host, self.buffer)
        return host

    def as_array(self) -> cla.Array:
        """A ``pyopencl.array.Array`` over the same buffer (no copy), for pyopencl's array ops."""
        # imported here: pyopencl.array costs a few ms at import and most users never need it
        import pyopencl.array as cla

        return cla.Array(self.queue, self.shape, self.dtype, data=self.buffer)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes})"
