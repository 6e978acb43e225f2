"""Kernel objects for replay: one per distinct (kernel, argument set), arguments bound once.

Each is a ``clone()`` of the launched kernel as its first recorded launch left it, with every
argument set during the capture re-applied (a clone alone drops NULL arguments on some drivers),
or, where the driver cannot clone, a fresh kernel of the same program with all arguments
re-applied. 200 identical launches share one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.runtime.capture._recording import ArgSet, LaunchShape, launch_sizes

__all__ = ["Binder", "Binds", "BoundLaunch"]

_NO_FLAGS: dict[str, Any] = {}
_EMPTY_NDRANGE: dict[str, Any] = {"allow_empty_ndrange": True}


class BoundLaunch:
    """What the launches of one ``LaunchShape`` share: the replay kernel, the enqueue call and
    keywords, the buffers among its arguments."""

    __slots__ = ("buffers", "call", "flags", "kernel", "name")

    def __init__(self, shape: LaunchShape, kernel: cl.Kernel,
                 buffers: tuple[tuple[int, cl.MemoryObjectHolder], ...]) -> None:  # fmt: skip
        self.kernel = kernel
        self.name: str = shape.kernel.function_name
        # {"allow_empty_ndrange": True} for a launch recorded with it, else empty
        self.flags = _EMPTY_NDRANGE if shape.allow_empty else _NO_FLAGS
        self.buffers = buffers  # (argument index, buffer) of every memory object argument
        # enqueue_nd_range_kernel's leading arguments: queue, kernel, global, local, offset
        self.call: tuple[Any, ...] = (shape.queue, kernel, *launch_sizes(shape))


# id(LaunchShape) -> what its launches replay with (the recording holds the shapes)
Binds = Mapping[int, BoundLaunch]


class Binder:
    """Makes the ``BoundLaunch`` of every recorded launch, sharing whatever can be shared."""

    def __init__(self, clones: dict[int, cl.Kernel | None]) -> None:
        self._clones = clones  # id(kernel) -> its clone from the first launch
        self.by_shape: dict[int, BoundLaunch] = {}
        # one replay kernel per kernel and argument values
        self._replicas: dict[tuple[int, tuple[Any, ...]], cl.Kernel] = {}
        self._buffers: dict[int, tuple[tuple[int, cl.MemoryObjectHolder], ...]] = {}
        self.opaque: dict[str, None] = {}  # kernels launched with arguments set before begin()

    def bind(self, shape: LaunchShape) -> None:
        """Make the ``BoundLaunch`` of a shape not bound yet."""
        kernel, snap = shape.kernel, shape.args
        known = len(snap) >= kernel.num_args
        if not known:
            self.opaque[kernel.function_name] = None
        key = (id(kernel), tuple((a.arg_index, id(a.setter), _value_key(a.payload)) for a in snap))
        replica = self._replicas.get(key)
        if replica is None:
            replica = self._replicas[key] = _replicate(
                kernel, self._clones.get(id(kernel)), snap, known
            )
        buffers = self._buffers.get(id(snap))
        if buffers is None:
            buffers = self._buffers[id(snap)] = tuple(
                (arg.arg_index, value)
                for arg in snap
                for value in _flat_values(arg.payload)
                if isinstance(value, cl.MemoryObjectHolder)
            )
        self.by_shape[id(shape)] = BoundLaunch(shape, replica, buffers)


def _flat_values(payload: tuple[Any, ...]) -> Iterator[Any]:
    for value in payload:
        if isinstance(value, tuple):
            yield from value
        else:
            yield value


def _value_key(value: Any) -> Any:
    if isinstance(value, cl.MemoryObjectHolder):
        return ("mem", id(value))  # the recording's own reference, one per buffer
    if isinstance(value, cl.LocalMemory):
        return ("local", value.size)
    if isinstance(value, (np.ndarray, np.generic)):
        return ("np", value.dtype.str, value.tobytes())
    if value is None or isinstance(value, (int, float, bytes, str)):
        return value
    if isinstance(value, tuple):
        return tuple(_value_key(v) for v in value)
    return ("id", id(value))  # held alive by the recording


def _replicate(
    kernel: cl.Kernel, template: cl.Kernel | None, snap: tuple[ArgSet, ...], known: bool
) -> cl.Kernel:
    """A kernel object of its own holding the arguments of one recorded launch: a clone of the
    kernel as its first recorded launch left it, with every argument set in the capture
    re-applied (a clone alone drops NULL arguments on PoCL)."""
    if template is not None:
        replica = template.clone()
    elif known:
        replica = cl.Kernel(kernel.program, kernel.function_name)
    else:
        raise RuntimeError(
            f"KernelCapture: cannot record kernel {kernel.function_name!r}: the device cannot "
            f"clone kernels and only {len(snap)} of its {kernel.num_args} arguments were set "
            "inside the capture; pass the arguments in the call"
        )
    for arg in snap:
        arg.setter(replica, *arg.payload)
    return replica
