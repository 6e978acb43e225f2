"""A capture's own memory. At ``end()`` the buffers that nothing outside the capture can reach
any more (temporaries the code dropped, blocks it released to a BufferPool) move into an arena
of the capture's own, placed by their lifetimes with the planner the graph uses (on GPUs: in
slots of one size, see _may_overlap), so that a capture holds about the peak memory of the code
it replays and no pool hands out memory a replay still writes. What cannot be proved safe stays
where it was (the capture guide lists it)."""

from __future__ import annotations

import operator
import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from netcl.core import contract, device, packing
from netcl.runtime.capture import _telemetry as tm
from netcl.runtime.capture._recording import (
    ArgSet,
    LaunchShape,
    RawHostWait,
    RawLaunch,
    RawTransfer,
    Recording,
    buffers_of,
)

__all__ = ["Arena", "CaptureMemory", "SharedArena", "plan", "queues_of", "relocate"]

_ptr = contract.mem_ptr
_new = tuple.__new__
_HOST = cl.mem_flags.USE_HOST_PTR | cl.mem_flags.COPY_HOST_PTR


@dataclass(frozen=True)
class CaptureMemory:
    """The device memory a capture holds. ``arena_bytes``: its private arena, where the
    ``internal`` buffers live (``internal_bytes`` before planning: what they took as recorded);
    ``external`` buffers of ``external_bytes`` it refers to where the application keeps them
    (inputs, outputs, weights: memory the application holds anyway)."""

    arena_bytes: int
    internal: int
    internal_bytes: int
    external: int
    external_bytes: int


def _refs(holder: list[Any]) -> int:
    """``sys.getrefcount`` of the one object ``holder`` hands over, read from this function's
    local. Both the calibration (_ALONE, a fresh object) and every candidate go through this
    same code, so what it relies on is only that one interpreter counts the same bytecode the
    same way: CPython 3.12 to 3.14 changed how locals' references on the stack are counted
    (3.14 borrows them), which moves both readings alike. tests/capture/test_memory_births.py
    checks it on the Python that runs them."""
    obj = holder.pop()
    return sys.getrefcount(obj)


_ALONE = _refs([object()])  # what _refs reads for an object no one else holds


@dataclass(frozen=True)
class Arena:
    """The arena of one capture: its buffer per context (kept alive by the replay's
    sub-buffers too) and the figures; ``kept``: the application's objects (and pool blocks) of
    the buffers that existed at begin(), held so that no pool hands their memory out again."""

    buffers: tuple[cl.Buffer, ...]
    memory: CaptureMemory
    kept: tuple[Any, ...] = ()


def _uses(raw: Sequence[Any]) -> Iterator[tuple[int, cl.MemoryObjectHolder]]:
    """(command index, buffer) for every memory object each recorded command uses."""
    i = -1
    shape: Any = None
    bufs: list[cl.MemoryObjectHolder] = []
    for op in raw:
        if type(op) is RawLaunch:
            i += 1
            if op.shape is not shape:
                shape = op.shape
                bufs = [b for _, b in buffers_of(shape.args)]
            for buf in bufs:
                yield i, buf
        elif type(op) is RawTransfer:
            i += 1
            for _, buf in op.buffers:
                yield i, buf


def _internal(rec: Recording) -> tuple[dict[int, cl.MemoryObjectHolder], list[Any]]:
    """The recorded buffers the capture may move (by int_ptr): born while recording, and
    nothing outside the capture can reach them. And what it keeps of the buffers that existed
    at begin(): their contents are an input of every replay, so the application's objects stay
    alive with the capture (a pyopencl pool block never goes back to its pool), and the blocks a
    BufferPool holds again are taken out of it."""
    kept: list[Any] = []
    # a raw handle reached: native work may use what the capture saw born (buffers set as
    # kernel arguments before begin() existed then: never born)
    born = set() if rec.native else rec.born
    free = device.held_blocks()
    found: dict[int, cl.MemoryObjectHolder] = {}
    # transfers the contract gives no operands (rectangles, images) stay off sub-buffers:
    # PoCL crashes copying a rectangle out of one, or an image into one
    stay = {
        _ptr(b)
        for op in rec.raw
        if type(op) is RawTransfer and not op.entry.operands
        for _, b in op.buffers
    }
    users = rec.users
    for state in rec.kernels.values():
        state.last = None  # a kernel's last arguments as passed: the application's objects
    for ptr in list(users):
        own = rec.mems[ptr]
        # a sub-buffer (made by get_sub_region: never born) keeps its parent where it is
        if (parent := own.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)) is not None:
            stay.add(_ptr(parent))
        if ptr not in born:
            kept.append(users.pop(ptr))
            continue
        # the application's object goes with the reading: a pool block back to its pool
        alone = ptr in free or _refs([users.pop(ptr)]) <= _ALONE
        if alone and not own.get_info(cl.mem_info.FLAGS) & _HOST:  # contents from the host
            found[ptr] = own
    for ptr in stay:
        found.pop(ptr, None)
    kept.extend(device.claim_held({p for p in free if p in rec.mems and p not in found}))
    return found, kept


