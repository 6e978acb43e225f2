"""The pieces of a captured step: the guard key of a call, why a key differs from another, and
one capture of the step with its substitution plan and output plan.

A guard key is a tuple with one part per argument: ``("Tensor", shape, dtype, queue)``,
``("Array", shape, dtype, strides, offset, queue)`` or ``(type, value)``, then, when keyword
arguments were given, ``("keywords", names)``, and, when two Tensor arguments share a buffer,
``("aliasing", pattern)``. Building it also collects the buffers of the Tensor arguments and
their ``int_ptr`` (the replay needs them anyway), in argument order.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import pyopencl as cl
import pyopencl.array as cla

from netcl.core.tensor import Tensor
from netcl.runtime.capture import KernelCapture

__all__ = [
    "Capture", "GuardKey", "change_reason", "check_options", "guard", "labels",
    "positional_names", "unhashable_error",
]

GuardKey = tuple[Any, ...]
_Array = cla.Array
_TENSOR, _ARRAY, _KEYWORDS, _ALIASING = "Tensor", "Array", "keywords", "aliasing"


def guard(
    flat: tuple[Any, ...], names: tuple[str, ...] | None
) -> tuple[GuardKey, list[Any], list[int]]:
    """The guard key of a call's arguments (positional, then keyword values in ``names``
    order), the buffers of its Tensor and Array arguments and their ``int_ptr`` values."""
    parts: list[Any] = []
    bufs: list[Any] = []
    for a in flat:
        t = type(a)
        if t is Tensor or (t is not _Array and isinstance(a, Tensor)):
            bufs.append(a.buffer)
            parts.append((_TENSOR, a.shape, a.dtype, a.queue))
        elif t is _Array or isinstance(a, _Array):
            base = a.base_data
            if base is not None:  # an empty array has no buffer
                bufs.append(base)
            parts.append((_ARRAY, a.shape, a.dtype, a.strides, a.offset, a.queue))
        else:
            parts.append((t, a))
    if names is not None:
        parts.append((_KEYWORDS, names))
    ptrs = [b.int_ptr for b in bufs]
    if len(ptrs) > 1 and len(set(ptrs)) < len(ptrs):
        parts.append((_ALIASING, tuple(ptrs.index(p) for p in ptrs)))
    return tuple(parts), bufs, ptrs


def unhashable(key: GuardKey, labels: Sequence[str]) -> str | None:
    """The label of the first argument whose value cannot be hashed (None if all can)."""
    for part, label in zip(key, labels, strict=False):
        try:
            hash(part)
        except TypeError:
            return label
    return None


def labels(params: list[str], varargs: str | None, npos: int,
           names: tuple[str, ...] | None) -> tuple[str, ...]:
    """What messages call each argument of a call with ``npos`` positional arguments and
    keyword arguments ``names``: parameter names, then ``args[i]`` for the rest."""
    rest = varargs or "args"
    pos = [params[i] if i < len(params) else f"{rest}[{i - len(params)}]" for i in range(npos)]
    return (*pos, *(names or ()))


def unhashable_error(step: str, key: GuardKey, labels: Sequence[str]) -> TypeError:
    """The error for a call whose key cannot be hashed, naming the argument."""
    label = unhashable(key, labels) or "?"
    value = key[list(labels).index(label)][1] if label in labels else None
    return TypeError(
        f"captured step {step}: argument {label} is an unhashable {type(value).__name__}; a "
        "captured step keys its captures on the values of its non-Tensor arguments, so they "
        "must be hashable: pass a tuple instead of a list, a Tensor instead of a numpy array, "
        "or read the value from outside the step"
    )


def positional_names(fn: Callable[..., Any]) -> tuple[list[str], str | None]:
    """Names of ``fn``'s positional parameters and of its ``*args`` (for messages)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return [], None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in params if p.kind in kinds]
    varargs = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    return names, varargs


