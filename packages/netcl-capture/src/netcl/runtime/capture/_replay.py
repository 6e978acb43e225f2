"""The frozen form of a recording: replay at the cost of the bare enqueue calls.

``build`` turns a ``Recording`` into a ``ReplayProgram`` once, in ``end()``:

- every launch gets a kernel object of its own holding exactly the arguments the launch used
  (one kernel per distinct (kernel, argument set): 200 identical launches share one). It is a
  ``clone()`` of the launched kernel with every argument set during the capture re-applied (a
  clone alone drops NULL arguments on some drivers), or, where the driver cannot clone, a fresh
  kernel of the same program with all arguments re-applied;
- on one in-order queue, consecutive launches are one ``itertools.starmap`` run over the driver
  entry point (no Python work per launch) and recorded waits are implied by queue order;
- with several queues or an out-of-order queue, every command gets the replay events of the
  commands it waited on in the recording (``wait_for`` mapped from recorded events to this
  replay's events), and recorded ``finish()`` calls are repeated.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import starmap
from types import MappingProxyType
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl._cl as _cl

from netcl.core.tensor import Tensor
from netcl.runtime.capture._intercept import ORIGINALS
from netcl.runtime.capture._recording import ArgSet, Recording
from netcl.runtime.capture._records import CapturedLaunch, CapturedTransfer

__all__ = ["KernelOp", "ReplayProgram", "TransferOp", "build", "launch_record", "transfer_record"]

# The driver entry points themselves, never an interception hook.
_enqueue_nd_range_kernel = ORIGINALS[(_cl, "enqueue_nd_range_kernel")]
_set_arg = ORIGINALS[(cl.Kernel, "set_arg")]
_finish = ORIGINALS[(cl.CommandQueue, "finish")]
_marker = ORIGINALS[(_cl, "_enqueue_marker_with_wait_list")]
_flush = cl.CommandQueue.flush  # never intercepted
_OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE

# A run of the program: (callable, argument tuples). A run of plain launches is one segment
# driven by ``starmap`` in C, so Python does no work per launch; anything else is a
# partial called once.
_Segment = tuple[Callable[..., Any], list[tuple[Any, ...]]]


class KernelOp:
    """A launch frozen for replay: a kernel object of its own, arguments bound once.

    Four slots (``end()`` makes one per launch, so it must cost about a tuple): the raw
    recorded launch, what it shares with every launch of the same kernel, argument table and
    sizes, its dependencies, and the read-only ``record`` made on first access.
    """

    __slots__ = ("_record", "deps", "item", "shared")

    def __init__(self, item: tuple[Any, ...], shared: _Shared) -> None:
        self.item = item
        # (replica kernel, enqueue flags, (argument index, buffer) pairs, every argument known,
        # (global size, local size, offset))
        self.shared = shared
        self.deps: tuple[int, ...] = ()
        self._record: CapturedLaunch | None = None

    @property
    def record(self) -> CapturedLaunch:
        if self._record is None:
            self._record = launch_record(self.item)
        return self._record

    @property
    def queue(self) -> cl.CommandQueue:
        return self.item[1]

    @property
    def kernel(self) -> cl.Kernel:
        return self.shared[0]

    @property
    def buffers(self) -> tuple[tuple[int, cl.MemoryObjectHolder], ...]:
        return self.shared[2]

    @property
    def known_args(self) -> bool:
        return self.shared[3]

    def call(self) -> tuple[Any, ...]:
        """(queue, kernel, global size, local size, offset) for enqueue_nd_range_kernel."""
        return (self.item[1], self.shared[0], *self.shared[4])


_Shared = tuple[cl.Kernel, dict[str, Any], tuple[tuple[int, cl.MemoryObjectHolder], ...], bool,
                tuple[Any, Any, Any]]


@dataclass
class TransferOp:
    """A copy, fill, marker or barrier frozen for replay: pyopencl's primitive and arguments."""

    record: CapturedTransfer
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    # (position or keyword, buffer) of every memory object among the arguments
    buffers: tuple[tuple[int | str, cl.MemoryObjectHolder], ...]
    wait_pos: int = -1
    deps: tuple[int, ...] = ()


