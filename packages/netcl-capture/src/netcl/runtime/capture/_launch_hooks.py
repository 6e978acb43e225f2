"""The three hooks every recorded launch goes through (``Kernel.__call__``, the pair-wise
argument setters pyopencl's invokers call, the driver's enqueue), written out with their notes
inlined: they run for every launch of every recording, so each saves what a call of a note
method would cost. The other hooks share ``_intercept._make_hook``.

Each calls pyopencl's function, then records; ``rec.busy`` covers the time between (see
``_intercept``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netcl.runtime.capture._recording import RawLaunch

__all__ = ["call_hook", "launch_hook", "pairs_hook"]

_new = tuple.__new__  # a NamedTuple from a tuple in one C call



def launch_hook(orig: Callable[..., Any], tls: Any) -> Callable[..., Any]:
    """The driver's ``enqueue_nd_range_kernel`` (pyopencl's parameters and defaults): records
    the launch on a recording thread."""

    def enqueue_nd_range_kernel(
        queue: Any, kernel: Any, global_work_size: Any, local_work_size: Any,
        global_work_offset: Any = None, wait_for: Any = None, g_times_l: bool = False,
        allow_empty_ndrange: bool = False,
    ) -> Any:  # fmt: skip
        rec = tls.rec
        if rec is None or not rec.live:
            return orig(queue, kernel, global_work_size, local_work_size, global_work_offset,
                        wait_for, g_times_l, allow_empty_ndrange)  # fmt: skip
        rec.busy += 1
        try:
            event = orig(queue, kernel, global_work_size, local_work_size, global_work_offset,
                         wait_for, g_times_l, allow_empty_ndrange)  # fmt: skip
        except Exception:
            rec.busy -= 1
            raise
        state = rec.kernels.get(id(kernel)) or rec._state(kernel)
        s = state.shape
        # the last launch's shape when the same objects come again (the common loop)
        if not (s is not None and s[7] is state.snapshot and s[1] is queue
                and s[2] is global_work_size and s[3] is local_work_size
                and s[4] is global_work_offset and s[5] is g_times_l
                and s[6] is allow_empty_ndrange):  # fmt: skip
            s = rec.new_shape(state, kernel, queue, global_work_size, local_work_size,
                              global_work_offset, g_times_l, allow_empty_ndrange)  # fmt: skip
        call = None
        if rec.call_kernel is kernel:
            call, rec.call_kernel = rec.call_args, None
        rec.raw.append(_new(RawLaunch, (s, tuple(wait_for) if wait_for else (), event, call)))
        rec.busy -= 1
        return event

    return enqueue_nd_range_kernel


def pairs_hook(orig: Callable[..., Any], tls: Any) -> Callable[..., Any]:
    """``Kernel._set_arg_multi`` / ``_set_arg_buf_multi(flat)`` (what the invokers call):
    records the arguments on a recording thread, unless they are the same call as last time
    (same objects, equal scalars; a memory object compares by address, and a retained one
    keeps its address)."""

    def hook(kernel: Any, flat: tuple[Any, ...]) -> None:
        rec = tls.rec
        if rec is None or not rec.live:
            return orig(kernel, flat)  # type: ignore[no-any-return]
        rec.busy += 1
        try:
            orig(kernel, flat)
        except Exception:
            rec.busy -= 1
            raise
        state = rec.kernels.get(id(kernel))
        last = None if state is None else state.last
        try:
            same = last is not None and last[0] is orig and last[1] == flat
        except ValueError:  # an array argument: noted the long way
            same = False
        if not same:
            rec.note_pairs(orig, kernel, flat)
        rec.busy -= 1
        return None

    return hook


def call_hook(orig: Callable[..., Any], tls: Any) -> Callable[..., Any]:
    """``Kernel.__call__``: lends its arguments to the launch the invoker then enqueues (taken
    by ``launch_hook``, which also sees the wait list the invoker adds for array
    arguments)."""

    def hook(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        rec = tls.rec
        if rec is None or not rec.live:
            return orig(kernel, *args, **kwargs)
        rec.call_kernel = kernel
        rec.call_args = args
        try:
            return orig(kernel, *args, **kwargs)
        except BaseException:
            rec.call_kernel = None  # no launch took them
            raise

    return hook
