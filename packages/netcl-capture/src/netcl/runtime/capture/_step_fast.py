"""The call path of a captured step's most recently used capture, written out for its
arguments.

A generic call path (build the guard key, hash it, look it up, loop over the substitution
plan) costs a microsecond or more of Python, 10-30 % of replaying a short step. So each capture
also gets a ``__call__`` of its own, generated once when the capture is made, which the step
uses while that capture is its most recently used one. It checks the arguments against what
the capture recorded, attribute by attribute (on a mismatch the generic path ``self._call``
decides), builds the buffer map, replays and returns the recorded outputs: about what a
hand-written ``replay_with_new_buffers`` call costs. It accepts exactly what the guard key
accepts, or less (the exact recorded types, and the recorded dtype and queue objects), never
more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyopencl.array as cla

from netcl.core.tensor import Tensor
from netcl.runtime.capture._step_plan import Capture

__all__ = ["NESTING", "RECORDING", "compile_fast", "enter_recording", "leave_recording"]

# A step called while another step records in the same thread runs as plain code (the outer
# recording takes its launches): a replay there would not be recorded.
NESTING = threading.local()
RECORDING = [0]  # steps recording now, in any thread: the fast path's one check
_nesting_lock = threading.Lock()


def enter_recording() -> None:
    """A step starts recording in this thread: every step's call takes the generic path."""
    with _nesting_lock:
        RECORDING[0] += 1
    NESTING.depth = getattr(NESTING, "depth", 0) + 1


def leave_recording() -> None:
    """The recording of a step in this thread ended."""
    NESTING.depth -= 1
    with _nesting_lock:
        RECORDING[0] -= 1


def compile_fast(
    entry: Capture,
    flat: tuple[Any, ...],
    bufs: list[Any],
    finish: Callable[[Capture, tuple[Any, ...], list[Any], Any], Any] | None,
) -> Callable[..., Any] | None:
    """The ``__call__`` of a step whose most recently used capture is ``entry`` (recorded with
    positional arguments ``flat`` holding buffers ``bufs``), or None where there is none (a
    call with keyword arguments, an empty array). ``finish(entry, args, bufs, event)`` builds
    results the recorded objects cannot be (None: return the recorded result)."""
    if any(k[0] == "keywords" for k in entry.key if isinstance(k[0], str)):
        return None
    ns: dict[str, Any] = {
        "REC": RECORDING, "ENTRY": entry,
        "replay": entry.capture.replay, "rwnb": entry.capture.replay_with_new_buffers,
        "stage": entry.stage, "small": _small, "finish": finish, "RESULT": entry.result,
        "HAZ": entry.hazard, "ARRAYS": entry.arrays,
    }  # fmt: skip
    miss = "    return self._call(args, kwargs)"
    if flat:  # unpacking checks the number of arguments (a ValueError costs only on a miss)
        lines = ["if REC[0] or kwargs:", miss, "try:",
                 f"    {', '.join(f'a{i}' for i in range(len(flat)))}, = args",
                 "except ValueError:", miss]
    else:
        lines = ["if REC[0] or kwargs or args:", miss]
    names: list[str] = []  # b<i> of each buffer argument, in order
    for i, a in enumerate(flat):
        ns[f"T{i}"] = type(a)
        if isinstance(a, (Tensor, cla.Array)):
            checks = _buffer_checks(i, a, ns)
            if checks is None:
                return None
            lines += [f"if type(a{i}) is not T{i} or {checks}:", miss]
            lines.append(f"b{i} = a{i}.{'buffer' if isinstance(a, Tensor) else 'base_data'}")
            lines.append(f"p{i} = b{i}.int_ptr")
            names.append(f"{i}")
        else:
            ns[f"V{i}"] = a
            lines += [f"if type(a{i}) is not T{i} or (a{i} is not V{i} and a{i} != V{i}):",
                      miss]
    ptrs = [b.int_ptr for b in bufs]
    if len(names) > 1:  # the aliasing between buffer arguments must be the recorded one
        ns["PATTERN"] = tuple(ptrs.index(p) for p in ptrs)
        tup = f"({', '.join(f'p{i}' for i in names)},)"
        lines += [f"ptrs = {tup}", "if tuple(map(ptrs.index, ptrs)) != PATTERN:", miss]
    buffers = f"[{', '.join(f'b{i}' for i in names)}]"
    replay = ["    try:", "        event = rwnb(subst)", "    except ValueError:",
              f"        event = small(ENTRY, {buffers}, subst)", "else:", "    event = replay()"]
    if len(entry.slots) == 1:  # the common case, written without a loop or an empty dict
        (j, recorded), = entry.slots
        n = names[j]
        ns["R0"] = recorded
        value = f"stage({j}, b{n}) if p{n} in HAZ else b{n}" if entry.hazard else f"b{n}"
        lines += [f"if p{n} != R0:", f"    subst = {{R0: {value}}}", *replay]
    else:
        lines.append("subst = {}")
        for j, recorded in entry.slots:
            n = names[j]
            ns[f"R{j}"] = recorded
            value = f"stage({j}, b{n}) if p{n} in HAZ else b{n}" if entry.hazard else f"b{n}"
            lines += [f"if p{n} != R{j}:", f"    subst[R{j}] = {value}"]
        lines += ["if subst:", *replay]
    if finish is not None:
        lines.append(f"return finish(ENTRY, args, {buffers}, event)")
    else:
        if entry.arrays:  # pyopencl arrays learn the replay's event
            lines += ["if event is not None:", "    for arr in ARRAYS:", "        evs = arr.events",
                      "        evs.clear()", "        evs.append(event)"]
        lines.append("return RESULT")
    source = "def __call__(self, *args, **kwargs):\n" + "".join(f"    {x}\n" for x in lines)
    exec(compile(source, "<captured step call path>", "exec"), ns)
    call: Callable[..., Any] = ns["__call__"]
    call.__doc__ = source  # what it does, for whoever debugs it
    return call


def _buffer_checks(i: int, a: Any, ns: dict[str, Any]) -> str | None:
    """The attribute checks of buffer argument ``i`` (None: an empty array, no fast path)."""
    ns[f"S{i}"], ns[f"D{i}"], ns[f"Q{i}"] = a.shape, a.dtype, a.queue
    checks = [f"a{i}.shape != S{i}", f"a{i}.dtype is not D{i}", f"a{i}.queue is not Q{i}"]
    if isinstance(a, cla.Array):
        if a.base_data is None:
            return None
        ns[f"ST{i}"], ns[f"O{i}"] = a.strides, a.offset
        checks += [f"a{i}.strides != ST{i}", f"a{i}.offset != O{i}"]
    return " or ".join(checks)


def _small(entry: Capture, bufs: list[Any], subst: dict[int, Any]) -> Any:
    """The replay refused the map: stage arguments smaller than their recorded buffers."""
    ptrs = [b.int_ptr for b in bufs]
    small = entry.small_substitution(bufs, ptrs)
    if small is None:
        return entry.capture.replay_with_new_buffers(subst)  # raises its error again
    return entry.capture.replay_with_new_buffers(small)