@dataclass
class FinishOp:
    """A recorded ``queue.finish()`` (replayed only when the capture spans queues or is
    out of order)."""

    queue: cl.CommandQueue
    deps: tuple[int, ...] = ()
    buffers: tuple[tuple[int | str, cl.MemoryObjectHolder], ...] = ()


Op = KernelOp | TransferOp | FinishOp
_NO_FLAGS: dict[str, Any] = {}
_EMPTY_NDRANGE: dict[str, Any] = {"allow_empty_ndrange": True}


def build(rec: Recording) -> ReplayProgram:
    """The replay form of a finished recording."""
    ops: list[Op] = []
    events: list[Any] = []
    waits: list[tuple[Any, ...]] = []
    # (index of the first op issued after it, the events) of every host-side wait
    host_waits: list[tuple[int, tuple[cl.Event, ...]]] = []
    # id(kernel) -> its clone from the first launch (see Recording.kernels)
    replicas: dict[Any, Any] = {k: entry[4] for k, entry in rec.kernels.items()}
    num_args: dict[int, int] = {}
    for kind, item in rec.raw:
        if kind == "k":
            ops.append(_kernel_op(item, replicas, num_args))
            waits.append(item[7])
            events.append(item[8])
        elif kind == "t":
            _, fn, wait_pos, pos, kw, waited, event = item
            buffers: list[tuple[int | str, cl.MemoryObjectHolder]] = [
                (i, a) for i, a in enumerate(pos) if isinstance(a, cl.MemoryObjectHolder)
            ]
            buffers += [(k, v) for k, v in kw.items() if isinstance(v, cl.MemoryObjectHolder)]
            ops.append(TransferOp(transfer_record(item), fn, pos, kw, tuple(buffers), wait_pos))
            waits.append(waited)
            events.append(event)
        elif kind == "w":
            host_waits.append((len(ops), item))
        else:
            ops.append(FinishOp(item))
            waits.append(())
            events.append(None)
    program = ReplayProgram(ops)
    if not program.ordered:  # on one in-order queue, queue order is every dependency
        _link(program, events, waits, host_waits)
    return program


def _link(
    program: ReplayProgram,
    events: list[Any],
    waits: list[tuple[Any, ...]],
    host_waits: list[tuple[int, tuple[cl.Event, ...]]],
) -> None:
    """Dependencies and flushes of a capture spanning queues (or out of order).

    A command depends on the recorded commands whose events it waited on, and on those whose
    events the host waited on before issuing it (the host wait ordered them in the recording;
    nothing orders them in a replay that does not wait on the host). A command on an in-order
    queue takes a host wait's dependencies once: later commands there follow it anyway.
    OpenCL requires a queue to be flushed before a command of another queue waits on its
    events, so the queue of such a dependency is flushed first (once per run of commands).
    """
    ops = program.ops
    producer = {ev.int_ptr: i for i, ev in enumerate(events) if isinstance(ev, cl.Event)}
    queues = [_queue_of(op).int_ptr for op in ops]
    in_order: dict[int, bool] = {}
    fences: list[int] = []  # producers of host-waited events, in order of the waits
    fenced: dict[int, int] = {}  # in-order queue -> how many fences its commands wait for
    pending = deque(host_waits)
    dirty: dict[int, cl.CommandQueue] = {}  # queues with commands issued since their flush
    flushes: list[tuple[cl.CommandQueue, ...]] = []
    for i, op in enumerate(ops):
        while pending and pending[0][0] <= i:
            at, waited = pending.popleft()
            fences += [d for d in (producer.get(e.int_ptr, -1) for e in waited) if 0 <= d < at]
        queue = _queue_of(op)
        key = queues[i]
        if isinstance(op, FinishOp):  # replayed as a host-side finish: it flushes its queue
            dirty.pop(key, None)
            flushes.append(())
            continue
        deps = {producer.get(w.int_ptr, -1) for w in waits[i] if isinstance(w, cl.Event)}
        ordered = in_order.get(key)
        if ordered is None:
            ordered = in_order[key] = not int(queue.properties) & int(_OUT_OF_ORDER)
        if ordered:
            deps.update(d for d in fences[fenced.get(key, 0):] if queues[d] != key)
            fenced[key] = len(fences)
        else:
            deps.update(fences)
        op.deps = tuple(sorted(d for d in deps if 0 <= d < i))
        program._waited.update(op.deps)
        flushes.append(tuple(dirty.pop(queues[d]) for d in op.deps if queues[d] in dirty
                             and queues[d] != key))
        dirty[key] = queue
    program._flushes = tuple(flushes)
    # the returned marker waits on commands of every queue: flush the others
    last = next((_queue_of(op) for op in reversed(ops) if not isinstance(op, FinishOp)), None)
    program._final_flushes = tuple(
        q for k, q in dirty.items() if last is not None and k != last.int_ptr
    )


