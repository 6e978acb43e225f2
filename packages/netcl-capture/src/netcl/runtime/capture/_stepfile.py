"""A captured step's save and load: the call a capture was recorded for (its arguments, their
buffers, its outputs and how they are returned) as the file's :class:`~_format.Step` record,
and that record as a call again, on stand-in buffers, for :func:`load_step` to key its capture
on. The capture itself is saved and loaded by ``_saved``; this module knows nothing of a
captured step's guards beyond the key's layout (``FIELDS``)."""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from netcl.core.tensor import Tensor
from netcl.runtime.capture import _format as fmt
from netcl.runtime.capture import _saved
from netcl.runtime.capture._format import ARRAY, TENSOR, CaptureFileError
from netcl.runtime.capture._program import ReplayProgram

# a guard key's part for a Tensor or Array argument: its kind, then these fields of it
FIELDS = {
    TENSOR: ("shape", "dtype", "queue"),
    ARRAY: ("shape", "dtype", "strides", "offset", "queue"),
}


class Call(NamedTuple):
    """A call on its way past a captured step's guard: its key, arguments, and buffer
    arguments."""

    key: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    flat: tuple[Any, ...]  # the positional arguments, then keyword values in key order
    bufs: list[Any]  # the buffers of its Tensor and Array arguments, in order
    ptrs: list[int]  # their int_ptr values


class SavedCall(NamedTuple):
    """A saved step's call rebuilt on a queue, its result and the file's capture."""

    name: str
    labels: list[str]
    signature: str  # the call as messages show it: (x: Tensor(16, 256) float32, n=3)
    call: Call
    result: Any
    program: ReplayProgram


def short(value: Any) -> str:
    """``repr(value)``, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def make(kind: str, fields: Any, buf: Any, queue: cl.CommandQueue) -> Any:
    """A Tensor or Array on ``buf`` with the fields of ``fields`` (a saved or live one)."""
    shape, dtype = tuple(fields.shape), np.dtype(fields.dtype)
    if kind == TENSOR:
        return Tensor(buf, shape, dtype, queue)
    return cla.Array(
        queue, shape, dtype, strides=tuple(fields.strides), data=buf, offset=fields.offset
    )


def save(path: str | os.PathLike[str], entry: Any, name: str, labels: list[str]) -> int:
    """Save step ``name``'s capture ``entry`` (a captured step's ``_Capture``: its capture,
    key, buffer slots, output plan, result and argument sizes); ``labels``: its arguments'."""
    program = entry.capture._ready("replay")
    parts, names, aliasing = entry.key
    params = [_param(part, label, name) for part, label in zip(parts, labels, strict=True)]
    # the buffers of the file's table the step refers to: its arguments', then its outputs'
    roles = [(fmt.INPUT, program.index.uses[p].buffer) for _, p in entry.slots]
    index = {p: k for k, (_, p) in enumerate(entry.slots)}  # int_ptr -> row of the table
    outputs = [_output(kind, o, index, roles) for kind, o in entry.plan]
    container: Any = "none" if entry.result is None else "single"
    if isinstance(entry.result, (tuple, list)):
        container = type(entry.result).__name__
    signature = fmt.Step(
        name,
        labels,
        params,
        list(names) if names else None,
        list(entry.sizes),
        list(aliasing) if aliasing else None,
        container,
        outputs,
        [(j, index[p]) for j, p in entry.slots],
    )
    return _saved.save(path, program, kind="step", roles=roles, step=signature)


def _fields(
    kind: Any, type_: Any, shape: Any, dtype: Any, strides: Any = None, offset: Any = None
) -> fmt.Value:
    """A Tensor's or Array's fields as the file has them (strides and offset: an Array's;
    not the queue)."""
    listed = None if strides is None else list(strides)
    return fmt.Value(kind, type_, list(shape), np.dtype(dtype).str, listed, offset)


def _param(part: tuple[Any, ...], label: str, step: str) -> fmt.Value:
    """An argument's part of the guard key as the file has it."""
    if part[0] in FIELDS:
        return _fields(part[0], None, *part[1:-1])
    type_, value = part
    if type_ in fmt.VALUE_TYPES.values() and (type_ is not float or math.isfinite(value)):
        return fmt.Value(fmt.VALUE, type_.__name__, value=value)
    raise CaptureFileError(
        f"captured step {step}: argument {label} is a {type_.__name__} ({short(value)}), "
        "which a saved step cannot check: a saved step's arguments are Tensors, pyopencl "
        "Arrays, ints, finite floats, bools, strs or None"
    )


