"""The replay's hot loops: everything a replay enqueues goes through one of the two functions
here, and they call pyopencl's own driver entry points (never a capture hook).

- ``run_segments``: a capture on one in-order queue. Consecutive plain launches are one segment
  driven by ``itertools.starmap`` over the driver entry point, so Python does no work per
  launch; a copy, fill or launch with keywords is a pre-bound ``functools.partial``.
- ``run_scheduled``: a capture spanning queues, an out-of-order queue or contexts: command by
  command, with the flushes, host waits and wait lists of its ``Schedule`` step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from itertools import starmap
from typing import Any

import pyopencl as cl

from netcl.runtime.capture import _contract
from netcl.runtime.capture._ops import Binds, Op, TransferOp, substituted
from netcl.runtime.capture._ordering import Schedule
from netcl.runtime.capture._recording import RawLaunch

__all__ = ["Segment", "run_scheduled", "run_segments", "run_segments_kept", "segments"]

_enqueue = _contract.enqueue_nd_range_kernel
_finish = _contract.finish
_flush = _contract.flush
_marker = _contract.marker
_wait = _contract.wait_for_events

# (callable, argument tuples): a run of plain launches, or one call
Segment = tuple[Callable[..., Any], list[tuple[Any, ...]]]


def run_segments(segments: Sequence[Segment]) -> cl.Event | None:
    """Enqueue every segment in order; the last command's event (None if there are none)."""
    last: deque[Any] | None = None
    for fn, calls in segments:
        last = deque(starmap(fn, calls), 1)
    return last[0] if last else None


def run_segments_kept(segments: Sequence[Segment], keep: list[Any]) -> cl.Event | None:
    """``run_segments`` keeping every command's event in ``keep`` (a profiled replay: the
    device-time collector reads them later); the last one is returned."""
    for fn, calls in segments:
        keep += starmap(fn, calls)
    return keep[-1] if keep else None


def segments(
    ops: Sequence[Op], binds: Binds, subst: Mapping[int, cl.MemoryObjectHolder] | None = None
) -> list[Segment]:
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
        elif type(op) is TransferOp:
            args, kwargs = substituted(op, subst or {})
            found.append((partial(op.fn, *args, **kwargs), [()]))
        else:
            continue
        run = None
    return found


def run_scheduled(
    ops: Sequence[Op], binds: Binds, plan: Schedule,
    subst: Mapping[int, cl.MemoryObjectHolder], keep: list[Any] | None = None,
) -> cl.Event | None:  # fmt: skip
    """Enqueue every command with its step of ``plan``; an event that completes when all of
    them have (None if there are none). ``keep`` (a profiled replay) gets every command's
    event, in order."""
    events: list[Any] = []
    for op, step in zip(ops, plan.steps, strict=True):
        for queue in step.flushes:
            _flush(queue)
        for group in step.host:  # another context's commands this one comes after
            _wait([events[d] for d in group])
        wait = [events[d] for d in step.deps] or None
        if type(op) is RawLaunch:
            bound = binds[id(op.shape)]
            event = _enqueue(*bound.call, wait, False, bool(bound.flags))
        elif type(op) is TransferOp:
            event = _transfer(op, subst, wait)
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


def _transfer(
    op: TransferOp, subst: Mapping[int, cl.MemoryObjectHolder], wait: list[Any] | None
) -> Any:
    args, kwargs = substituted(op, subst)
    if wait is not None:
        at = op.entry.wait_for
        if at < len(args):
            args = (*args[:at], wait, *args[at + 1 :])
        else:
            kwargs = {**kwargs, "wait_for": wait}
    return op.fn(*args, **kwargs)
