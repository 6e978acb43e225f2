"""The frozen form of a recording and its hot loops: replay at the cost of the bare enqueues.

``build`` turns a ``Recording`` into a ``ReplayProgram`` once, in ``end()``. Every launch gets
a kernel object holding its arguments (``Binder``): one per distinct (kernel, argument set), so
200 identical launches share one; each a ``clone()`` of the kernel as its first recorded launch
left it, with every argument set in the capture re-applied (a clone alone drops NULL arguments
on some drivers), or where the driver cannot clone, a fresh kernel of the same program.

A capture on one in-order queue is cut into segments: consecutive plain launches are one,
driven by ``itertools.starmap`` over the driver entry point (no Python work per launch); a
copy, fill or launch with keywords is a pre-bound ``functools.partial``. Anything else (queues,
an out-of-order queue, contexts) is issued command by command as its ``Schedule``
(``_ordering``) says. A replay calls pyopencl's driver entry points, never a capture hook.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from itertools import chain, starmap
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import contract, device
from netcl.runtime.capture import _memory
from netcl.runtime.capture._memory import Arena, SharedArena
from netcl.runtime.capture._ordering import Schedule, schedule
from netcl.runtime.capture._rebind import BufferIndex
from netcl.runtime.capture._recording import (
    ArgSet,
    LaunchShape,
    Op,
    RawFinish,
    RawHostWait,
    RawLaunch,
    RawTransfer,
    Recording,
    _new,
    buffers_of,
    launch_sizes,
)

__all__ = ["BoundLaunch", "ReplayProgram", "build"]

_enqueue = contract.enqueue_nd_range_kernel
_set_arg = contract.set_arg
_finish = contract.finish
_flush = contract.flush
_marker = contract.marker
_wait = contract.wait_for_events

# (callable, argument tuples): a run of plain launches, or one call
Segment = tuple[Callable[..., Any], list[tuple[Any, ...]]]
Subst = Mapping[int, cl.MemoryObjectHolder]  # recorded int_ptr -> this replay's buffer


class BoundLaunch:
    """What the launches of one ``LaunchShape`` share: the replay kernel, the enqueue call and
    keywords, the buffers among its arguments."""

    __slots__ = ("buffers", "call", "flags", "kernel", "name")

    def __init__(
        self,
        shape: LaunchShape,
        kernel: cl.Kernel,
        buffers: tuple[tuple[int, cl.MemoryObjectHolder], ...],
    ) -> None:
        self.kernel = kernel
        self.name: str = shape.kernel.function_name
        self.flags = {"allow_empty_ndrange": True} if shape.allow_empty else {}
        self.buffers = buffers  # (argument index, buffer) of every memory object argument
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
        if (replica := self._replicas.get(key)) is None:
            clone = self._clones.get(id(kernel))
            replica = self._replicas[key] = _replicate(kernel, clone, snap, known)
        if (buffers := self._buffers.get(id(snap))) is None:
            buffers = self._buffers[id(snap)] = buffers_of(snap)
        self.by_shape[id(shape)] = BoundLaunch(shape, replica, buffers)


_PLAIN = (int, float, bytes, str)


def _value_key(value: Any) -> Any:
    kind = type(value)  # exact types first: payloads are tuples of ints and a value
    if kind is tuple:
        return tuple(map(_value_key, value))
    if kind in _PLAIN or value is None:  # a float by its bits: -0.0 == 0.0 == 0, not to a kernel
        return ("float", value.hex()) if kind is float else value
    if isinstance(value, cl.MemoryObjectHolder):
        return ("mem", id(value))  # the recording's own reference, one per buffer
    if isinstance(value, cl.LocalMemory):
        return ("local", value.size)
    if isinstance(value, (np.ndarray, np.generic)):
        return ("np", value.dtype.str, value.tobytes())
    if isinstance(value, _PLAIN):  # subclasses (bool)
        return value
    if isinstance(value, tuple):
        return tuple(map(_value_key, value))
    return ("id", id(value))  # held alive by the recording


def _replicate(
    kernel: cl.Kernel, template: cl.Kernel | None, snap: tuple[ArgSet, ...], known: bool
) -> cl.Kernel:
    """A kernel object of its own holding the arguments of one recorded launch (see above)."""
    if template is not None:
        replica = template.clone()
    elif known:
        replica = cl.Kernel(kernel.program, kernel.function_name)
    else:
        raise RuntimeError(
            f"KernelCapture: cannot record kernel {kernel.function_name!r}: the "
            f"device cannot clone kernels and only {len(snap)} of its "
            f"{kernel.num_args} arguments were set inside the capture; pass the "
            "arguments in the call"
        )
    for arg in snap:
        arg.setter(replica, *arg.payload)
    return replica


class ReplayProgram:
    """Launches and transfers of one capture, every argument bound once; holds the recorded
    buffers (its own OpenCL references), kernels and host arrays alive."""

    def __init__(
        self,
        ops: list[Op],
        binds: Binds,
        plan: Schedule | None,
        opaque: tuple[str, ...],
        queues: tuple[cl.CommandQueue, ...],
        arena: Arena,
    ) -> None:
        self.ops = tuple(ops)
        self.binds = binds
        self.plan = plan  # None: one in-order queue, where queue order is every dependency there is
        self.num_launches = sum(type(op) is RawLaunch for op in self.ops)
        # a finish enqueues no command
        self.num_commands = len(ops) - sum(type(op) is RawFinish for op in self.ops)
        self.opaque_launches = opaque  # kernels launched with arguments set before begin()
        self._segments = _segments(self.ops, binds, {}) if plan is None else []
        # where device time watches every queue of the capture, the collector replays hand
        # events to (decided once here; a queue's properties never change)
        self.collector = device.watcher(*queues)
        self.queue = queues[0] if len(queues) == 1 else None  # for the device-time collector
        device.finish_at_exit(self, queues)
        # the device-time label of each command a replay enqueues (a finish enqueues none)
        self.labels: tuple[str, ...] = ()
        if self.collector is not None:
            self.labels = tuple(
                binds[id(op.shape)].name if isinstance(op, RawLaunch) else op.entry.operation
                for op in self.ops
                if isinstance(op, (RawLaunch, RawTransfer))
            )
        self._index: BufferIndex | None = None
        # a pool was in checked mode at end(): replays go command by command, checking guards
        self.checker = device.checker()
        self.arena = arena  # the capture's own memory

    def rebase(self, old: cl.Buffer, new: cl.Buffer) -> None:
        """Move the regions of ``old`` (a shared arena that grew) this program uses onto the
        same places in ``new``: its replay kernels' arguments, its transfers, its segments."""
        base = contract.mem_ptr(old)
        moved: dict[int, cl.MemoryObjectHolder] = {}
        for ptr, use in self.index.uses.items():
            parent = use.buffer.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)
            if parent is None or contract.mem_ptr(parent) != base:
                continue
            region = moved[ptr] = new.get_sub_region(
                int(use.buffer.get_info(cl.mem_info.OFFSET)), int(use.buffer.size)
            )
            for kernel, index in use.kernel_args:
                _set_arg(kernel, index, region)
        if not moved:
            return
        for bound in self.binds.values():
            bound.buffers = tuple((i, moved.get(contract.mem_ptr(b), b)) for i, b in bound.buffers)
        ops = list(self.ops)
        shapes = _memory.relocate(ops, moved)  # nothing may hold the old arena's regions
        self.binds = {id(shapes[k]) if k in shapes else k: b for k, b in self.binds.items()}
        self.ops = tuple(ops)
        if self.plan is None:
            self._segments = _segments(self.ops, self.binds, {})
        self._index = None
        self.arena = replace(
            self.arena, buffers=tuple(new if b is old else b for b in self.arena.buffers)
        )

    @property
    def index(self) -> BufferIndex:
        """Every recorded buffer with its uses (made on first use)."""
        if self._index is None:
            self._index = BufferIndex(self.ops, self.binds)
        return self._index

    def run(
        self, subst: Subst | None = None, keep: list[Any] | None = None, *, ends: bool = False
    ) -> cl.Event | None:
        """Enqueue the recorded commands with buffers substituted (a map ``index.validate``
        returned); an event that completes when all of them have (None if there are none).
        ``keep`` (a profiled replay) gets every command's event, in the order of ``labels``, or
        with ``ends`` on one in-order queue, the first and the last (a summary's). In checked
        mode (``checker``) they are enqueued one at a time, each followed by ``check``.
        OpenCL takes a kernel's arguments at enqueue time: an argument set, enqueued with and
        set back leaves the launch with the substitute and the recorded arguments in place."""
        checker = self.checker
        if not subst and checker is None and self.plan is None:
            # the common replay, plain or profiled: the prepared segments and nothing to set up
            # (the set-up below was ~1 µs of a 16-launch replay's ~15)
            return _issue(self._segments, keep, ends)
        subst = subst or {}
        touched: list[tuple[cl.Kernel, int, cl.MemoryObjectHolder, cl.MemoryObjectHolder]] = []
        transfers = False
        for key, new in subst.items():
            use = self.index.uses[key]
            touched += [(kernel, index, use.buffer, new) for kernel, index in use.kernel_args]
            transfers = transfers or use.transfers
        try:
            for kernel, index, _, new in touched:
                _set_arg(kernel, index, new)
            after = None
            if checker is not None:
                self.refill(checker, subst)
                after = partial(self.check, checker=checker, subst=subst)
            if self.plan is not None:
                return _run_scheduled(self.ops, self.binds, self.plan, subst, keep, after)
            if after is not None:
                event = None
                for i, op in enumerate(self.ops):
                    for fn, calls in _segments((op,), self.binds, subst):
                        event = fn(*calls[0])
                        if keep is not None:
                            keep.append(event)
                    after(i, event)
                return event
            return _issue(
                _segments(self.ops, self.binds, subst) if transfers else self._segments, keep, ends
            )
        finally:
            for kernel, index, old, _ in touched:
                _set_arg(kernel, index, old)

    @staticmethod
    def _guarded(
        checker: device.Checking, subst: Subst, bufs: Iterable[cl.MemoryObjectHolder]
    ) -> Iterator[tuple[Any, Any, Any, str]]:
        """The checked pool blocks among ``bufs`` (recorded buffers), as ``subst`` maps them."""
        for buf in bufs:
            ptr = contract.mem_ptr(buf)
            new = subst.get(ptr)
            found = checker.guarded(ptr if new is None else contract.mem_ptr(new))
            if found is not None:
                yield found

    def refill(self, checker: device.Checking, subst: Subst) -> None:
        """Checked mode, before a replay: fill the guards of the checked pool blocks it uses
        afresh, so that a damaged one names this replay's command."""
        used = [u.buffer for u in self.index.uses.values()]
        for pool, block, guard, _ in self._guarded(checker, subst, used):
            guard.fill(pool.queue, block)
            _finish(pool.queue)  # filled before the replay's first command runs

    def check(self, i: int, event: cl.Event | None, checker: device.Checking, subst: Subst) -> None:
        """Checked mode, after recorded command ``i``: wait for it, then check the guards of the
        checked pool blocks it launched on, naming it as the culprit of a damaged one."""
        op = self.ops[i]
        if type(op) is not RawLaunch:
            return  # OpenCL checks a transfer's bounds itself
        if event is not None:
            event.wait()
        bound = self.binds[id(op.shape)]
        culprit = f"KernelCapture.replay: recorded command {i} (kernel {bound.name!r})"
        used = [b for _, b in bound.buffers]
        for pool, block, guard, what in self._guarded(checker, subst, used):
            guard.check(pool.queue, block, culprit, what)