def _may_overlap(ctx: cl.Context) -> bool:
    """Whether one arena's regions may partly overlap: on CPU devices. Not on NVIDIA's driver,
    which crashes the process releasing partly overlapping sub-buffers that kernels used (seen
    on the H100, 2026-12-05), nor on other GPUs (untested): there the buffers of one size whose
    lifetimes follow each other share one buffer of the capture's (a slot), and slots of
    several captures of a step are shared by size."""
    return all(d.type & cl.device_type.CPU for d in ctx.devices)


def _by_size(
    ptrs: list[int], size: Mapping[int, int], first: Mapping[int, int], last: Mapping[int, int]
) -> list[list[int]]:
    """Groups of buffers of one size whose lifetimes follow each other (each group one region)."""
    groups: list[list[int]] = []
    open_: dict[int, list[list[int]]] = {}  # size -> its groups
    for p in sorted(ptrs, key=first.__getitem__):
        same = open_.setdefault(size[p], [])
        group = next((g for g in same if last[g[-1]] < first[p]), None)
        if group is None:
            group = []
            groups.append(group)
            same.append(group)
        group.append(p)
    return groups


def queues_of(raw: Sequence[Any]) -> tuple[dict[int, cl.CommandQueue], bool]:
    """The distinct queues of recorded commands (by int_ptr), and whether they are one in-order
    queue, where queue order is every dependency there is."""
    by_id = {id(op.queue): op.queue for op in raw if type(op) is not RawHostWait}
    queues = {contract.queue_ptr(q): q for q in by_id.values()}
    return queues, len(queues) <= 1 and not any(map(device.out_of_order, queues.values()))


class SharedArena:
    """One arena for captures that never run at the same time (a captured step's, each on one
    in-order queue): it is as large as the largest plan, not their sum. When a capture needs
    more, a larger buffer replaces it and the earlier captures' commands move onto it."""

    def __init__(self) -> None:
        self.buffers: dict[int, cl.Buffer] = {}  # by queue int_ptr
        self.users: weakref.WeakSet[Any] = weakref.WeakSet()  # programs (rebase(old, new))
        self.slots: dict[tuple[int, int], list[cl.Buffer]] = {}  # (queue, bytes) -> slots

    def slot(self, queue: cl.CommandQueue, nbytes: int, k: int) -> cl.Buffer:
        """The ``k``-th slot of ``nbytes`` for captures on ``queue`` (see _may_overlap)."""
        have = self.slots.setdefault((contract.queue_ptr(queue), nbytes), [])
        while len(have) <= k:
            have.append(_arena_buffer(queue.context, nbytes))
        return have[k]

    def take(self, queue: cl.CommandQueue, nbytes: int) -> cl.Buffer:
        """A buffer of at least ``nbytes`` for captures on ``queue``."""
        key = contract.queue_ptr(queue)
        if (old := self.buffers.get(key)) is not None and int(old.size) >= nbytes:
            return old
        new = self.buffers[key] = _arena_buffer(queue.context, nbytes)
        if old is not None:
            for program in list(self.users):
                program.rebase(old, new)
        return new