def check_options(fn: Any, warmup: Any, max_captures: Any, check_atol: Any, name: Any) -> None:
    """Raise naming the option when an option of capture_step is not valid."""
    if not callable(fn):
        raise TypeError(f"capture_step: expected a callable step function, got "
                        f"{type(fn).__name__} {fn!r}")
    for option, value, least in (("warmup", warmup, 0), ("max_captures", max_captures, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"capture_step: {option} must be an int >= {least}, got {value!r}")
    if isinstance(check_atol, bool) or not isinstance(check_atol, (int, float)) \
            or not 0 <= check_atol < math.inf:
        raise ValueError(f"capture_step: check_atol must be a finite number >= 0, got "
                         f"{check_atol!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"capture_step: name must be a non-empty str or None, got {name!r}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(part: tuple[Any, ...]) -> str:
    if part[0] == _TENSOR:
        return "a Tensor"
    if part[0] == _ARRAY:
        return "a pyopencl Array"
    return f"a {part[0].__name__}"


def _extras(key: GuardKey) -> dict[str, Any]:
    """The keyword-names and aliasing parts of a key (they follow the arguments' parts)."""
    return {p[0]: p[1] for p in key if p[0] in (_KEYWORDS, _ALIASING)}


def change_reason(old: GuardKey | None, new: GuardKey, labels: Sequence[str]) -> str:
    """Why ``new`` needs a capture of its own, compared with ``old`` (the key used last):
    the first difference, e.g. ``shape of x changed (4,) -> (8,)``."""
    if old is None:
        return "first capture"
    if old == new:
        return "recorded again (its capture had been dropped)"
    extra_old, extra_new = _extras(old), _extras(new)
    n_old, n_new = len(old) - len(extra_old), len(new) - len(extra_new)
    if extra_old.get(_KEYWORDS) != extra_new.get(_KEYWORDS):
        return (f"keyword arguments changed {extra_old.get(_KEYWORDS, ())} -> "
                f"{extra_new.get(_KEYWORDS, ())}")
    if n_old != n_new:
        return f"number of arguments changed {n_old} -> {n_new}"
    for a, b, label in zip(old[:n_new], new[:n_new], labels, strict=False):
        if a == b:
            continue
        if a[0] != b[0] or len(a) != len(b):
            return f"{label} changed from {_kind(a)} to {_kind(b)}"
        if a[0] in (_TENSOR, _ARRAY):
            return _tensor_change(a, b, label)
        return f"value of {label} changed {_short(a[1])} -> {_short(b[1])}"
    return "aliasing between Tensor arguments changed"


def _tensor_change(a: tuple[Any, ...], b: tuple[Any, ...], label: str) -> str:
    what = ("shape", "dtype", "queue") if a[0] == _TENSOR else (
        "shape", "dtype", "strides", "offset", "queue")
    for name, x, y in zip(what, a[1:], b[1:], strict=True):
        if x == y:
            continue
        if name == "queue":
            same_ctx = x is not None and y is not None and x.context == y.context
            return f"{'queue' if same_ctx else 'context'} of {label} changed"
        return f"{name} of {label} changed {_short(x)} -> {_short(y)}"
    return f"{label} changed"  # pragma: no cover - parts differ in some field


def _buffer_of(item: Any) -> Any:
    return item.buffer if isinstance(item, Tensor) else item.base_data


def _recorded_buffers(cap: KernelCapture) -> tuple[set[int], bool]:
    """``int_ptr`` of every buffer the recorded commands name, and whether some launch had its
    arguments set beforehand (its buffers are not listed)."""
    found: set[int] = set()
    hidden = False
    for command in cap.commands:
        values = list(command.args)
        kwargs = getattr(command, "kwargs", None)
        if kwargs is not None:
            values += kwargs.values()
        elif not values:
            hidden = True  # a launch through enqueue_nd_range_kernel with preset arguments
        for value in values:
            if isinstance(value, cl.MemoryObjectHolder):
                found.add(value.int_ptr)
            elif isinstance(value, _Array) and value.base_data is not None:
                found.add(value.base_data.int_ptr)
            elif isinstance(value, Tensor):
                found.add(value.buffer.int_ptr)
    return found, hidden


class Capture:
    """One recorded call of a step: its KernelCapture and, worked out once, which argument
    buffers to substitute, which buffers an argument must not alias, and how to build the
    result of a replay."""

    __slots__ = (
        "_outputs",
        "_shape",
        "arrays",
        "capture",
        "fast",
        "hazard",
        "key",
        "labels",
        "launches",
        "pending_check",
        "plain",
        "queues",
        "reason",
        "result",
        "scratch",
        "sizes",
        "slots",
    )  # fmt: skip

    def __init__(
        self,
        capture: KernelCapture,
        key: GuardKey,
        labels: tuple[str, ...],
        flat: tuple[Any, ...],
        bufs: list[Any],
        ptrs: list[int],
        result: Any,
        outputs: tuple[Any, ...],
    ) -> None:
        self.capture = capture
        self.key = key
        self.labels = labels
        self.launches = capture.num_launches
        self.pending_check = False  # check mode: the first replay also runs the step
        self.reason = ""
        self.result = result
        recorded, hidden = _recorded_buffers(capture)
        # (position among the buffer arguments, recorded int_ptr): the first argument of each
        # buffer the commands use (the key fixes the aliasing between arguments)
        slots: list[tuple[int, int]] = []
        for j, ptr in enumerate(ptrs):
            if ptr not in ptrs[:j] and (hidden or ptr in recorded):
                slots.append((j, ptr))
        self.slots = tuple(slots)
        self.sizes = [int(b.size) for b in bufs]
        # a buffer of the capture that is no argument of the recorded call (an output, an
        # intermediate): passed as an argument, the replay would overwrite it while reading it
        self.hazard = frozenset(recorded.difference(ptrs))
        first_queue = next((c.queue for c in capture.commands), None)
        self.queues = [
            next((a.queue for a in flat if _has_buffer(a, b)), None) or first_queue for b in bufs
        ]
        self.scratch: dict[int, Any] = {}
        self._outputs = tuple(_output_plan(outputs, flat, bufs, ptrs))
        # pyopencl arrays among the outputs: each replay gives them its event
        self.arrays = tuple(o for kind, o in self._outputs if kind == "fixed"
                            and isinstance(o, _Array))
        self._shape = type(result) if isinstance(result, (tuple, list)) else None
        # a replay returns the recorded result itself (no output is an argument, no list)
        self.plain = all(kind == "fixed" for kind, _ in self._outputs) and self._shape is not list
        # the call path written out for these arguments (set by the step)
        self.fast: Any = None

    def stage(self, j: int, buf: Any, size: int | None = None) -> Any:
        """A buffer of the capture's own holding a copy of argument buffer ``j`` (the argument
        aliases a buffer the replay writes, or is smaller than the recorded one)."""
        need = max(int(buf.size), size or 0)
        scratch = self.scratch.get(j)
        if scratch is None or int(scratch.size) < need:
            scratch = self.scratch[j] = cl.Buffer(buf.context, cl.mem_flags.READ_WRITE, need)
        queue: cl.CommandQueue = self.queues[j]
        event = cl.enqueue_copy(queue, scratch, buf, byte_count=int(buf.size))
        if int(queue.properties) & int(cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE):
            event.wait()  # the replay's first command does not wait for this copy otherwise
        return scratch

    def substitution(self, bufs: list[Any], ptrs: list[int]) -> dict[int, Any] | None:
        """The buffer map of a replay with these argument buffers (None: nothing changes)."""
        subst: dict[int, Any] | None = None
        for j, recorded in self.slots:
            ptr = ptrs[j]
            if ptr != recorded:
                if subst is None:
                    subst = {}
                subst[recorded] = self.stage(j, bufs[j]) if ptr in self.hazard else bufs[j]
        return subst

    def small_substitution(self, bufs: list[Any], ptrs: list[int]) -> dict[int, Any] | None:
        """As :meth:`substitution`, staging every argument smaller than its recorded buffer
        (a replay needs the recorded size); None when no argument is smaller."""
        small = [j for j, _ in self.slots if int(bufs[j].size) < self.sizes[j]]
        if not small:
            return None
        subst = self.substitution(bufs, ptrs) or {}
        for j, recorded in self.slots:
            if j in small:
                subst[recorded] = self.stage(j, bufs[j], self.sizes[j])
        return subst

    def outputs(self, flat: tuple[Any, ...], bufs: list[Any], event: Any) -> Any:
        """The result of a replay: the recorded outputs (pyopencl Arrays told about the replay's
        event), with outputs that were arguments of the recorded call taken from this call."""
        if event is not None:
            for array in self.arrays:
                array.events.clear()
                array.events.append(event)
        if self.plain:
            return self.result
        items = [_rebuild(kind, o, flat, bufs) for kind, o in self._outputs]
        if self._shape is None:
            return items[0] if items else None
        return self._shape(items)

    def release(self) -> None:
        """Drop the recording and the buffers it holds."""
        self.capture.reset()
        self.scratch.clear()
        self.result = self.fast = None
        self._outputs = self.arrays = ()


def _has_buffer(arg: Any, buf: Any) -> bool:
    if isinstance(arg, Tensor):
        return arg.buffer is buf
    return isinstance(arg, _Array) and arg.base_data is buf


def _output_plan(
    outputs: tuple[Any, ...], flat: tuple[Any, ...], bufs: list[Any], ptrs: list[int]
) -> list[tuple[str, Any]]:
    """How a replay returns each output: the recorded object (``fixed``), the argument itself
    (``arg``, index into the call's arguments), or a new view of an argument's buffer
    (``view``: (buffer position, recorded view))."""
    plan: list[tuple[str, Any]] = []
    for out in outputs:
        ptr = _buffer_of(out).int_ptr
        if ptr not in ptrs:
            plan.append(("fixed", out))
        elif any(out is a for a in flat):
            plan.append(("arg", next(i for i, a in enumerate(flat) if out is a)))
        else:
            plan.append(("view", (ptrs.index(ptr), out)))
    return plan


def _rebuild(kind: str, o: Any, flat: tuple[Any, ...], bufs: list[Any]) -> Any:
    if kind == "fixed":
        return o
    if kind == "arg":
        return flat[o]
    j, view = o
    if isinstance(view, Tensor):
        return Tensor(bufs[j], view.shape, view.dtype, view.queue)
    return _Array(view.queue, view.shape, view.dtype, strides=view.strides, data=bufs[j],
                  offset=view.offset)