def _kernel_op(item: tuple[Any, ...], replicas: dict[Any, Any],
               num_args: dict[int, int]) -> KernelOp:
    kernel, snap = item[0], item[9]
    # launches with the same argument table share its snapshot object, and a loop's launches
    # the same size tuples: one lookup per launch in the common case
    shape = (id(snap), id(item[2]), id(item[3]), id(item[4]), item[5], item[6])
    found = replicas.get(shape)
    if found is None:
        n = num_args.get(id(kernel))
        if n is None:
            n = num_args[id(kernel)] = kernel.num_args
        known = len(snap) >= n
        key = (id(kernel), tuple(_arg_key(a) for a in snap))
        replica = replicas.get(key)
        if replica is None:
            replica = replicas[key] = _replicate(kernel, replicas.get(id(kernel)), snap, known)
        buffers = replicas.get(id(snap))
        if buffers is None:
            buffers = replicas[id(snap)] = tuple(
                (index, value)
                for index, _, payload in snap
                for value in _flat_values(payload)
                if isinstance(value, cl.MemoryObjectHolder)
            )
        flags = _EMPTY_NDRANGE if item[6] else _NO_FLAGS
        found = replicas[shape] = (replica, flags, buffers, known, _sizes(item))
    return KernelOp(item, found)


