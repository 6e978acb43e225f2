"""The frozen form of a recording: replay at the cost of the bare enqueue calls."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from itertools import starmap
from typing import Any

import pyopencl as cl
import pyopencl._cl as _cl

from netcl.core.tensor import Tensor
from netcl.runtime.capture._recording import KernelOp, TransferOp

__all__ = ["ReplayProgram"]

# The driver entry point itself: bound once, never the interception hook.
_enqueue_nd_range_kernel = _cl.enqueue_nd_range_kernel
# The unhooked setter, so that rebinding inside another capture's recording is not noted there.
_set_arg = cl.Kernel.__dict__["set_arg"]

# A run of the program: (callable, argument tuples). A run of plain launches is one segment
# driven by ``starmap`` in C, so Python does no work per launch; anything else is a
# partial called once.
_Segment = tuple[Callable[..., Any], list[tuple[Any, ...]]]


class ReplayProgram:
    """Launches and transfers of one capture, with every argument bound once.

    Holds the recorded buffers, kernels and host arrays alive for as long as it exists.
    """

    def __init__(self, ops: list[KernelOp | TransferOp]) -> None:
        self.ops = tuple(ops)
        self.num_launches = sum(isinstance(op, KernelOp) for op in ops)
        self.num_commands = len(ops)
        self.opaque_launches = tuple(
            op.record.kernel_name for op in ops if isinstance(op, KernelOp) and not op.known_args
        )
        self._segments = _merge([self._segment_of(i) for i in range(len(ops))])
        # int_ptr -> (buffer, its kernel arguments, the transfers using it)
        self.buffers: dict[int, tuple[cl.MemoryObjectHolder, list[tuple[cl.Kernel, int]],
                                      list[int]]] = {}
        for i, op in enumerate(ops):
            for where, buf in op.buffers:
                entry = self.buffers.setdefault(buf.int_ptr, (buf, [], []))
                if isinstance(op, KernelOp):
                    assert isinstance(where, int)
                    entry[1].append((op.kernel, where))
                elif i not in entry[2]:
                    entry[2].append(i)

    def _segment_of(self, i: int) -> _Segment:
        op = self.ops[i]
        if isinstance(op, KernelOp):
            r = op.record
            call = (r.queue, op.kernel, r.global_size, r.local_size, r.offset)
            if not op.flags:
                return (_enqueue_nd_range_kernel, [call])
            return (partial(_enqueue_nd_range_kernel, *call, **op.flags), [()])
        return (partial(op.fn, *op.args, **op.kwargs), [()])

    def run(self) -> cl.Event | None:
        return _run(self._segments)

    def validate(self, buffer_map: Mapping[int, Any]) -> dict[int, cl.MemoryObjectHolder]:
        """Check a rebinding map; raise before anything is enqueued. Returns int_ptr -> buffer."""
        subst: dict[int, cl.MemoryObjectHolder] = {}
        for key, value in buffer_map.items():
            if isinstance(key, bool) or not isinstance(key, int):
                raise TypeError(
                    "KernelCapture.replay_with_new_buffers: keys must be cl.Buffer.int_ptr "
                    f"values (int), got {type(key).__name__} {key!r}"
                )
            entry = self.buffers.get(key)
            if entry is None:
                known = ", ".join(hex(k) for k in list(self.buffers)[:8]) or "none"
                raise ValueError(
                    f"KernelCapture.replay_with_new_buffers: key {key:#x} matches no buffer "
                    f"of the recorded arguments (recorded buffers: {known}"
                    f"{', ...' if len(self.buffers) > 8 else ''})"
                )
            new = value.buffer if isinstance(value, Tensor) else value
            if not isinstance(new, cl.MemoryObjectHolder):
                raise TypeError(
                    f"KernelCapture.replay_with_new_buffers: the replacement for {key:#x} "
                    f"must be a cl.Buffer (or Tensor), got {type(value).__name__}"
                )
            old_size, new_size = int(entry[0].size), int(new.size)
            if new_size < old_size:
                raise ValueError(
                    f"KernelCapture.replay_with_new_buffers: the replacement for {key:#x} "
                    f"holds {new_size} bytes, but the recorded buffer holds {old_size}"
                )
            subst[key] = new
        return subst

    def run_rebound(self, subst: dict[int, cl.MemoryObjectHolder]) -> cl.Event | None:
        """One run with buffers substituted; the recorded arguments are back afterwards.

        OpenCL takes a kernel's argument values at enqueue time, so setting an argument,
        enqueuing, and setting it back leaves the enqueued launch with the substitute.
        """
        if not subst:
            return self.run()
        segments = self._segments
        touched: list[tuple[cl.Kernel, int, cl.MemoryObjectHolder, cl.MemoryObjectHolder]] = []
        transfers: set[int] = set()
        for key, new in subst.items():
            old, args, ops = self.buffers[key]
            touched += [(k, i, old, new) for k, i in args]
            transfers.update(ops)
        if transfers:
            segments = self._rebound_segments(subst, transfers)
        try:
            for kernel, index, _, new in touched:
                _set_arg(kernel, index, new)
            return _run(segments)
        finally:
            for kernel, index, old, _ in touched:
                _set_arg(kernel, index, old)

    def _rebound_segments(
        self, subst: dict[int, cl.MemoryObjectHolder], transfers: set[int]
    ) -> list[_Segment]:
        segments: list[_Segment] = []
        for i, op in enumerate(self.ops):
            if i in transfers:
                assert isinstance(op, TransferOp)
                args = list(op.args)
                kwargs = dict(op.kwargs)
                for where, buf in op.buffers:
                    new = subst.get(buf.int_ptr)
                    if new is None:
                        continue
                    if isinstance(where, int):
                        args[where] = new
                    else:
                        kwargs[where] = new
                segments.append((partial(op.fn, *args, **kwargs), [()]))
            else:
                segments.append(self._segment_of(i))
        return _merge(segments)


def _run(segments: list[_Segment]) -> cl.Event | None:
    """Enqueue every segment in order; the last command's event (None if there are none)."""
    last: deque[Any] | None = None
    for fn, calls in segments:
        last = deque(starmap(fn, calls), 1)
    return last[0] if last else None


def _merge(segments: list[_Segment]) -> list[_Segment]:
    """Join consecutive plain launches into one starmap segment."""
    merged: list[_Segment] = []
    for fn, calls in segments:
        if merged and fn is _enqueue_nd_range_kernel and merged[-1][0] is fn:
            merged[-1][1].extend(calls)
        else:
            merged.append((fn, list(calls)))
    return merged
