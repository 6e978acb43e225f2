"""The frozen form of a recording and its hot loops: replay at the cost of the bare enqueues.

``build`` turns a ``Recording`` into a ``ReplayProgram`` once, in ``end()``: every launch gets
the kernel object bound for its arguments (``_kernels``). A capture on one in-order queue is
cut into segments: consecutive plain launches are one segment driven by ``itertools.starmap``
over the driver entry point, so Python does no work per launch; a copy, fill or launch with
keywords is a pre-bound ``functools.partial``. Anything else (several queues, an out-of-order
queue, contexts) is issued command by command with the flushes, host waits and wait lists of
its ``Schedule`` (``_ordering``). Every replay calls pyopencl's own driver entry points, never
a capture hook. The buffer index that rebinding needs (``_rebind``) is made on first use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from itertools import starmap
from typing import Any

import pyopencl as cl

from netcl.core import profiling
from netcl.runtime.capture import _contract
from netcl.runtime.capture._kernels import Binder, Binds
from netcl.runtime.capture._ordering import Schedule, schedule
from netcl.runtime.capture._rebind import BufferIndex
from netcl.runtime.capture._recording import (
    Op,
    RawFinish,
    RawHostWait,
    RawLaunch,
    RawTransfer,
    Recording,
)

__all__ = ["ReplayProgram", "build"]

_enqueue = _contract.enqueue_nd_range_kernel
_set_arg = _contract.set_arg
_finish = _contract.finish
_flush = _contract.flush
_marker = _contract.marker
_wait = _contract.wait_for_events
_OUT_OF_ORDER = int(cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)

# (callable, argument tuples): a run of plain launches, or one call
Segment = tuple[Callable[..., Any], list[tuple[Any, ...]]]
Subst = Mapping[int, cl.MemoryObjectHolder]  # recorded int_ptr -> this replay's buffer


class ReplayProgram:
    """Launches and transfers of one capture, with every argument bound once.

    Holds the recorded buffers (its own OpenCL references), kernels and host arrays alive for
    as long as it exists.
    """

    def __init__(
        self, ops: list[Op], binds: Binds, launches: int, plan: Schedule | None,
        opaque: tuple[str, ...], profiled: bool,
    ) -> None:  # fmt: skip
        self.ops = tuple(ops)
        self.binds = binds
        # None: one in-order queue, where queue order is every dependency there is
        self.plan = plan
        self.num_launches = launches
        self.num_commands = sum(type(op) is not RawFinish for op in ops)
        self.opaque_launches = opaque  # kernels launched with arguments set before begin()
        self._segments = _segments(self.ops, binds, {}) if plan is None else []
        # every queue of the capture has profiling: replays keep each command's event for the
        # device-time collector (decided once here; a queue's properties never change)
        self.profiled = profiled
        # the device-time label of each command a replay enqueues (a finish enqueues none):
        # the kernel's function name, or the transfer's operation (``copy_buffer``)
        self.labels = tuple(
            binds[id(op.shape)].name if isinstance(op, RawLaunch) else op.entry.operation
            for op in self.ops if isinstance(op, (RawLaunch, RawTransfer))
        ) if profiled else ()  # fmt: skip
        self._index: BufferIndex | None = None

    @property
    def index(self) -> BufferIndex:
        """Every recorded buffer with its uses (made on first use)."""
        if self._index is None:
            self._index = BufferIndex(self.ops, self.binds)
        return self._index

    def run(self, subst: Subst | None = None, keep: list[Any] | None = None) -> cl.Event | None:
        """Enqueue the recorded commands, with buffers substituted (a map ``validate``
        returned); an event that completes when all of them have (None if there are none).
        ``keep`` (a profiled replay) gets every command's event, in the order of ``labels``.

        OpenCL takes a kernel's argument values at enqueue time, so setting an argument,
        enqueuing, and setting it back leaves the enqueued launch with the substitute and the
        recorded arguments in place afterwards.
        """
        touched: list[tuple[cl.Kernel, int, cl.MemoryObjectHolder, cl.MemoryObjectHolder]] = []
        transfers = False
        for key, new in (subst or {}).items():
            use = self.index.uses[key]
            touched += [(kernel, index, use.buffer, new) for kernel, index in use.kernel_args]
            transfers = transfers or use.transfers
        try:
            for kernel, index, _, new in touched:
                _set_arg(kernel, index, new)
            if self.plan is not None:
                return _run_scheduled(self.ops, self.binds, self.plan, subst or {}, keep)
            found = _segments(self.ops, self.binds, subst or {}) if transfers else self._segments
            if keep is not None:
                for fn, calls in found:
                    keep += starmap(fn, calls)
                return keep[-1] if keep else None
            last: deque[Any] | None = None
            for fn, calls in found:
                last = deque(starmap(fn, calls), 1)
            return last[0] if last else None
        finally:
            for kernel, index, old, _ in touched:
                _set_arg(kernel, index, old)


def _segments(ops: Sequence[Op], binds: Binds, subst: Subst) -> list[Segment]:
    """The segments of a capture on one in-order queue (a finish there orders nothing the
    queue does not: left out)."""
    found: list[Segment] = []
    run: list[tuple[Any, ...]] | None = None  # the current run of plain launches
    shape: Any = None
    bound: Any = None
    for op in ops:
        if type(op) is RawLaunch:
            if op[0] is not shape:  # consecutive launches mostly share their shape
                shape = op[0]
                bound = binds[id(shape)]
            if not bound.flags:
                if run is None:
                    run = []
                    found.append((_enqueue, run))
                run.append(bound.call)
                continue
            found.append((partial(_enqueue, *bound.call, **bound.flags), [()]))
        elif type(op) is RawTransfer:
            args, kwargs = op.substituted(subst)
            found.append((partial(op.fn, *args, **kwargs), [()]))
        else:
            continue
        run = None
    return found


def _run_scheduled(
    ops: Sequence[Op], binds: Binds, plan: Schedule, subst: Subst, keep: list[Any] | None
) -> cl.Event | None:
    """Enqueue every command as its ``Issue`` of ``plan`` says; an event that completes when
    all of them have (None if there are none)."""
    events: list[Any] = []
    for op, issue in zip(ops, plan.issues, strict=True):
        for queue in issue.flushes:
            _flush(queue)
        for group in issue.host:  # another context's commands this one comes after
            _wait([events[d] for d in group])
        wait = [events[d] for d in issue.deps] or None
        if type(op) is RawLaunch:
            bound = binds[id(op.shape)]
            event = _enqueue(*bound.call, wait, False, bool(bound.flags))
        elif type(op) is RawTransfer:
            args, kwargs = op.substituted(subst)
            if wait is not None and op.entry.wait_for < len(args):
                args = (*args[: op.entry.wait_for], wait, *args[op.entry.wait_for + 1 :])
            elif wait is not None:
                kwargs = {**kwargs, "wait_for": wait}
            event = op.fn(*args, **kwargs)
        else:
            _finish(op.queue)
            event = None
        events.append(event)
    if keep is not None:  # once per replay; only a finish has no event
        keep += [e for e in events if e is not None]
    if plan.final_queue is None:
        return None
    for queue in plan.final_flushes:
        _flush(queue)
    done = _marker(plan.final_queue, [events[i] for i in plan.final_sinks])
    if plan.other_sinks:
        _flush(plan.final_queue)  # its work runs while this thread waits for the others
        for group in plan.other_sinks:
            _wait([events[i] for i in group])
    return done


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
                    binder.bind(shape)
                    queues[id(shape.queue)] = shape.queue
        elif isinstance(raw, RawHostWait):
            host_waits.append((len(ops), raw.events))
        else:
            queues[id(raw.queue)] = raw.queue
            ops.append(raw)
    distinct = {_contract.queue_ptr(q): q for q in queues.values()}
    ordered = len(distinct) <= 1 and not any(
        int(q.properties) & _OUT_OF_ORDER for q in distinct.values()
    )
    profiled = bool(distinct) and all(profiling.enabled(q) for q in distinct.values())
    plan = None if ordered else schedule(ops, host_waits)
    return ReplayProgram(ops, binds, launches, plan, tuple(binder.opaque), profiled)
