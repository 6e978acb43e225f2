"""Buffer substitution for one replay: which recorded commands use each buffer, and the checks a
substitution map passes before anything is enqueued: a replacement is a memory object of the
recorded one's kind and context, large enough for every command using it (a kernel argument: the
recorded size; a read, write, copy or fill: its offset plus byte count; rectangles and images: the
recorded size), and no recorded copy comes to copy between overlapping ranges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import pyopencl as cl

from netcl.core.contract import mem_ptr
from netcl.core.tensor import Tensor
from netcl.runtime.capture._recording import Op, RawLaunch, RawTransfer

__all__ = ["BufferIndex", "BufferUse"]

_WHO = "KernelCapture.replay_with_new_buffers"


class _Need(NamedTuple):  # the most bytes of a buffer one command touches, what, which
    nbytes: int
    what: str
    op: int


class _Bound(Protocol):  # what the index reads of a launch's _program.BoundLaunch
    kernel: cl.Kernel  # the replay kernel
    buffers: tuple[tuple[int, cl.MemoryObjectHolder], ...]  # (argument index, buffer)


class BufferUse:
    """A recorded buffer and where the recording used it."""

    __slots__ = ("buffer", "kernel_args", "need", "ops", "transfers")

    def __init__(self, buffer: cl.MemoryObjectHolder) -> None:
        self.buffer = buffer  # the recording's own reference
        self.kernel_args: dict[tuple[cl.Kernel, int], None] = {}  # (replay kernel, index)
        self.ops: dict[int, None] = {}  # indices of the commands using it
        self.transfers = False  # a copy or fill uses it
        self.need: _Need | None = None  # computed on first validation


class BufferIndex:
    """Every recorded buffer (by ``int_ptr``) with its uses."""

    def __init__(self, ops: Sequence[Op], binds: Mapping[int, _Bound]) -> None:
        self.ops = ops
        self.uses: dict[int, BufferUse] = {}
        seen: set[int] = set()
        for i, op in enumerate(ops):
            if isinstance(op, RawLaunch):
                # launches of one shape use the same buffers the same way: the first stands
                # for all of them
                if id(op.shape) in seen:
                    continue
                seen.add(id(op.shape))
                bound = binds[id(op.shape)]
                for index, buf in bound.buffers:
                    self._use(buf, i).kernel_args[(bound.kernel, index)] = None
            elif isinstance(op, RawTransfer):
                for _, buf in op.buffers:
                    self._use(buf, i).transfers = True

    def _use(self, buf: cl.MemoryObjectHolder, op: int) -> BufferUse:
        if (use := self.uses.get(ptr := mem_ptr(buf))) is None:  # not setdefault: two dicts
            use = self.uses[ptr] = BufferUse(buf)  # made for nothing on every later use
        use.ops[op] = None
        return use

    def validate(self, buffer_map: Mapping[int, Any]) -> dict[int, cl.MemoryObjectHolder]:
        """Check a substitution map against every recorded command using each buffer; raise
        before anything is enqueued. Returns recorded int_ptr -> replacement."""
        subst = {key: self._check(key, value) for key, value in buffer_map.items()}
        self._check_overlaps(subst)
        return subst

    def _check(self, key: Any, value: Any) -> cl.MemoryObjectHolder:
        if isinstance(key, bool) or not isinstance(key, int):
            raise TypeError(
                f"{_WHO}: keys must be cl.Buffer.int_ptr values (int), got "
                f"{type(key).__name__} {key!r}"
            )
        if (use := self.uses.get(key)) is None:
            known = ", ".join(hex(k) for k in list(self.uses)[:8]) or "none"
            raise ValueError(
                f"{_WHO}: key {key:#x} matches no buffer of the recorded arguments "
                f"(recorded buffers: {known}{', ...' if len(self.uses) > 8 else ''})"
            )
        new, old = value.buffer if isinstance(value, Tensor) else value, use.buffer
        it = f"{_WHO}: the replacement for {key:#x}"
        if not isinstance(new, cl.MemoryObjectHolder):
            raise TypeError(f"{it} must be a cl.Buffer (or Tensor), got {type(value).__name__}")
        if isinstance(new, cl.Image) != isinstance(old, cl.Image):
            raise TypeError(
                f"{it} is a {type(new).__name__}, the recorded object a {type(old).__name__}"
            )
        if new.context.int_ptr != old.context.int_ptr:
            raise ValueError(f"{it} belongs to another OpenCL context than the recorded buffer")
        need = self._need(key, use)
        if int(new.size) < need.nbytes:
            raise ValueError(
                f"{it} holds {int(new.size)} bytes, but recorded command {need.op} "
                f"({need.what}) uses {need.nbytes} bytes of it (the recorded buffer "
                f"holds {int(old.size)})"
            )
        return new

    def _need(self, key: int, use: BufferUse) -> _Need:
        if use.need is None:
            size = int(use.buffer.size)
            found = (_Need(*_extent(self.ops[i], key, size), i) for i in use.ops)
            use.need = max(found, key=lambda n: n.nbytes, default=_Need(0, "", -1))
        return use.need

    def _check_overlaps(self, subst: Mapping[int, cl.MemoryObjectHolder]) -> None:
        """No recorded copy may read and write overlapping bytes of one buffer after the
        substitution (OpenCL refuses such a copy, in the middle of the replay)."""
        ops = {i for key in subst for i in self.uses[key].ops if type(self.ops[i]) is RawTransfer}
        for i in sorted(ops):
            op = self.ops[i]
            assert isinstance(op, RawTransfer)
            clash = _overlap(op, subst)
            if clash is not None:
                a, b, target = clash
                names = [
                    f"key {p:#x}" if p in subst else f"the recorded buffer {p:#x}" for p in (a, b)
                ]
                raise ValueError(
                    f"{_WHO}: {names[0]} and {names[1]} would both be buffer "
                    f"{target:#x}, and recorded command {i} ({op.entry.operation}) "
                    "copies from one to the other: its source and destination "
                    "would overlap (OpenCL refuses such a copy); map the keys to "
                    "different buffers"
                )


def _extent(op: Op, key: int, recorded: int) -> tuple[int, str]:
    """Bytes of buffer ``key`` that recorded command ``op`` touches, and what it is."""
    if isinstance(op, RawLaunch):
        return recorded, f"kernel {op.shape.kernel.function_name!r}"
    if not isinstance(op, RawTransfer):
        return 0, "finish"
    entry = op.entry
    if not entry.operands:  # rectangles and images: the whole recorded object
        return recorded, entry.operation
    bound = op.bound()
    need = 0
    for operand in entry.operands:
        mem = bound.get(operand.mem)
        if mem is None or mem_ptr(mem) != key:
            continue
        count = (
            memoryview(bound[operand.host]).nbytes if operand.host else int(bound[operand.count])
        )
        need = max(need, int(bound.get(operand.offset) or 0) + count)
    return need, entry.operation


def _overlap(
    op: RawTransfer, subst: Mapping[int, cl.MemoryObjectHolder]
) -> tuple[int, int, int] | None:
    """(recorded source, recorded destination, the buffer both become) when the substitution
    makes a copy's source and destination overlapping parts of one buffer."""
    bound = op.bound()
    mems = [(name, bound.get(name)) for name in ("src", "dst", "dest")]
    found = [(name, mem_ptr(m)) for name, m in mems if isinstance(m, cl.MemoryObjectHolder)]
    if len(found) != 2:
        return None
    (_, src), (_, dst) = found
    new_src, new_dst = (mem_ptr(subst[p]) if p in subst else p for p in (src, dst))
    if new_src != new_dst or src == dst:  # a copy within one buffer ran in the recording
        return None
    operands = op.entry.operands
    if len(operands) == 2:  # linear: overlapping byte ranges only
        (a, b) = ((int(bound.get(o.offset) or 0), int(bound[o.count])) for o in operands)
        if a[0] + a[1] <= b[0] or b[0] + b[1] <= a[0]:
            return None
    return src, dst, new_src
