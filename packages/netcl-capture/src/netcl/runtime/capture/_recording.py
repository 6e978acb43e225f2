"""What one begin()..end() sees: commands in order with what replay needs (a launch appends one
``RawLaunch``: its shape, wait list and event), and the read-only records ``KernelCapture
.launches`` / ``.commands`` give of them. The first time a memory object shows up the
recording takes an OpenCL reference of its own and uses it from then on, so an application's
``buffer.release()`` cannot free memory a replay uses; kernels are cloned on first sight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType, MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pyopencl as cl

from netcl.core import contract, device
from netcl.core.contract import EntryPoint

__all__ = [
    "ArgSet",
    "CapturedLaunch",
    "CapturedTransfer",
    "LaunchShape",
    "NativeAccess",
    "Op",
    "RawFinish",
    "RawHostWait",
    "RawLaunch",
    "RawTransfer",
    "Recording",
    "buffers_of",
    "launch_sizes",
]

_MemoryObject = cl.MemoryObjectHolder
_retain = contract.retain
_mem_ptr = contract.mem_ptr
_new = tuple.__new__  # a NamedTuple in one C call: half of what its __new__ costs
Fn = Callable[..., Any]
Args = tuple[Any, ...]
Kwargs = dict[str, Any]


@dataclass(frozen=True)
class CapturedLaunch:
    """One recorded kernel launch; ``args`` are the kernel's arguments as its replay sets them,
    one per argument index (empty when an argument was set before ``begin()``: see
    ``RawLaunch.record``)."""

    kernel_name: str
    queue: cl.CommandQueue
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    offset: tuple[int, ...] | None
    args: tuple[Any, ...]


@dataclass(frozen=True)
class CapturedTransfer:
    """One recorded copy or fill: pyopencl's primitive (``operation``: ``write_buffer``,
    ``copy_buffer``, ``fill_buffer``, ...) and its arguments, minus ``wait_for``."""

    operation: str
    queue: cl.CommandQueue
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


class ArgSet(NamedTuple):
    """One kernel argument index as last set: pyopencl's setter and its arguments after the
    kernel (memory objects replaced by the recording's own references)."""

    arg_index: int
    setter: Callable[..., Any]
    payload: tuple[Any, ...]


class LaunchShape(NamedTuple):
    """What consecutive launches of one kernel share while nothing about them changes: one
    object for all of them (the replay binds a kernel object once per shape)."""

    kernel: cl.Kernel
    queue: cl.CommandQueue
    global_size: Any
    local_size: Any
    offset: Any
    g_times_l: bool
    allow_empty: bool
    args: tuple[ArgSet, ...]  # the kernel's argument table when it launched


class RawLaunch(NamedTuple):
    """A recorded launch, as the driver entry point saw it."""

    shape: LaunchShape
    wait_for: tuple[Any, ...]
    event: Any

    @property
    def queue(self) -> cl.CommandQueue:
        return self.shape.queue

    def record(self) -> CapturedLaunch:
        """The read-only record of this launch. Its ``args`` come from the argument table: a
        memory object as the recording's own reference, a pyopencl Array as its buffer (and
        offset, where the kernel takes one), a scalar as set (or as the bytes pyopencl packed
        it into), ``None`` for a NULL argument, a by-value array read-only; empty when the
        table lacks an index (set before ``begin()``: the replay keeps it, unseen)."""
        shape = self.shape
        gsize, lsize, offset = launch_sizes(shape)
        table = {arg.arg_index: arg.payload for arg in shape.args}
        indices = range(shape.kernel.num_args)
        args: tuple[Any, ...] = ()
        if all(i in table for i in indices):
            args = tuple(_set_value(table[i]) for i in indices)
        return CapturedLaunch(shape.kernel.function_name, shape.queue, gsize, lsize, offset, args)


def buffers_of(args: tuple[ArgSet, ...]) -> tuple[tuple[int, cl.MemoryObjectHolder], ...]:
    """(argument index, memory object) of every memory object in an argument table (a payload
    is (index, value...), pairs' and triples' values in a tuple)."""
    return tuple(
        (arg.arg_index, v)
        for arg in args
        for p in arg.payload
        for v in (p if isinstance(p, tuple) else (p,))
        if isinstance(v, cl.MemoryObjectHolder)
    )


def _set_value(payload: tuple[Any, ...]) -> Any:
    """The value an ``ArgSet`` payload sets: ``((index, value),)`` and ``((index, code,
    value),)`` from the multi setters, ``(index[, value])`` from the single ones."""
    first = payload[0]
    value = first[-1] if isinstance(first, tuple) else payload[1] if len(payload) > 1 else None
    if isinstance(value, np.ndarray):  # the recording's copy: what save() writes
        value = value.view()
        value.flags.writeable = False
    return value


# (position or keyword, buffer) of a memory object among a transfer's arguments
Where = tuple[int | str, cl.MemoryObjectHolder]


class RawTransfer(NamedTuple):
    """A recorded copy, fill, marker or barrier: pyopencl's primitive and its arguments, with
    ``wait_for`` taken out (``None`` at its position, absent from the keywords)."""

    entry: EntryPoint
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    wait_for: tuple[Any, ...]
    event: Any
    buffers: tuple[Where, ...]  # where the memory objects sit among the arguments

    @property
    def queue(self) -> cl.CommandQueue:
        return self.args[0] if self.args else self.kwargs["queue"]

    def record(self) -> CapturedTransfer:
        """The read-only record of this transfer."""
        return CapturedTransfer(
            self.entry.operation, self.queue, self.args, MappingProxyType(dict(self.kwargs))
        )

    def bound(self) -> dict[str, Any]:
        """The arguments by pyopencl's parameter names."""
        return dict(zip(self.entry.params, self.args, strict=False), **self.kwargs)

    def substituted(
        self, subst: Mapping[int, cl.MemoryObjectHolder]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments with the substitutes of one replay (keys: recorded int_ptr)."""
        if not subst:
            return self.args, self.kwargs
        args, kwargs = list(self.args), dict(self.kwargs)
        for where, buf in self.buffers:
            if (new := subst.get(_mem_ptr(buf))) is None:
                continue
            if isinstance(where, int):
                args[where] = new
            else:
                kwargs[where] = new
        return tuple(args), kwargs


class RawFinish(NamedTuple):
    """A recorded ``queue.finish()``."""

    queue: cl.CommandQueue


class RawHostWait(NamedTuple):
    """A recorded host-side wait (``Event.wait()``, ``cl.wait_for_events``)."""

    events: tuple[cl.Event, ...]


class NativeAccess(NamedTuple):
    """Code outside pyopencl and netcl that reached a queue or memory object's raw handle
    while recording: its module and function, and what it reached."""

    module: str
    function: str
    reached: str

    def __str__(self) -> str:
        return f"{self.module}.{self.function} ({self.reached})"


# a command of the replay; a host wait is an ordering fact only (see _ordering)
Op = RawLaunch | RawTransfer | RawFinish
Raw = Op | RawHostWait


class _KernelState:
    """What the recording knows of one kernel object (held alive by it)."""

    __slots__ = ("clone", "kernel", "last", "shape", "snapshot", "table")

    def __init__(self, kernel: cl.Kernel) -> None:
        self.kernel = kernel
        self.table: dict[int, ArgSet] = {}  # argument index -> as last set
        self.snapshot: tuple[ArgSet, ...] | None = None  # the table as a tuple while unchanged
        self.shape: LaunchShape | None = None  # of the last launch
        # the last (setter, argument tuple) of a _set_arg*_multi call, when it held no copies
        self.last: tuple[Callable[..., Any], tuple[Any, ...]] | None = None
        # a clone taken at the first launch (None where the driver cannot clone)
        self.clone: cl.Kernel | object | None = _UNSET


_UNSET: Any = object()
_OWN_MODULES = ("pyopencl.", "netcl.")  # raw-handle accesses from these are not native work


class Recording:
    """The recording state of one capture; fed by the hooks of its thread only."""

    def __init__(self) -> None:
        self.thread_name = threading.current_thread().name
        self.live = False  # fed by hooks while True; set False (first thing) when stopped
        self.started = False  # install() completed (an interrupted begin() leaves no end())
        self.pinned = False  # keeps pyopencl hooked (the invoker memo) while end() builds
        self.busy = 0  # hooks between "the command may have run" and "noted" (see _intercept)
        self.raw: list[Raw] = []  # commands and host waits, in issue order
        self.kernels: dict[int, _KernelState] = {}  # id(kernel) -> state
        self.mems: dict[int, cl.MemoryObjectHolder] = {}  # int_ptr -> our own reference
        # int_ptr -> the application's object seen first (end() asks who else holds it: _memory)
        self.users: dict[int, cl.MemoryObjectHolder] = {}
        self.native: dict[NativeAccess, None] = {}  # raw-handle accesses, in order
        # int_ptr of the buffers allocated while recording, the only ones end() may move
        # (_memory): made or handed out by a pool (_intercept); it starts with the blocks
        # BufferPools hold now, which are the recorded code's allocations if it takes them
        # (their contents are undefined)
        self.born: set[int] = device.held_blocks()

    @property
    def launches(self) -> int:
        return sum(type(r) is RawLaunch for r in list(self.raw))

    def clear(self) -> None:  # drop everything held (the thread's slot may keep this a while)
        self.raw = []
        self.kernels = {}
        self.mems = {}
        self.users = {}
        self.native = {}
        self.born = set()

    def retain(self, mem: cl.MemoryObjectHolder) -> cl.MemoryObjectHolder:
        """This recording's reference to ``mem`` (taken on first sight)."""
        ptr = _mem_ptr(mem)
        if (own := self.mems.get(ptr)) is None:
            own = self.mems[ptr] = _retain(ptr, retain=True)
            self.users[ptr] = mem
        return own

    def _hold(self, value: Any) -> Any:
        if isinstance(value, _MemoryObject):
            return self.retain(value)
        if isinstance(value, np.ndarray):
            return value.copy()  # the argument's bytes as set, not as later mutated
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        return value

    def _state(self, kernel: cl.Kernel) -> _KernelState:
        if (state := self.kernels.get(id(kernel))) is None:
            state = self.kernels[id(kernel)] = _KernelState(kernel)
        return state

    # -- notes: what the hooks call after pyopencl's own function returned ----------------

    def new_shape(
        self,
        state: _KernelState,
        kernel: Any,
        queue: Any,
        gws: Any,
        lws: Any,
        offset: Any,
        g_times_l: bool,
        allow_empty: bool,
    ) -> LaunchShape:
        """The shape of a launch that is not the same objects as the kernel's last one."""
        if state.clone is _UNSET:
            # a copy of the kernel as this launch left it (arguments set before begin()
            # included): the replay kernels are clones of it, so nothing set on (or freed
            # from) the application's kernel later can reach them
            state.clone = _clone(kernel)
        snap = state.snapshot
        if snap is None:
            snap = state.snapshot = tuple(state.table.values())
        shape = _shape(state.shape, (kernel, queue, gws, lws, offset, g_times_l, allow_empty, snap))
        state.shape = shape
        return shape

    def note_pairs(self, setter: Callable[..., Any], kernel: Any, flat: tuple[Any, ...]) -> None:
        """Record ``_set_arg_multi`` / ``_set_arg_buf_multi``: (index, value) pairs, flat
        (unless the same as the last call: see ``_intercept._pairs_hook``)."""
        state = self.kernels.get(id(kernel)) or self._state(kernel)
        state.last = None
        table, mems = state.table, self.mems
        plain = True
        for j in range(0, len(flat), 2):
            i, value = flat[j], flat[j + 1]
            # inlined fast paths: this runs for every argument of every changed launch
            if isinstance(value, _MemoryObject):
                value = mems.get(_mem_ptr(value)) or self.retain(value)
            elif isinstance(value, _COPIED):
                value = self._hold(value)
                plain = False
            old = table.get(i)
            if (
                old is None
                or old.setter is not setter
                or not (old.payload[0][1] is value or _same(old.payload[0][1], value))
            ):
                table[i] = _new(ArgSet, (i, setter, ((i, value),)))
                state.snapshot = None
        if plain:
            state.last = (setter, flat)

    # the generic hooks' notes (_intercept._make_hook): entry, function, arguments, result

    def note_pack(self, entry: EntryPoint, setter: Fn, args: Args, kwargs: Kwargs, _: Any) -> None:
        """Record ``_set_arg_buf_pack_multi(kernel, flat)``: (index, struct code, value)
        triples, flat (positional-only)."""
        kernel, flat = args
        state = self._state(kernel)
        state.last = None
        for j in range(0, len(flat), 3):
            i, code, value = flat[j], flat[j + 1], self._hold(flat[j + 2])
            old = state.table.get(i)
            if (
                old is None
                or old.setter is not setter
                or old.payload[0][1] != code
                or not _same(old.payload[0][2], value)
            ):
                state.table[i] = _new(ArgSet, (i, setter, ((i, code, value),)))
                state.snapshot = None

    def note_one(self, entry: EntryPoint, setter: Fn, args: Args, kwargs: Kwargs, _: Any) -> None:
        """Record ``set_arg``, ``_set_arg_null``, ``_set_arg_buf``, ``_set_arg_svm``:
        (kernel, index[, value])."""
        values = args[1:]
        if kwargs:  # set_arg(arg_index=..., arg=...): in parameter order
            values += tuple(kwargs[n] for n in entry.params[len(values) :] if n in kwargs)
        state = self._state(args[0])
        state.last = None
        i = int(values[0])
        state.table[i] = _new(ArgSet, (i, setter, (i, *(self._hold(v) for v in values[1:]))))
        state.snapshot = None

    def note_transfer(
        self, entry: EntryPoint, fn: Fn, args: Args, kwargs: Kwargs, event: Any
    ) -> None:
        """Record a copy, fill, marker or barrier."""
        at = entry.wait_for
        waits = kwargs.get("wait_for") if len(args) <= at else args[at]
        pos = [self.retain(a) if isinstance(a, _MemoryObject) else a for a in args]
        if len(pos) > at:
            pos[at] = None
        kw = {
            k: self.retain(v) if isinstance(v, _MemoryObject) else v
            for k, v in kwargs.items()
            if k != "wait_for"
        }
        where: tuple[Where, ...] = (
            *((i, a) for i, a in enumerate(pos) if isinstance(a, _MemoryObject)),
            *((k, v) for k, v in kw.items() if isinstance(v, _MemoryObject)),
        )
        if entry.word == "copy":
            _resolve_copy_count(entry, pos, kw)
        self.raw.append(RawTransfer(entry, fn, tuple(pos), kw, tuple(waits or ()), event, where))

    def note_finish(self, entry: EntryPoint, fn: Fn, args: Args, kwargs: Kwargs, _: Any) -> None:
        self.raw.append(RawFinish(args[0]))

    def note_wait(self, entry: EntryPoint, fn: Fn, args: Args, kwargs: Kwargs, _: Any) -> None:
        """Record a host-side wait (``Event.wait()``, ``wait_for_events(events)``): the
        commands issued after it ran after those events, so the replay orders them so too
        (pyopencl.array's ``finish()`` waits, then forgets the events from wait lists)."""
        events = (args[0],) if entry.kind == "event_wait" else args[0]
        waited = tuple(e for e in events if isinstance(e, cl.Event))
        if waited:
            self.raw.append(RawHostWait(waited))

    def note_native(self, reached: str, frame: FrameType) -> None:
        """Note a raw-handle access by ``frame``'s code, unless pyopencl or netcl made it."""
        module = str(frame.f_globals.get("__name__", "?"))
        if module == "pyopencl" or module.startswith(_OWN_MODULES):
            return
        code = frame.f_code  # co_qualname: Python 3.11+
        self.native.setdefault(
            NativeAccess(module, getattr(code, "co_qualname", code.co_name), reached)
        )


def _shape(last: LaunchShape | None, fields: tuple[Any, ...]) -> LaunchShape:
    """``last`` if ``fields`` equal it (sizes compared by value: a loop may pass a new but
    equal tuple each time), else a new shape."""
    if last is not None and last[7] is fields[7] and last[0] is fields[0] and last[1] is fields[1]:
        try:
            if last[2:7] == fields[2:7]:
                return last
        except ValueError:  # sizes given as NumPy arrays: a new shape
            pass
    return _new(LaunchShape, fields)  # type: ignore[no-any-return]


def _clone(kernel: cl.Kernel) -> cl.Kernel | None:
    try:
        return kernel.clone()
    except (cl.Error, RuntimeError, AttributeError):  # OpenCL < 2.1, or the driver refuses
        return None


_SCALARS = (int, float, bytes, np.generic)
_COPIED = (np.ndarray, bytearray, memoryview)  # values copied when recorded (mutable buffers)


def _same(old: Any, new: Any) -> bool:
    """Whether two values of one argument are the same: identity for objects (a buffer is the
    recording's own reference), the type and bytes for scalars (-0.0 == 0.0, not to a kernel)."""
    return old is new or (
        type(old) is type(new)
        and isinstance(new, _SCALARS)
        and np.asarray(old).tobytes() == np.asarray(new).tobytes()
    )


def _resolve_copy_count(entry: EntryPoint, pos: list[Any], kw: dict[str, Any]) -> None:
    """Make a device-to-device copy's byte count explicit (pyopencl's -1 means the smaller
    buffer's size), so a replay with a larger substitute copies what the recording copied."""
    names = entry.params
    at = names.index("byte_count")
    bound = dict(zip(names, pos, strict=False), **kw)
    if (count := bound.get("byte_count", -1)) is None or count < 0:
        count = min(int(bound["src"].size), int(bound["dst"].size))
        if len(pos) > at:
            pos[at] = count
        else:
            kw["byte_count"] = count


Sizes = tuple[tuple[int, ...], tuple[int, ...] | None, tuple[int, ...] | None]


def _dims(size: Any) -> tuple[int, ...]:
    return (size,) if isinstance(size, int) else tuple(int(s) for s in size)


def launch_sizes(shape: LaunchShape) -> Sizes:
    """(global size, local size, offset) of a launch as tuples, ``g_times_l`` folded in."""
    gsize = _dims(shape.global_size)
    lsize = None if shape.local_size is None else _dims(shape.local_size)
    if shape.g_times_l and lsize is not None:
        gsize = tuple(g * ls for g, ls in zip(gsize, lsize, strict=True))
    return gsize, lsize, None if shape.offset is None else _dims(shape.offset)