def plan(
    rec: Recording,
    queues: Mapping[int, cl.CommandQueue],
    ordered: bool,
    shared: SharedArena | None = None,
) -> Arena:
    """Move the recording's internal buffers into an arena (or slots, see _may_overlap) and
    rewrite its commands to use it. On one in-order queue buffers with disjoint lifetimes share
    memory (in ``shared``'s buffers for that queue, where given); across queues (or on an
    out-of-order one) each keeps a region of its own: only recorded events order them.
    ``queues`` and ``ordered``: what :func:`queues_of` says of the recording."""
    internal, kept = _internal(rec)
    rec.users.clear()
    external = {p: b for p, b in rec.mems.items() if p not in internal}
    ext_bytes = sum(int(b.size) for b in external.values())
    if not internal:
        return Arena((), CaptureMemory(0, 0, 0, len(external), ext_bytes), tuple(kept))
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    end = 0
    for i, buf in _uses(rec.raw):
        ptr = _ptr(buf)
        if ptr in internal:
            first.setdefault(ptr, i)
            last[ptr] = i
        end = i
    moved: dict[int, cl.MemoryObjectHolder] = {}
    buffers: list[cl.Buffer] = []
    by_context: dict[int, list[int]] = {}
    for ptr, own in internal.items():
        by_context.setdefault(own.context.int_ptr, []).append(ptr)
    total = 0
    home = shared if ordered else None  # on several queues nothing orders captures' commands
    queue = next(iter(queues.values()))
    for ptrs in by_context.values():
        ctx = internal[ptrs[0]].context
        size = {p: int(internal[p].size) for p in ptrs}
        if not _may_overlap(ctx):  # a slot per group of one size, shared with a step's keys
            taken: dict[int, int] = {}
            for group in _by_size(ptrs, size, first, last) if ordered else [[p] for p in ptrs]:
                n = size[group[0]]
                k = taken[n] = taken.get(n, -1) + 1
                buf = _arena_buffer(ctx, n) if home is None else home.slot(queue, n, k)
                moved.update(dict.fromkeys(group, buf))
                buffers.append(buf)
                total += n
            continue
        align = max(int(ctx.devices[0].mem_base_addr_align) // 8, 1)
        items = [
            packing.Interval(
                *((first[p], last[p]) if ordered else (0, end)), -(-size[p] // align) * align
            )
            for p in ptrs
        ]
        placed = packing.place(items)
        nbytes = max(placed.arena_bytes, 1)
        arena = _arena_buffer(ctx, nbytes) if home is None else home.take(queue, nbytes)
        buffers.append(arena)
        total += placed.arena_bytes
        regions: dict[tuple[int, int], cl.Buffer] = {}  # one per place: fewer replay kernels
        for p, at in zip(ptrs, placed.offsets, strict=True):
            if (region := regions.get((at, size[p]))) is None:
                region = regions[at, size[p]] = arena.get_sub_region(at, size[p])
            moved[p] = region
    relocate(rec.raw, moved)
    before = sum(int(b.size) for b in internal.values())
    for ptr in internal:
        del rec.mems[ptr]  # the recorded buffers go: freed, or back to their pools
    memory = CaptureMemory(total, len(internal), before, len(external), ext_bytes)
    return Arena(tuple(buffers), memory, tuple(kept))


def _arena_buffer(ctx: cl.Context, nbytes: int) -> cl.Buffer:
    """An arena's buffer, counted in the ``netcl.capture.arena_bytes`` gauge while it lives."""
    buf = _Counted(ctx, cl.mem_flags.READ_WRITE, nbytes)
    tm.ARENA.add(nbytes)
    weakref.finalize(buf, tm.ARENA.add, -nbytes)
    return buf


class _Counted(cl.Buffer):  # type: ignore[misc]
    """A buffer a finalizer can watch (pyopencl's own take no weak references)."""

    __slots__ = ("__weakref__",)


def relocate(raw: list[Any], moved: Mapping[int, cl.MemoryObjectHolder]) -> dict[int, Any]:
    """Rewrite the commands in ``raw`` so that ``moved`` buffers (by int_ptr) are their arena
    regions; shapes and argument tables shared between launches stay shared. Returns
    id(old shape) -> its shape now (the same object where nothing moved)."""
    shapes: dict[int, LaunchShape] = {}
    snaps: dict[int, tuple[ArgSet, ...]] = {}
    for k, op in enumerate(raw):
        if type(op) is RawLaunch:
            if (shape := shapes.get(id(op.shape))) is None:
                old = op.shape
                if (snap := snaps.get(id(old.args))) is None:
                    snap = snaps[id(old.args)] = tuple(_moved_arg(a, moved) for a in old.args)
                same = not any(map(operator.is_not, snap, old.args))
                shape = shapes[id(old)] = old if same else old._replace(args=snap)
            if shape is not op.shape:
                raw[k] = _new(RawLaunch, (shape, op.wait_for, op.event))
        elif type(op) is RawTransfer and any(_ptr(b) in moved for _, b in op.buffers):
            args, kwargs = op.substituted(moved)
            where = tuple((w, moved.get(_ptr(b), b)) for w, b in op.buffers)
            raw[k] = op._replace(args=args, kwargs=kwargs, buffers=where)
    return shapes


def _moved_arg(arg: ArgSet, moved: Mapping[int, cl.MemoryObjectHolder]) -> ArgSet:
    """``arg`` with its moved buffers swapped (itself where none moved: the common case, kept
    cheap for end() of long captures)."""
    payload = list(arg.payload)
    hit = False
    for j, p in enumerate(payload):
        if type(p) is tuple:  # a packed call's arguments
            swapped = tuple(
                moved.get(_ptr(v), v) if isinstance(v, cl.MemoryObjectHolder) else v for v in p
            )
            if any(map(operator.is_not, swapped, p)):
                payload[j], hit = swapped, True
        elif isinstance(p, cl.MemoryObjectHolder) and (to := moved.get(_ptr(p))) is not None:
            payload[j], hit = to, True
    return arg._replace(payload=tuple(payload)) if hit else arg