def _issue(segments: list[Segment], keep: list[Any] | None, ends: bool) -> cl.Event | None:
    """Enqueue ``segments``; the last event (None if there are none). ``keep`` gets every
    event, or with ``ends`` the first and the last (a summary's)."""
    events = chain.from_iterable(starmap(fn, calls) for fn, calls in segments)
    if keep is not None and not ends:
        keep += events
        return keep[-1] if keep else None
    first = next(events, None)  # the others are released as they are enqueued
    last = deque(events, 1)
    end = last[0] if last else first
    if keep is not None and first is not None:
        keep += (first, end)
    return end


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
    ops: Sequence[Op],
    binds: Binds,
    plan: Schedule,
    subst: Subst,
    keep: list[Any] | None,
    after: Callable[[int, Any], None] | None,
) -> cl.Event | None:
    """Enqueue every command as its ``Issue`` of ``plan`` says (then ``after(i, its event)``,
    in checked mode); an event that completes when all of them have (None if there are none)."""
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
        if after is not None:
            after(len(events) - 1, event)
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


def build(rec: Recording, shared: SharedArena | None = None) -> ReplayProgram:
    """The replay form of a finished recording, in memory of its own where it can (_memory;
    ``shared``: the arena of the captures it never runs beside)."""
    distinct, ordered = _memory.queues_of(rec.raw)  # the arena's and the replay's
    arena = _memory.plan(rec, distinct, ordered, shared)
    binder = Binder({k: state.clone for k, state in rec.kernels.items()})
    binds = binder.by_shape
    # the replay's commands hold no recorded event: the events only told the order (the plan
    # keeps it), and a capture would otherwise keep one driver event per command alive
    ops: list[Op] = []
    host_waits: list[tuple[int, tuple[cl.Event, ...]]] = []
    shape: Any = None
    for raw in rec.raw:  # once per launch: kept to a few operations for a launch
        if type(raw) is RawLaunch:
            ops.append(_new(RawLaunch, (raw.shape, (), None)))
            if raw.shape is not shape:
                shape = raw.shape
                if id(shape) not in binds:
                    binder.bind(shape)
        elif isinstance(raw, RawHostWait):
            host_waits.append((len(ops), raw.events))
        else:
            ops.append(
                _new(RawTransfer, (raw.entry, raw.fn, raw.args, raw.kwargs, (), None, raw.buffers))
                if type(raw) is RawTransfer
                else raw
            )
    plan = None
    if not ordered:
        # made from the commands as recorded, events included (host waits index them)
        plan = schedule([raw for raw in rec.raw if not isinstance(raw, RawHostWait)], host_waits)
    program = ReplayProgram(ops, binds, plan, tuple(binder.opaque), tuple(distinct.values()), arena)
    if shared is not None and arena.buffers:
        shared.users.add(program)
    return program