def _output(kind: str, o: Any, index: dict[int, int], roles: list[Any]) -> fmt.Value:
    """An output as the file has it; an output on a buffer of the capture's own joins the
    table's roles as an output."""
    if kind == fmt.ARG:
        return fmt.Value(fmt.ARG, index=o)
    view = o if kind == fmt.FIXED else o[1]
    type_ = TENSOR if isinstance(view, Tensor) else ARRAY
    found = _fields(kind, type_, *(getattr(view, f) for f in FIELDS[type_][:-1]))
    if kind == fmt.SLOT:
        return found._replace(slot=o[0])
    buf = view.buffer if isinstance(view, Tensor) else view.base_data
    if buf.int_ptr not in index:
        index[buf.int_ptr] = len(roles)
        roles.append((fmt.OUTPUT, buf))
    return found._replace(buffer=index[buf.int_ptr])


def load(path: str | os.PathLike[str], queue: cl.CommandQueue) -> SavedCall:
    """The saved step at ``path`` on ``queue``: its call and capture."""
    loaded = _saved.load(path, queue)
    step = loaded.manifest.step
    if loaded.manifest.kind != "step" or step is None:
        raise CaptureFileError(
            f"{os.fspath(path)}: holds a KernelCapture, not a step: load it with load_capture()"
        )
    try:
        return _call(loaded, step, queue)
    except (IndexError, TypeError, ValueError, ArithmeticError, cl.Error) as exc:
        raise CaptureFileError(
            f"{os.fspath(path)}: its step is not one this file can replay "
            f"({type(exc).__name__}: {exc})"
        ) from None


def _call(loaded: _saved.Loaded, step: fmt.Step, queue: cl.CommandQueue) -> SavedCall:
    """The saved call rebuilt on stand-in buffers (the file's input buffers, or buffers of its
    own), with its guard key as a captured step builds it, and its result."""
    inputs = {j: loaded.buffers[i] for j, i in step.inputs}
    aliasing = step.aliasing
    bufs: list[Any] = []  # per buffer argument: the file's input buffer, or one of its own
    for j, size in enumerate(step.sizes):
        first = aliasing[j] if aliasing else j  # an earlier argument's buffer, or its own
        own = inputs.get(j)
        if first == j and own is None:
            own = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, max(size, 1))
        bufs.append(own if first == j else bufs[first])
    flat: list[Any] = []
    parts: list[Any] = []
    text = []
    for param, label in zip(step.params, step.labels, strict=True):
        if param.kind in FIELDS:
            obj = make(param.kind, param, bufs[sum(p[0] in FIELDS for p in parts)], queue)
            parts.append((param.kind, *(getattr(obj, f) for f in FIELDS[param.kind])))
            text.append(f"{label}: {param.kind}{tuple(obj.shape)} {obj.dtype}")
        else:
            obj = param.value
            if type(obj) is not fmt.VALUE_TYPES.get(param.type or ""):
                raise ValueError(f"argument {label}: {obj!r} is no {param.type}")
            parts.append((type(obj), obj))
            text.append(f"{label}={short(obj)}")
        flat.append(obj)
    items = []
    for o in step.outputs:
        if o.kind == fmt.ARG:
            items.append(flat[o.index])  # type: ignore[index]
        else:
            buf = loaded.buffers[o.buffer] if o.kind == fmt.FIXED else bufs[o.slot]  # type: ignore[index]
            items.append(make(o.type, o, buf, queue))  # type: ignore[arg-type]
    result: Any = items[0] if step.result == "single" else None
    if step.result in ("tuple", "list"):
        result = tuple(items) if step.result == "tuple" else items
    names = tuple(step.keywords) if step.keywords else None
    key = (tuple(parts), names, tuple(aliasing) if aliasing else None)
    npos = len(flat) - len(names or ())
    kwargs = dict(zip(names or (), flat[npos:], strict=True))
    call = Call(key, tuple(flat[:npos]), kwargs, tuple(flat), bufs, [b.int_ptr for b in bufs])
    return SavedCall(
        step.name, list(step.labels), f"({', '.join(text)})", call, result, loaded.program
    )
