"""The frozen form of a recording: replay at the cost of the bare enqueue calls.

``build`` turns a ``Recording`` into a ``ReplayProgram`` once, in ``end()``: every launch gets
the kernel object bound for its arguments (``_kernels``), a capture on one in-order queue is cut
into segments (``_execute``), anything else gets a ``Schedule`` (``_ordering``). The buffer
index that rebinding needs (``_rebind``) is made on the first rebinding replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyopencl as cl

from netcl.core import profiling
from netcl.runtime.capture import _contract
from netcl.runtime.capture._execute import run_scheduled, run_segments, run_segments_kept, segments
from netcl.runtime.capture._kernels import Binder, BoundLaunch
from netcl.runtime.capture._ops import Op, TransferOp
from netcl.runtime.capture._ordering import Schedule, schedule
from netcl.runtime.capture._rebind import BufferIndex, BufferUse
from netcl.runtime.capture._recording import RawFinish, RawHostWait, RawLaunch, Recording

__all__ = ["ReplayProgram", "build"]

_set_arg = _contract.set_arg
_OUT_OF_ORDER = int(cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)


class ReplayProgram:
    """Launches and transfers of one capture, with every argument bound once.

    Holds the recorded buffers (its own OpenCL references), kernels and host arrays alive for
    as long as it exists.
    """

    def __init__(
        self, ops: list[Op], binds: dict[int, BoundLaunch], launches: int,
        plan: Schedule | None, opaque: tuple[str, ...], profiled: bool = False,
    ) -> None:  # fmt: skip
        self.ops = tuple(ops)
        self.binds = binds  # id(LaunchShape) -> BoundLaunch
        # None: one in-order queue, where queue order is every dependency there is
        self.plan = plan
        self.ordered = plan is None
        self.num_launches = launches
        self.num_commands = len(ops) - sum(1 for op in ops if type(op) is RawFinish)
        self.opaque_launches = opaque  # kernels launched with arguments set before begin()
        self._segments = segments(self.ops, binds) if plan is None else []
        # every queue of the capture has profiling: replays keep each command's event for the
        # device-time collector (decided once here; a queue's properties never change)
        self.profiled = profiled
        # the device-time label of each command (kernel function name, or the transfer's
        # operation), in the order a replay enqueues them (a finish enqueues nothing)
        self.labels = _labels(self.ops, binds) if profiled else ()
        self._index: BufferIndex | None = None

    @property
    def index(self) -> BufferIndex:
        """Every recorded buffer with its uses (made on first use)."""
        if self._index is None:
            self._index = BufferIndex(self.ops, self.binds)
        return self._index

    @property
    def buffers(self) -> dict[int, BufferUse]:
        """Recorded buffers by ``int_ptr``."""
        return self.index.uses

    def run(self) -> cl.Event | None:
        """Enqueue the recorded commands; an event that completes when all of them have."""
        if self.plan is None:
            return run_segments(self._segments)
        return run_scheduled(self.ops, self.binds, self.plan, {})

    def run_kept(
        self, subst: Mapping[int, cl.MemoryObjectHolder] | None, keep: list[Any]
    ) -> cl.Event | None:
        """``run`` (or ``run_rebound`` with ``subst``) keeping every command's event in
        ``keep``, in the order of :attr:`labels`: the profiled replay."""
        if subst:
            return self.run_rebound(subst, keep)
        if self.plan is None:
            return run_segments_kept(self._segments, keep)
        return run_scheduled(self.ops, self.binds, self.plan, {}, keep)

    def validate(self, buffer_map: Mapping[int, Any]) -> dict[int, cl.MemoryObjectHolder]:
        """Check a substitution map (see ``BufferIndex.validate``) before anything runs."""
        return self.index.validate(buffer_map)

    def run_rebound(
        self, subst: Mapping[int, cl.MemoryObjectHolder], keep: list[Any] | None = None
    ) -> cl.Event | None:
        """One run with buffers substituted (a map ``validate`` returned); the recorded
        arguments are back afterwards.

        OpenCL takes a kernel's argument values at enqueue time, so setting an argument,
        enqueuing, and setting it back leaves the enqueued launch with the substitute.
        """
        if not subst:
            return self.run() if keep is None else self.run_kept(None, keep)
        touched: list[tuple[cl.Kernel, int, cl.MemoryObjectHolder, cl.MemoryObjectHolder]] = []
        transfers = False
        for key, new in subst.items():
            use = self.index.uses[key]
            touched += [(k, i, use.buffer, new) for k, i in use.kernel_args]
            transfers = transfers or use.transfers
        try:
            for kernel, index, _, new in touched:
                _set_arg(kernel, index, new)
            if self.plan is not None:
                return run_scheduled(self.ops, self.binds, self.plan, subst, keep)
            found = segments(self.ops, self.binds, subst) if transfers else self._segments
            return run_segments(found) if keep is None else run_segments_kept(found, keep)
        finally:
            for kernel, index, old, _ in touched:
                _set_arg(kernel, index, old)


def _labels(ops: tuple[Op, ...], binds: dict[int, BoundLaunch]) -> tuple[str, ...]:
    """The device-time label of each command a replay enqueues (a finish enqueues none): the
    kernel's function name, or the transfer's operation (``copy_buffer``, ``fill_buffer``)."""
    found: list[str] = []
    for op in ops:
        if isinstance(op, RawLaunch):
            found.append(binds[id(op.shape)].name)
        elif isinstance(op, TransferOp):
            found.append(op.entry.operation)
    return tuple(found)


def build(rec: Recording) -> ReplayProgram:
    """The replay form of a finished recording."""
    binder = Binder(rec.clones())
    binds = binder.by_shape
    ops: list[Op] = []
    host_waits: list[tuple[int, tuple[cl.Event, ...]]] = []
    queues: dict[int, cl.CommandQueue] = {}
    launches = 0
    shape: Any = None
    for raw in rec.raw:  # once per launch: kept to a few operations for a launch
        if type(raw) is RawLaunch:
            ops.append(raw)
            launches += 1
            if raw[0] is not shape:
                shape = raw[0]
                if id(shape) not in binds:
                    queues[id(shape.queue)] = binder.bind(shape).queue
        elif isinstance(raw, RawHostWait):
            host_waits.append((len(ops), raw.events))
        else:
            op = raw if isinstance(raw, RawFinish) else TransferOp(raw)  # type: ignore[arg-type]
            queues[id(op.queue)] = op.queue
            ops.append(op)
    distinct = {_contract.queue_ptr(q): q for q in queues.values()}
    ordered = len(distinct) <= 1 and not any(
        int(q.properties) & _OUT_OF_ORDER for q in distinct.values()
    )
    profiled = bool(distinct) and all(profiling.enabled(q) for q in distinct.values())
    plan = None
    if not ordered:
        recorded = [op.raw if isinstance(op, TransferOp) else op for op in ops]
        waits = [() if isinstance(r, RawFinish) else r.wait_for for r in recorded]
        events = [None if isinstance(r, RawFinish) else r.event for r in recorded]
        plan = schedule(ops, waits, events, host_waits)
    return ReplayProgram(ops, binds, launches, plan, binder.opaque(), profiled)
