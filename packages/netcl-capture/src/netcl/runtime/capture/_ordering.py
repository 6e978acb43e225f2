"""The order of a replay that spans queues, an out-of-order queue or contexts (guide, "How
it works": Ordering, Several contexts, Host-side waits, Flushes).

A command depends on the commands whose events it, or the host before issuing it, waited on in
the recording (on an in-order queue a host wait's dependencies are taken once). Within one
context a dependency is a device-side wait; on another context's command it is a host-side
wait, once per replay; a queue is flushed before another queue's command waits on it. The
replay returns a marker on the last command's queue, after waiting on the host for the other
contexts' last commands.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import pyopencl as cl

from netcl.core import device
from netcl.core.contract import queue_ptr
from netcl.runtime.capture._recording import Op, RawFinish

__all__ = ["Issue", "Schedule", "schedule"]


class Issue(NamedTuple):
    """How one command is issued: after flushing ``flushes`` and waiting on the host for the
    replayed events of ``host`` (a group per other context), waiting on those of ``deps``."""

    deps: tuple[int, ...]
    host: tuple[tuple[int, ...], ...]
    flushes: tuple[cl.CommandQueue, ...]


class Schedule(NamedTuple):
    """How every command is issued, and what the replay does after the last command."""

    issues: tuple[Issue, ...]
    final_queue: cl.CommandQueue | None  # where the returned marker goes (None: no events)
    final_sinks: tuple[int, ...]  # the commands the marker waits for
    final_flushes: tuple[cl.CommandQueue, ...]  # queues flushed before the marker
    other_sinks: tuple[tuple[int, ...], ...]  # host-waited last commands, per other context


def schedule(ops: Sequence[Op], host_waits: Sequence[tuple[int, tuple[cl.Event, ...]]]) -> Schedule:
    """How to issue the commands of a replay of ``ops``; ``host_waits`` holds the (index of
    the first command issued after it, events) of every recorded host-side wait."""
    waits = [() if isinstance(op, RawFinish) else op.wait_for for op in ops]
    events = [None if isinstance(op, RawFinish) else op.event for op in ops]
    producer = {ev.int_ptr: i for i, ev in enumerate(events) if isinstance(ev, cl.Event)}
    keys = [queue_ptr(op.queue) for op in ops]
    queues = dict(zip(keys, (op.queue for op in ops), strict=True))
    context = {k: q.context.int_ptr for k, q in queues.items()}  # queue int_ptr -> context's
    in_order = {k: not device.out_of_order(q) for k, q in queues.items()}
    ctx = [context[k] for k in keys]
    fences: list[int] = []  # producers of host-waited events, in order of the waits
    fenced: dict[int, int] = {}  # in-order queue -> how many fences its commands took
    pending = deque(host_waits)
    dirty: dict[int, cl.CommandQueue] = {}  # queues with commands issued since their flush
    on_host: set[int] = set()  # commands an earlier command waited for on the host
    waited: set[int] = set()  # commands some later command waits for on the device
    issues: list[Issue] = []
    for i, op in enumerate(ops):
        while pending and pending[0][0] <= i:
            at, seen = pending.popleft()
            fences += [d for d in (producer.get(e.int_ptr, -1) for e in seen) if 0 <= d < at]
        key = keys[i]
        if isinstance(op, RawFinish):  # replayed as a host-side finish: it flushes its queue
            dirty.pop(key, None)
            issues.append(Issue((), (), ()))
            continue
        deps = {producer.get(w.int_ptr, -1) for w in waits[i] if isinstance(w, cl.Event)}
        if in_order[key]:
            deps.update(d for d in fences[fenced.get(key, 0) :] if keys[d] != key)
            fenced[key] = len(fences)
        else:
            deps.update(fences)
        deps = {d for d in deps if 0 <= d < i}
        on_device = tuple(sorted(d for d in deps if ctx[d] == ctx[i]))
        host = sorted(d for d in deps if ctx[d] != ctx[i] and d not in on_host)
        on_host.update(host)
        waited.update(on_device)
        flushes = tuple(
            dirty.pop(keys[d]) for d in (*on_device, *host) if keys[d] in dirty and keys[d] != key
        )
        issues.append(Issue(on_device, _by_context(host, ctx), flushes))
        dirty[key] = op.queue
    return _closing(ops, issues, ctx, context, dirty, waited | on_host, events)


def _by_context(indices: Sequence[int], ctx: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """``indices`` grouped by context (one host wait may name one context's events only)."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(ctx[i], []).append(i)
    return tuple(tuple(g) for g in groups.values())


def _closing(
    ops: Sequence[Op],
    issues: list[Issue],
    ctx: Sequence[int],
    context: dict[int, int],
    dirty: dict[int, cl.CommandQueue],
    covered: set[int],
    events: Sequence[Any],
) -> Schedule:
    """The schedule with what follows the last command: the marker over the last command's
    context, the host waits for the other contexts' last commands."""
    last = next((i for i in reversed(range(len(ops))) if events[i] is not None), None)
    if last is None:
        return Schedule(tuple(issues), None, (), (), ())
    sinks = [i for i, e in enumerate(events) if e is not None and i not in covered]
    mine = tuple(i for i in sinks if ctx[i] == ctx[last])
    last_queue = ops[last].queue
    flushes = tuple(
        q for k, q in dirty.items() if k != queue_ptr(last_queue) and context[k] == ctx[last]
    )
    others = _by_context([i for i in sinks if ctx[i] != ctx[last]], ctx)
    return Schedule(tuple(issues), last_queue, mine, flushes, others)
