"""What one begin()..end() sees: launches and transfers in order, with what replay needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pyopencl as cl

from netcl.runtime.capture._records import CapturedLaunch, CapturedTransfer

__all__ = ["KernelOp", "Recording", "TransferOp"]

_MemoryObject = cl.MemoryObjectHolder
_ArgState = tuple[Callable[..., Any], tuple[Any, ...], Any]


@dataclass
class KernelOp:
    """A launch frozen for replay: a kernel object of its own, arguments bound once."""

    record: CapturedLaunch
    kernel: cl.Kernel
    # keyword flags of enqueue_nd_range_kernel other than the defaults (rare)
    flags: dict[str, Any]
    # (argument index, buffer) for every buffer argument whose index is known
    buffers: tuple[tuple[int, cl.MemoryObjectHolder], ...]
    # every argument index set during the capture (the rest were preset before begin())
    known_args: bool


@dataclass
class TransferOp:
    """A copy or fill frozen for replay: pyopencl's primitive and its arguments."""

    record: CapturedTransfer
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    # (position or keyword, buffer) of every memory object among the arguments
    buffers: tuple[tuple[int | str, cl.MemoryObjectHolder], ...]


class Recording:
    """The recording state of one capture; fed by the hooks of its thread only."""

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.ops: list[KernelOp | TransferOp] = []
        # kernel int_ptr -> argument index -> (setter, payload) as last set during the capture;
        # tells which argument holds which buffer, and re-creates the arguments if the device
        # cannot clone kernels
        # (the third item is the argument object for setters that take one, else None)
        self._args: dict[int, dict[int, _ArgState]] = {}

    def note_args(
        self, kernel: cl.Kernel, name: str, setter: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        state = self._args.setdefault(kernel.int_ptr, {})
        if name == "set_arg":
            index, value = args
            state[int(index)] = (setter, (index, value), value)
            return
        (flat,) = args
        step = 3 if name == "_set_arg_buf_pack_multi" else 2
        for i in range(0, len(flat), step):
            entry = tuple(flat[i : i + step])
            value = entry[1] if step == 2 and name == "_set_arg_multi" else None
            state[int(entry[0])] = (setter, (entry,), value)

    def add_call(self, kernel: cl.Kernel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        queue, global_size, local_size, *kernel_args = args
        self._add_launch(
            kernel, queue, global_size, local_size, kwargs.get("global_offset"), kwargs,
            tuple(kernel_args),
        )

    def add_enqueue(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        names = ("queue", "kernel", "global_work_size", "local_work_size", "global_offset")
        bound = dict(zip(names, args, strict=False))
        bound.update((k, v) for k, v in kwargs.items() if k in names)
        self._add_launch(
            bound["kernel"], bound["queue"], bound["global_work_size"],
            bound.get("local_work_size"), bound.get("global_offset"), kwargs, (),
        )

    def _add_launch(
        self,
        kernel: cl.Kernel,
        queue: cl.CommandQueue,
        global_size: Any,
        local_size: Any,
        offset: Any,
        kwargs: dict[str, Any],
        args: tuple[Any, ...],
    ) -> None:
        flags = {k: v for k, v in kwargs.items() if k in ("g_times_l", "allow_empty_ndrange")}
        gsize = _dims(global_size)
        lsize = None if local_size is None else _dims(local_size)
        if flags.pop("g_times_l", False) and lsize is not None:
            gsize = tuple(g * ls for g, ls in zip(gsize, lsize, strict=True))
        if not flags.get("allow_empty_ndrange", True):
            flags.pop("allow_empty_ndrange")
        state = self._args.get(kernel.int_ptr, {})
        replica = _replicate(kernel, state)
        buffers = tuple(
            (index, value)
            for index, (_, _, value) in sorted(state.items())
            if isinstance(value, _MemoryObject)
        )
        record = CapturedLaunch(
            kernel_name=kernel.function_name,
            queue=queue,
            global_size=gsize,
            local_size=lsize,
            offset=None if offset is None else _dims(offset),
            args=args,
        )
        known = len(state) >= kernel.num_args
        self.ops.append(KernelOp(record, replica, flags, buffers, known))

    def add_transfer(
        self,
        name: str,
        fn: Callable[..., Any],
        wait_pos: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        # recorded events are stale at replay: drop wait_for, replay relies on queue order
        pos_args = tuple(None if i == wait_pos else a for i, a in enumerate(args))
        kw = {k: v for k, v in kwargs.items() if k != "wait_for"}
        buffers: list[tuple[int | str, cl.MemoryObjectHolder]] = [
            (i, a) for i, a in enumerate(pos_args) if isinstance(a, _MemoryObject)
        ]
        buffers += [(k, v) for k, v in kw.items() if isinstance(v, _MemoryObject)]
        record = CapturedTransfer(
            operation=name.removeprefix("_enqueue_"),
            queue=pos_args[0] if pos_args else kw.get("queue"),
            args=pos_args,
            kwargs=MappingProxyType(dict(kw)),
        )
        self.ops.append(TransferOp(record, fn, pos_args, kw, tuple(buffers)))


def _dims(size: Any) -> tuple[int, ...]:
    if isinstance(size, int):
        return (size,)
    return tuple(int(s) for s in size)


def _replicate(
    kernel: cl.Kernel, state: dict[int, _ArgState]
) -> cl.Kernel:
    """A kernel object of its own holding the arguments ``kernel`` has right now.

    ``clone()`` (OpenCL 2.1+) copies every argument, scalars and local sizes included, exactly
    as the launch used them. Without it, a fresh kernel gets the arguments set during the
    capture re-applied, which needs all of them to have been set inside the capture.
    """
    try:
        return kernel.clone()
    except (cl.Error, RuntimeError, AttributeError) as exc:
        clone_error: Exception = exc
    if len(state) < kernel.num_args:
        raise RuntimeError(
            f"KernelCapture: cannot record kernel {kernel.function_name!r}: the device cannot "
            f"clone kernels ({clone_error}) and only {len(state)} of its {kernel.num_args} "
            "arguments were set inside the capture; pass the arguments in the call"
        ) from clone_error
    fresh = cl.Kernel(kernel.program, kernel.function_name)
    for setter, payload, _ in state.values():
        setter(fresh, *payload)
    return fresh
