"""What one begin()..end() sees: commands in order, with what replay needs.

Recording is cheap on purpose: a launch appends one tuple (the kernel, its sizes, a snapshot of
its argument table, its wait list and event). The replay form is built once, in ``end()``
(see ``_replay.build``).

Retention: the first time a memory object shows up (a kernel argument or a transfer operand) the
recording takes an OpenCL reference of its own (``cl.MemoryObject.from_int_ptr(...,
retain=True)``) and uses that object from then on, so an application's ``buffer.release()``
cannot free memory a replay uses. Kernels are cloned on first sight for the same reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl

__all__ = ["COMMANDS", "Recording", "note_setter"]

_MemoryObject = cl.MemoryObjectHolder
_retain = cl.MemoryObject.from_int_ptr

# One argument index as last set: (index, the original setter, its arguments after self).
ArgSet = tuple[int, Callable[..., Any], tuple[Any, ...]]
# A recorded launch: (kernel, queue, global size, local size, offset, g_times_l,
# allow_empty_ndrange, wait list, event, argument snapshot, Kernel.__call__ arguments or None)
RawLaunch = tuple[Any, ...]

_ENQUEUE_NAMES = (
    "queue", "kernel", "global_work_size", "local_work_size", "global_work_offset", "wait_for",
    "g_times_l", "allow_empty_ndrange",
)
_ENQUEUE_DEFAULTS = (None, None, None, None, None, None, False, False)


class Recording:
    """The recording state of one capture; fed by the hooks of its thread only."""

    def __init__(self) -> None:
        self.thread_name = threading.current_thread().name
        # fed by hooks while True; set False (first thing) when stopped
        self.live = False
        # install() completed (a begin() interrupted before that left nothing to end())
        self.started = False
        # keeps pyopencl hooked (the invoker memo) while end() builds the replay form
        self.pinned = False
        # hooks between "the command may have run" and "noted" (see _intercept._make_hook)
        self.busy = 0
        # ("k", RawLaunch) / ("t", transfer tuple) / ("f", queue) / ("w", events the host
        # waited for), in issue order
        self.raw: list[tuple[str, Any]] = []
        # the Kernel.__call__ arguments of the launch in progress (for CapturedLaunch.args)
        self.call_args: tuple[Any, ...] | None = None
        # id(kernel) -> [kernel, its argument table (index -> ArgSet), the table's snapshot
        # while unchanged (launches with the same arguments share it), the last
        # (setter, argument tuple) of a _set_arg*_multi call, a clone taken at its first
        # launch (None where the driver cannot clone)]; holds the kernel alive
        self.kernels: dict[int, list[Any]] = {}
        # int_ptr -> this recording's own reference to the memory object
        self.mems: dict[int, cl.MemoryObjectHolder] = {}

    @property
    def launches(self) -> int:
        return sum(kind == "k" for kind, _ in list(self.raw))

    @property
    def commands(self) -> int:
        return sum(kind in COMMANDS for kind, _ in list(self.raw))

    def clear(self) -> None:
        """Drop everything held (the thread's slot may keep this object a while)."""
        self.raw = []
        self.kernels = {}
        self.mems = {}
        self.call_args = None

    def retain(self, mem: cl.MemoryObjectHolder) -> cl.MemoryObjectHolder:
        """This recording's reference to ``mem`` (taken on first sight)."""
        ptr = mem.int_ptr
        own = self.mems.get(ptr)
        if own is None:
            own = self.mems[ptr] = _retain(ptr, retain=True)
        return own

    def _hold(self, value: Any) -> Any:
        if isinstance(value, _MemoryObject):
            return self.retain(value)
        if isinstance(value, np.ndarray):
            return value.copy()  # the argument's bytes as set, not as later mutated
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        return value

    def add_enqueue(self, args: tuple[Any, ...], kwargs: dict[str, Any], event: Any) -> None:
        """Record a launch (the ``enqueue_nd_range_kernel`` hook's note)."""
        if kwargs or len(args) != 8:
            bound = dict(zip(_ENQUEUE_NAMES, _ENQUEUE_DEFAULTS, strict=True))
            bound.update(zip(_ENQUEUE_NAMES, args, strict=False))
            bound.update(kwargs)
            args = tuple(bound.values())
        queue, kernel, gws, lws, offset, wait_for, g_times_l, allow_empty = args
        entry = self.kernels.get(id(kernel))
        if entry is None:
            entry = self.kernels[id(kernel)] = [kernel, {}, None, None, _UNSET]
        if entry[4] is _UNSET:
            # a copy of the kernel as this launch left it (arguments set before begin()
            # included): the replay kernels are clones of it, so nothing set on (or freed
            # from) the application's kernel later can reach them
            entry[4] = _clone(kernel)
        snap = entry[2]
        if snap is None:
            snap = entry[2] = tuple(entry[1].values())
        call = self.call_args
        call_args = call[4:] if call is not None and call[0] is kernel else None
        self.raw.append(("k", (
            kernel, queue, gws, lws, offset, g_times_l, allow_empty,
            tuple(wait_for) if wait_for else (), event, snap, call_args,
        )))

    def add_transfer(
        self,
        name: str,
        fn: Callable[..., Any],
        wait_pos: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        event: Any,
    ) -> None:
        pos = list(args)
        waits = kwargs.get("wait_for") if len(pos) <= wait_pos else pos[wait_pos]
        if len(pos) > wait_pos:
            pos[wait_pos] = None
        kw = {k: self._hold(v) if isinstance(v, _MemoryObject) else v
              for k, v in kwargs.items() if k != "wait_for"}
        pos = [self.retain(a) if isinstance(a, _MemoryObject) else a for a in pos]
        if name == "_enqueue_copy_buffer":
            _resolve_copy_count(pos, kw)
        self.raw.append(("t", (name, fn, wait_pos, tuple(pos), kw,
                               tuple(waits) if waits else (), event)))

    def add_finish(self, queue: cl.CommandQueue) -> None:
        self.raw.append(("f", queue))

    def add_wait(self, events: Any) -> None:
        """Record a host-side wait (``Event.wait()``, ``cl.wait_for_events``): every command
        issued after it ran after those events in the recording, so the replay makes them wait
        for the replayed events (pyopencl.array's ``finish()`` waits this way and then forgets
        the events, so the next command's own wait list no longer names them)."""
        waited = tuple(e for e in events if isinstance(e, cl.Event))
        if waited:
            self.raw.append(("w", waited))


_UNSET: Any = object()
# the kinds of recorded entries that are commands (replayed, listed in ``commands``)
COMMANDS = ("k", "t")


def _clone(kernel: cl.Kernel) -> cl.Kernel | None:
    try:
        return kernel.clone()
    except (cl.Error, RuntimeError, AttributeError):  # OpenCL < 2.1, or the driver refuses
        return None


_SCALARS = (int, float, bytes, np.generic)
# argument values copied when recorded (mutable buffers)
_COPIED = (np.ndarray, bytearray, memoryview)


def note_setter(
    name: str, setter: Callable[..., Any], self: Recording, args: tuple[Any, ...], kwargs: Any,
    result: Any,
) -> None:
    """Record what an argument setter just set (the hook's note, bound with ``partial``: one
    Python frame per setter call, as it runs for every recorded launch)."""
    kernel = args[0]
    entry = self.kernels.get(id(kernel))
    if entry is None:
        entry = self.kernels[id(kernel)] = [kernel, {}, None, None, _UNSET]
    table = entry[1]
    if name == "_set_arg_multi" or name == "_set_arg_buf_multi":
        flat = args[1]
        last = entry[3]
        # the same call as last time (same objects, equal scalars; a memory object compares
        # by address, and a retained one keeps its address): nothing to note
        if last is not None and last[0] is setter:
            try:
                if last[1] == flat:
                    return
            except ValueError:  # an array argument: compared the long way below
                pass
        entry[3] = None
        mems = self.mems
        plain = True
        for j in range(0, len(flat), 2):
            i, value = flat[j], flat[j + 1]
            # inlined fast paths: this runs for every argument of every recorded launch
            if isinstance(value, _MemoryObject):
                value = mems.get(value.int_ptr) or self.retain(value)
            elif isinstance(value, _COPIED):
                value = self._hold(value)
                plain = False
            old = table.get(i)
            if old is None or old[1] is not setter or not (
                old[2][0][1] is value or _same(old[2][0][1], value)
            ):
                table[i] = (i, setter, ((i, value),))
                entry[2] = None
        if plain:
            entry[3] = (setter, flat)
    elif name == "_set_arg_buf_pack_multi":
        entry[3] = None
        flat = args[1]
        for j in range(0, len(flat), 3):
            i, code, value = flat[j], flat[j + 1], self._hold(flat[j + 2])
            old = table.get(i)
            if (old is None or old[1] is not setter or old[2][0][1] != code
                    or not _same(old[2][0][2], value)):
                table[i] = (i, setter, ((i, code, value),))
                entry[2] = None
    else:  # set_arg, _set_arg_null, _set_arg_buf, _set_arg_svm: (index[, value])
        entry[3] = None
        i = int(args[1])
        table[i] = (i, setter, (i, *(self._hold(v) for v in args[2:])))
        entry[2] = None



def _same(old: Any, new: Any) -> bool:
    """Whether two values of one argument are the same: identity for objects (a memory
    object is the recording's own reference, so the same buffer is the same object), equality
    for scalars and bytes."""
    return old is new or (
        type(old) is type(new) and isinstance(new, _SCALARS) and bool(old == new)
    )


def _resolve_copy_count(pos: list[Any], kw: dict[str, Any]) -> None:
    """Make a device-to-device copy's byte count explicit (pyopencl's -1 means the smaller
    buffer's size), so a replay with a larger substitute copies what the recording copied."""
    names = ("queue", "src", "dst", "byte_count")
    bound = dict(zip(names, pos, strict=False))
    bound.update((k, v) for k, v in kw.items() if k in names)
    count = bound.get("byte_count", -1)
    if count is None or count < 0:
        count = min(int(bound["src"].size), int(bound["dst"].size))
        if len(pos) > 3:
            pos[3] = count
        else:
            kw["byte_count"] = count