def _sizes(item: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    gws, lws, offset, g_times_l = item[2], item[3], item[4], item[5]
    gsize = _dims(gws)
    lsize = None if lws is None else _dims(lws)
    if g_times_l and lsize is not None:
        gsize = tuple(g * ls for g, ls in zip(gsize, lsize, strict=True))
    return gsize, lsize, None if offset is None else _dims(offset)


def launch_record(item: tuple[Any, ...]) -> CapturedLaunch:
    """The read-only record of a raw recorded launch."""
    gsize, lsize, offset = _sizes(item)
    return CapturedLaunch(
        kernel_name=item[0].function_name,
        queue=item[1],
        global_size=gsize,
        local_size=lsize,
        offset=offset,
        args=tuple(item[10]) if item[10] is not None else (),
    )


def transfer_record(item: tuple[Any, ...]) -> CapturedTransfer:
    """The read-only record of a raw recorded transfer."""
    name, _, _, pos, kw, _, _ = item
    return CapturedTransfer(
        operation=name.removeprefix("_enqueue_"),
        queue=pos[0] if pos else kw.get("queue"),
        args=pos,
        kwargs=MappingProxyType(dict(kw)),
    )


def _flat_values(payload: tuple[Any, ...]) -> Iterator[Any]:
    for value in payload:
        if isinstance(value, tuple):
            yield from value
        else:
            yield value


def _value_key(value: Any) -> Any:
    if isinstance(value, cl.MemoryObjectHolder):
        return ("mem", value.int_ptr)  # the recording's own reference: the pointer is stable
    if isinstance(value, cl.LocalMemory):
        return ("local", value.size)
    if isinstance(value, (np.ndarray, np.generic)):
        return ("np", value.dtype.str, value.tobytes())
    if value is None or isinstance(value, (int, float, bytes, str)):
        return value
    if isinstance(value, tuple):
        return tuple(_value_key(v) for v in value)
    return ("id", id(value))  # held alive by the recording


def _arg_key(arg: ArgSet) -> Any:
    index, setter, payload = arg
    return (index, id(setter), _value_key(payload))


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
    for _, setter, payload in snap:
        setter(replica, *payload)
    return replica


def _dims(size: Any) -> tuple[int, ...]:
    if isinstance(size, int):
        return (size,)
    if type(size) is tuple and all(type(s) is int for s in size):
        return size
    return tuple(int(s) for s in size)


class ReplayProgram:
    """Launches and transfers of one capture, with every argument bound once.

    Holds the recorded buffers (its own OpenCL references), kernels and host arrays alive for
    as long as it exists.
    """

    def __init__(self, ops: list[Op]) -> None:
        self.ops = tuple(ops)
        # int_ptr -> (buffer, its kernel arguments, the indices of the ops using it)
        self.buffers: dict[int, tuple[cl.MemoryObjectHolder, dict[tuple[cl.Kernel, int], None],
                                      dict[int, None]]] = {}
        self._needs: dict[int, tuple[int, int, str]] = {}
        launches = finishes = 0
        opaque: list[str] = []
        queues: dict[int, cl.CommandQueue] = {}
        # one pass (it runs per launch in end()). Launches sharing an argument table share its
        # buffers tuple (and replica kernel): indexed once, as validation needs one kernel use
        # per buffer
        seen: set[int] = set()
        for i, op in enumerate(ops):
            kernel_op = type(op) is KernelOp
            if kernel_op:
                launches += 1
                queue = op.item[1]  # type: ignore[union-attr]
                queues[id(queue)] = queue
                if id(op.shared) in seen:  # type: ignore[union-attr]
                    continue
                seen.add(id(op.shared))  # type: ignore[union-attr]
                if not op.known_args:  # type: ignore[union-attr]
                    opaque.append(op.item[0].function_name)  # type: ignore[union-attr]
            else:
                finishes += type(op) is FinishOp
                queues[id(_queue_of(op))] = _queue_of(op)
            for where, buf in op.buffers:
                entry = self.buffers.get(buf.int_ptr)
                if entry is None:
                    entry = self.buffers[buf.int_ptr] = (buf, {}, {})
                if kernel_op:
                    entry[1][(op.kernel, where)] = None  # type: ignore[union-attr, index]
                entry[2][i] = None
        self.num_launches = launches
        self.num_commands = len(ops) - finishes
        self.opaque_launches = tuple(opaque)
        distinct = {q.int_ptr: q for q in queues.values()}
        # one in-order queue: queue order is every dependency there is
        self.ordered = len(distinct) <= 1 and not any(
            int(q.properties) & int(_OUT_OF_ORDER) for q in distinct.values()
        )
        self._segments = self._build_segments({}) if self.ordered else []
        # indices of the commands some later command waits on, the queues to flush before
        # each command, and before the closing marker (set by _link() when not ordered)
        self._waited: set[int] = set()
        self._flushes: tuple[tuple[cl.CommandQueue, ...], ...] = ()
        self._final_flushes: tuple[cl.CommandQueue, ...] = ()

    # -- building the runs -------------------------------------------------------------

    def _build_segments(self, subst: Mapping[int, cl.MemoryObjectHolder]) -> list[_Segment]:
        segments: list[_Segment] = []
        run: list[tuple[Any, ...]] | None = None  # the current run of plain launches
        for op in self.ops:
            if type(op) is KernelOp:
                item, shared = op.item, op.shared
                call = (item[1], shared[0], *shared[4])
                if not shared[1]:
                    if run is None:
                        run = []
                        segments.append((_enqueue_nd_range_kernel, run))
                    run.append(call)
                    continue
                segments.append((partial(_enqueue_nd_range_kernel, *call, **shared[1]), [()]))
            elif type(op) is TransferOp:
                args, kwargs = _substituted(op, subst)
                segments.append((partial(op.fn, *args, **kwargs), [()]))
            else:  # a finish on the only in-order queue orders nothing the queue does not
                continue
            run = None
        return segments

    # -- running -----------------------------------------------------------------------

    def run(self) -> cl.Event | None:
        if self.ordered:
            return _run(self._segments)
        return self._run_with_deps({})

    def _run_with_deps(self, subst: Mapping[int, cl.MemoryObjectHolder]) -> cl.Event | None:
        events: list[Any] = []
        last = None
        for op, flushes in zip(self.ops, self._flushes, strict=True):
            for queue in flushes:
                _flush(queue)
            wait = [e for e in (events[d] for d in op.deps) if e is not None] or None
            if isinstance(op, KernelOp):
                event = _enqueue_nd_range_kernel(*op.call(), wait, False, bool(op.shared[1]))
            elif isinstance(op, TransferOp):
                args, kwargs = _substituted(op, subst)
                if wait is not None:
                    if op.wait_pos < len(args):
                        args = (*args[: op.wait_pos], wait, *args[op.wait_pos + 1 :])
                    else:
                        kwargs = {**kwargs, "wait_for": wait}
                event = op.fn(*args, **kwargs)
            else:
                _finish(op.queue)
                event = None
            events.append(event)
            if event is not None:
                last = op
        if last is None:
            return None
        # one event for the whole replay: a marker on the last command's queue waiting for
        # every command nothing later waited on (on an out-of-order queue the last command's
        # own event says nothing about the others)
        sinks = [e for i, e in enumerate(events) if e is not None and i not in self._waited]
        for queue in self._final_flushes:
            _flush(queue)
        return _marker(_queue_of(last), sinks)

    def validate(self, buffer_map: Mapping[int, Any]) -> dict[int, cl.MemoryObjectHolder]:
        """Check a rebinding map against every recorded command using each buffer; raise
        before anything is enqueued. Returns int_ptr -> buffer."""
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
            old = entry[0]
            if isinstance(new, cl.Image) != isinstance(old, cl.Image):
                raise TypeError(
                    f"KernelCapture.replay_with_new_buffers: the replacement for {key:#x} is a "
                    f"{type(new).__name__}, the recorded object a {type(old).__name__}"
                )
            if new.context.int_ptr != old.context.int_ptr:
                raise ValueError(
                    f"KernelCapture.replay_with_new_buffers: the replacement for {key:#x} "
                    "belongs to another OpenCL context than the recorded buffer"
                )
            need, i, what = self._need(key)
            new_size = int(new.size)
            if new_size < need:
                raise ValueError(
                    f"KernelCapture.replay_with_new_buffers: the replacement for {key:#x} "
                    f"holds {new_size} bytes, but recorded command {i} ({what}) uses "
                    f"{need} bytes of it (the recorded buffer holds {int(old.size)})"
                )
            subst[key] = new
        return subst

    def _need(self, key: int) -> tuple[int, int, str]:
        """The most bytes of buffer ``key`` any recorded command touches (and which one)."""
        found = self._needs.get(key)
        if found is None:
            old, _, uses = self.buffers[key]
            size = int(old.size)
            best = max(((*_extent(self.ops[i], key, size), i) for i in uses),
                       key=lambda t: t[0], default=(0, "", -1))
            found = self._needs[key] = (best[0], best[2], best[1])
        return found

    def run_rebound(self, subst: dict[int, cl.MemoryObjectHolder]) -> cl.Event | None:
        """One run with buffers substituted; the recorded arguments are back afterwards.

        OpenCL takes a kernel's argument values at enqueue time, so setting an argument,
        enqueuing, and setting it back leaves the enqueued launch with the substitute.
        """
        if not subst:
            return self.run()
        touched: list[tuple[cl.Kernel, int, cl.MemoryObjectHolder, cl.MemoryObjectHolder]] = []
        transfers = False
        for key, new in subst.items():
            old, args, ops = self.buffers[key]
            touched += [(k, i, old, new) for k, i in args]
            transfers = transfers or any(isinstance(self.ops[i], TransferOp) for i in ops)
        try:
            for kernel, index, _, new in touched:
                _set_arg(kernel, index, new)
            if not self.ordered:
                return self._run_with_deps(subst)
            segments = self._build_segments(subst) if transfers else self._segments
            return _run(segments)
        finally:
            for kernel, index, old, _ in touched:
                _set_arg(kernel, index, old)


def _queue_of(op: Op) -> cl.CommandQueue:
    return op.record.queue if isinstance(op, TransferOp) else op.queue


def _substituted(
    op: TransferOp, subst: Mapping[int, cl.MemoryObjectHolder]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not subst:
        return op.args, op.kwargs
    args, kwargs = list(op.args), dict(op.kwargs)
    for where, buf in op.buffers:
        new = subst.get(buf.int_ptr)
        if new is None:
            continue
        if isinstance(where, int):
            args[where] = new
        else:
            kwargs[where] = new
    return tuple(args), kwargs


_TRANSFER_PARAMS = {
    "_enqueue_read_buffer": ("queue", "mem", "hostbuf", "offset"),
    "_enqueue_write_buffer": ("queue", "mem", "hostbuf", "offset"),
    "_enqueue_copy_buffer": ("queue", "src", "dst", "byte_count", "src_offset", "dst_offset"),
    "_enqueue_fill_buffer": ("queue", "mem", "pattern", "offset", "size"),
}


def _extent(op: Op, key: int, recorded: int) -> tuple[int, str]:
    """Bytes of buffer ``key`` that recorded command ``op`` touches, and what it is."""
    if isinstance(op, KernelOp):
        return recorded, f"kernel {op.item[0].function_name!r}"
    if not isinstance(op, TransferOp):
        return 0, "finish"
    name = op.record.operation
    params = _TRANSFER_PARAMS.get("_enqueue_" + name)
    if params is None:  # rectangles and images: the whole recorded object
        return recorded, name
    bound = dict(zip(params, op.args, strict=False))
    bound.update((k, v) for k, v in op.kwargs.items() if k in params)
    for alias in ("src_offset", "dst_offset"):  # read/write name their offset so
        if name != "copy_buffer" and alias in op.kwargs:
            bound["offset"] = op.kwargs[alias]
    uses = []
    if name in ("read_buffer", "write_buffer"):
        uses.append(("mem", int(bound.get("offset") or 0) + memoryview(bound["hostbuf"]).nbytes))
    elif name == "copy_buffer":
        count = int(bound["byte_count"])
        uses.append(("src", int(bound.get("src_offset") or 0) + count))
        uses.append(("dst", int(bound.get("dst_offset") or 0) + count))
    else:
        uses.append(("mem", int(bound.get("offset") or 0) + int(bound["size"])))
    need = max((n for role, n in uses if bound[role].int_ptr == key), default=0)
    return need, name


def _run(segments: list[_Segment]) -> cl.Event | None:
    """Enqueue every segment in order; the last command's event (None if there are none)."""
    last: deque[Any] | None = None
    for fn, calls in segments:
        last = deque(starmap(fn, calls), 1)
    return last[0] if last else None
