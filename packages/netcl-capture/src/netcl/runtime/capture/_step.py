"""capture_step: a step function that runs normally, records its launches, then replays them.

A :class:`CapturedStep` keeps a :class:`KernelCapture` per guard key (at most ``max_captures``,
least recently used dropped first): a call builds its key, looks it up, and replays that capture
with its argument buffers substituted. A key is ``(parts, keyword names, aliasing)``: a part per
argument (``("Tensor", shape, dtype, queue)``, ``("Array", shape, dtype, strides, offset,
queue)`` or ``(type, value)``), and the pattern of buffer arguments sharing a buffer, if any.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import MethodType
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar, overload

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from netcl.core import device
from netcl.core.log import warn_once
from netcl.core.telemetry import Counts
from netcl.core.tensor import Tensor
from netcl.runtime.capture import _stepfile
from netcl.runtime.capture import _telemetry as tm
from netcl.runtime.capture._capture import KernelCapture, log
from netcl.runtime.capture._format import ARG, ARRAY, FIXED, SLOT, TENSOR
from netcl.runtime.capture._intercept import thread_records
from netcl.runtime.capture._memory import SharedArena
from netcl.runtime.capture._stepfile import FIELDS, Call, make, short

__all__ = ["CapturedStep", "LoadedStep", "StepCheckError", "StepStats", "capture_step", "load_step"]

P = ParamSpec("P")
R = TypeVar("R")
GuardKey = tuple[Any, ...]

_Array = cla.Array
_DROPPED, _FAILED = sys.maxsize, sys.maxsize - 1  # warm-up counts of a dropped key: record at once

# By step name; a counter never goes down, so a step's counts outlive the step.
_RUNS, _CAPTURES, _REPLAYS, _EVICTIONS, _KEPT = (Counts(tm.STEP_NAME) for _ in range(5))
for _name, _counts, _unit, _what in (
    ("replays", _REPLAYS, "{replay}", "Replays made by captured steps"),
    (
        "captures",
        _CAPTURES,
        "{capture}",
        "Captures recorded by captured steps (one per new guard key, again after one was dropped)",
    ),
    (
        "runs",
        _RUNS,
        "{call}",
        "Calls of captured steps that ran the function normally (warm-up, check mode, nested)",
    ),
    (
        "evictions",
        _EVICTIONS,
        "{capture}",
        "Captures dropped to keep a captured step within max_captures",
    ),
):
    tm.TEL.observable_counter(f"netcl.step.{_name}", _counts.points, _unit, _what)
tm.TEL.observable_gauge(
    "netcl.step.captures_kept",
    _KEPT.points,
    "{capture}",
    "Captures a captured step keeps now (at most its max_captures)",
)


class StepStats(NamedTuple):
    """Counts of one captured step's calls since it was made."""

    runs: int  # calls that ran the function (warm-up, check mode, nested in a recording)
    captures: int  # captures recorded
    replays: int  # calls answered by a replay
    evictions: int  # captures dropped to stay within max_captures


class StepCheckError(RuntimeError):
    """Check mode: the first replay of a capture differed from running the step normally;
    ``output`` is the first differing output's index (0 for a single one), ``max_abs_diff``
    the largest absolute difference in it (``inf``: a shape or NaN mismatch, or a count)."""

    def __init__(self, message: str, *, output: int, max_abs_diff: float) -> None:
        super().__init__(message)
        self.output, self.max_abs_diff = output, max_abs_diff


class CapturedStep(Generic[P, R]):
    """A step function whose kernel launches are recorded once per guard key and replayed
    (made by :func:`capture_step`, which describes the options). Per key the first ``warmup``
    calls run the function, the next one records its launches while running, later calls
    replay them with each argument's buffer in place of the recorded one and return the
    recorded call's outputs, which the next call with that key overwrites."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        warmup: int = 1,
        max_captures: int = 8,
        copy_outputs: bool = False,
        check: bool = False,
        check_atol: float = 0.0,
        name: str | None = None,
    ) -> None:
        _check_options(fn, warmup, max_captures, check_atol, name)
        self._fn = fn
        self.name: str = name or getattr(fn, "__qualname__", None) or repr(fn)
        self._warmup, self._max = warmup, max_captures
        self._copy, self._check, self._atol = bool(copy_outputs), bool(check), float(check_atol)
        self._captures: OrderedDict[GuardKey, _Capture] = OrderedDict()  # least recent first
        self._arena = SharedArena()  # the captures' own memory, one arena for all keys
        self._warm: OrderedDict[GuardKey, int] = OrderedDict()  # normal runs per uncaptured key
        self._mru: _Capture | None = None
        self._lock = threading.RLock()
        self._runs = self._recorded = self._replays = self._evictions = 0
        self._last_reason: str | None = None
        # the captures_kept gauge sums the live steps of a name: this one's leave with it
        weakref.finalize(self, _forget, self.name, self._captures)
        # functools.update_wrapper's names, but not its __dict__ update: an instance whose
        # __dict__ was read loses CPython's fast attribute reads (~20 ns each, per call)
        for attr in functools.WRAPPER_ASSIGNMENTS:
            with contextlib.suppress(AttributeError):
                setattr(self, attr, getattr(fn, attr))
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        flat: tuple[Any, ...] = args
        names = None
        if kwargs:
            names = tuple(sorted(kwargs))
            flat += tuple(kwargs[k] for k in names)
        # the guard key, and the buffers of the Tensor and Array arguments with their int_ptr
        parts: list[Any] = []
        bufs: list[Any] = []
        ptrs: list[int] = []
        for a in flat:
            if isinstance(a, Tensor):
                buf = a.buffer
                parts.append((TENSOR, a.shape, a.dtype, a.queue))
            elif isinstance(a, _Array):
                buf = a.base_data  # None for an empty array
                parts.append((ARRAY, a.shape, a.dtype, a.strides, a.offset, a.queue))
            else:
                parts.append((type(a), a))
                continue
            if buf is not None:
                bufs.append(buf)
                ptrs.append(buf.int_ptr)
        aliasing = None
        if len(ptrs) > 1 and len(set(ptrs)) < len(ptrs):
            aliasing = tuple(ptrs.index(p) for p in ptrs)
        key = (tuple(parts), names, aliasing)
        entry = self._mru
        if entry is None or key != entry.key:  # comparing with the last key needs no hashing
            try:
                entry = self._captures.get(key)
            except TypeError:
                raise _unhashable(self.name, key, _labels(self._fn, len(args), names)) from None
            if entry is not None:
                self._use(entry)
        if entry is None or entry.pending_check or thread_records():
            return self._slow(Call(key, args, kwargs, flat, bufs, ptrs))  # type: ignore[no-any-return]
        return self._replay(entry, flat, bufs, ptrs)  # type: ignore[no-any-return]

    def _slow(self, call: Call) -> Any:
        if thread_records():
            # inside a recording (the caller's KernelCapture, or another step's): plain code,
            # whose launches that recording records (a replay would not be recorded)
            return self._run(call)
        with self._lock:
            if (entry := self._captures.get(call.key)) is not None and entry.pending_check:
                return self._checked_replay(entry, call)
            if entry is not None:  # recorded by another thread meanwhile
                self._use(entry)
                return self._replay(entry, call.flat, call.bufs, call.ptrs)
            seen = self._warm.get(call.key, 0)
            if seen < self._warmup:
                result = self._run(call)
                self._remember(call.key, seen + 1)
                return result
            return self._record(call, seen)

    def _use(self, entry: _Capture) -> None:
        with contextlib.suppress(KeyError):  # dropped by another thread: replayed this once
            self._captures.move_to_end(entry.key)
        self._mru = entry

    def _replay(
        self,
        entry: _Capture,
        flat: tuple[Any, ...],
        bufs: list[Any],
        ptrs: list[int],
        wait: bool = False,
    ) -> Any:
        """The replay of a call: its result (copies with copy_outputs); ``wait``: until the
        replay is done."""
        event = entry.replay(bufs, ptrs)
        self._replays += 1
        _REPLAYS.add(1, self.name)
        result = entry.result if entry.plain else entry.outputs(flat, bufs, event)
        if wait and event is not None:
            event.wait()
        return _copies(result, event) if self._copy else result

    def _run(self, call: Call) -> Any:
        result = self._fn(*call.args, **call.kwargs)
        _outputs_of(result, self.name)  # fail on the first call, not at the recording
        self._runs += 1
        _RUNS.add(1, self.name)
        return result

    def _remember(self, key: GuardKey, seen: int) -> None:
        self._warm[key] = seen
        self._warm.move_to_end(key)
        while len(self._warm) > max(16, 2 * self._max):
            self._warm.popitem(last=False)

    def _record(self, call: Call, seen: int) -> Any:
        key = call.key
        labels = _labels(self._fn, len(call.args), key[1])
        reason = _change_reason(next(reversed(self._captures), None), key, labels)
        if seen >= _FAILED and not reason.startswith("recorded again"):
            why = f"to keep {self._max} captures" if seen == _DROPPED else "by a failed check"
            reason += f" (recorded before, dropped {why})"
        attributes = {tm.STEP_NAME: self.name, tm.STEP_REASON: reason}
        with tm.TEL.span(tm.STEP_CAPTURE_SPAN, attributes) as span:
            cap = KernelCapture()
            cap._share_arena(self._arena)  # keys never run at once: the largest plan, not the sum
            try:
                with cap:  # discarded if the function raises
                    result = self._fn(*call.args, **call.kwargs)
                entry = _Capture(cap, call, reason, result, _outputs_of(result, self.name))
            except BaseException:
                cap.reset()
                raise
            entry.pending_check = self._check
            self._captures[key] = self._mru = entry
            self._warm.pop(key, None)
            self._recorded += 1
            self._last_reason = reason
            _CAPTURES.add(1, self.name)
            _KEPT.add(1, self.name)
            evicted = max(0, len(self._captures) - self._max)
            for _ in range(evicted):
                self._drop(next(iter(self._captures)))
            if evicted:
                self._evictions += evicted
                _EVICTIONS.add(evicted, self.name)
                warn_once(
                    log,
                    ("captured_step_evicted", weakref.ref(self)),
                    "captured_step_evicted",
                    step=self.name,
                    max_captures=self._max,
                    reason=reason,
                    detail="more distinct guard keys than max_captures; a "
                    "non-Tensor argument that changes on every call (a step counter) "
                    "makes every call a new key",
                )
            span.set_many(
                {
                    tm.LAUNCHES: entry.launches,
                    "netcl.step.evicted": evicted,
                    "netcl.step.captures_kept": len(self._captures),
                }
            )
        if self._copy:  # copied once the recorded commands are done, whichever queues they used
            for q in {id(op.queue): op.queue for op in cap._ready("replay").ops}.values():
                q.finish()  # (the recording call waits: it is the one slow call of its key)
        return _copies(result, None) if self._copy else result

    def _checked_replay(self, entry: _Capture, call: Call) -> Any:
        with tm.TEL.span(tm.STEP_CHECK_SPAN, {tm.STEP_NAME: self.name}) as span:
            self._use(entry)
            replayed = self._replay(entry, call.flat, call.bufs, call.ptrs, wait=True)
            normal = self._run(call)
            found = _compare(
                _outputs_of(replayed, self.name), _outputs_of(normal, self.name), self._atol
            )
            if found is not None:
                index, diff = found
                span.set_many({"netcl.step.output": index, "netcl.step.max_abs_diff": diff})
                self._drop(entry.key, _FAILED)
                what = f"output {index}" if isinstance(replayed, (tuple, list)) else "the output"
                raise StepCheckError(
                    f"captured step {self.name}: check failed on the first replay of a capture "
                    f"({entry.reason}): {what} differs from running the step normally (max abs "
                    f"diff {diff:.6g}, tolerance {self._atol:g}). The step depends on something "
                    "its guards do not see (a global or closure value that changed, a host-side "
                    "decision): pass it as an argument. The capture was dropped; the next call "
                    "with these arguments records again.",
                    output=index,
                    max_abs_diff=diff,
                )
            entry.pending_check = False
        return replayed

    def _drop(self, key: GuardKey, seen: int = _DROPPED) -> None:
        """Drop a capture; its key records at its next call (``seen``: why it was dropped)."""
        entry = self._captures.pop(key)
        entry.capture.reset()  # its OpenCL references go now, whoever still holds the entry
        entry.scratch.clear()
        _KEPT.add(-1, self.name)
        if self._mru is entry:
            self._mru = None
        self._remember(key, seen)

    def reset(self) -> None:
        """Drop every capture (releasing the buffers each holds) and the warm-up counts."""
        with self._lock:
            for key in list(self._captures):
                self._drop(key)
            self._warm.clear()

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the capture this step replays for its most recent arguments to ``path`` (its
        programs, commands, call signature and the contents of the buffers it reads: guide,
        "Saved steps"); :func:`load_step` replays it in another process without this step's
        code. Returns the file's size in bytes."""
        with self._lock:
            entry = self._mru
            if entry is None:
                raise RuntimeError(
                    f"captured step {self.name}: nothing captured yet: call it {self._warmup + 1}"
                    " times (the warm-up, then the call that records) before save()"
                )
            parts, names, _ = entry.key
            labels = _labels(self._fn, len(parts) - len(names or ()), names)
            return _stepfile.save(path, entry, self.name, labels)

    @property
    def num_captures(self) -> int:
        """Captures kept now (at most :attr:`max_captures`)."""
        return len(self._captures)

    @property
    def num_launches(self) -> int:
        """Kernel launches of the most recently used capture (0 before the first one)."""
        return self._mru.launches if self._mru is not None else 0

    @property
    def max_captures(self) -> int:
        """How many captures the step keeps; the least recently used is dropped beyond it."""
        return self._max

    @property
    def stats(self) -> StepStats:
        """Counts of calls by what they did (normal runs, captures, replays, evictions)."""
        return StepStats(self._runs, self._recorded, self._replays, self._evictions)

    @property
    def last_reason(self) -> str | None:
        """Why the latest capture was recorded, e.g. ``shape of x changed (4,) -> (8,)``."""
        return self._last_reason

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        # decorating a method: the instance is the first argument (and so part of the key)
        return self if obj is None else MethodType(self, obj)

    def __repr__(self) -> str:
        return (
            f"CapturedStep({self.name}, captures={len(self._captures)}/{self._max}, "
            f"replays={self._replays})"
        )


class LoadedStep(CapturedStep[..., Any]):
    """A captured step loaded by :func:`load_step`: it replays the saved capture for calls
    whose arguments match the saved call as a captured step's guards match (shapes, dtypes,
    queue, the values of other arguments); it has no function to run, so any other call
    raises ``ValueError`` naming the first difference."""

    def __init__(
        self, name: str, labels: list[str], signature: str, key: GuardKey, entry: _Capture
    ) -> None:
        super().__init__(_no_function, warmup=0, max_captures=1, name=name)
        self._saved_labels, self._signature = labels, signature
        self._captures[key] = self._mru = entry  # the saved capture, its only one

    def _record(self, call: Call, seen: int) -> Any:
        saved = next(iter(self._captures))
        raise ValueError(
            f"loaded step {self.name}: {_change_reason(saved, call.key, self._saved_labels)}; "
            f"a loaded step replays only the call it was saved with, {self._signature}: pass "
            "arguments like those, or save a capture of these arguments"
        )


def _no_function(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "a loaded step has no function to run: it cannot be called inside a "
        "recording (a KernelCapture or another captured step)"
    )


def load_step(path: str | os.PathLike[str], queue: cl.CommandQueue) -> LoadedStep:
    """A step saved by :meth:`CapturedStep.save`, ready to replay on ``queue`` from its first
    call: programs from the file's binaries (rebuilt from their source on another device),
    constants filled from the file. Called with arguments like the saved call's (Tensors or
    Arrays of the saved shapes and dtypes on ``queue``), it returns its outputs like a captured
    step. :class:`CaptureFileError` names the file and what is wrong with it."""
    saved = _stepfile.load(path, queue)
    outputs = _outputs_of(saved.result, saved.name)
    program = KernelCapture._of(saved.program)
    entry = _Capture(program, saved.call, f"loaded from {path}", saved.result, outputs)
    step = LoadedStep(saved.name, saved.labels, saved.signature, saved.call.key, entry)
    _KEPT.add(1, saved.name)
    return step


def _forget(name: str, captures: OrderedDict[GuardKey, _Capture]) -> None:
    _KEPT.add(-len(captures), name)


class _Capture:
    """One recorded call of a step: its KernelCapture and, worked out once, which argument
    buffers to substitute, which an argument must not be, how a replay builds the result."""

    __slots__ = (
        "arrays",
        "capture",
        "fixed",
        "hazard",
        "key",
        "launches",
        "pending_check",
        "plain",
        "plan",
        "queues",
        "reason",
        "result",
        "scratch",
        "sizes",
        "slots",
    )

    def __init__(
        self, capture: KernelCapture, call: Call, reason: str, result: Any, outputs: tuple[Any, ...]
    ) -> None:
        program = capture._ready("replay")  # its index: the buffers the recorded commands use
        used, flat, ptrs = program.index.uses, call.flat, call.ptrs
        self.capture, self.key, self.reason, self.result = capture, call.key, reason, result
        self.launches = capture.num_launches
        self.pending_check = False  # check mode: the first replay also runs the step
        # (buffer argument position, recorded int_ptr) of the first argument of each buffer
        # the commands use (of every one if some launch had preset, unindexed arguments)
        self.slots = tuple(
            (j, p)
            for j, p in enumerate(ptrs)
            if p not in ptrs[:j] and (program.opaque_launches or p in used)
        )
        self.sizes = [int(b.size) for b in call.bufs]
        # a buffer of the capture that is no argument of the recorded call (an output, an
        # intermediate): passed as an argument, the replay would overwrite it while reading it
        self.hazard = frozenset(used).difference(ptrs)
        # each buffer argument's queue, for its staging copies (else the first command's)
        first = program.ops[0].queue if program.ops else None
        self.queues: list[Any] = [
            a.queue or first
            for a in flat
            if isinstance(a, Tensor) or (isinstance(a, _Array) and a.base_data is not None)
        ]
        self.scratch: dict[int, cl.Buffer] = {}
        # per output: ("fixed", the recorded object), ("arg", its index among the call's
        # arguments) or ("slot", (buffer position, recorded view of an argument's buffer))
        self.plan: list[tuple[str, Any]] = []
        for out in outputs:
            ptr = (out.buffer if isinstance(out, Tensor) else out.base_data).int_ptr
            if ptr not in ptrs:
                self.plan.append((FIXED, out))
            elif any(out is a for a in flat):
                self.plan.append((ARG, next(i for i, a in enumerate(flat) if out is a)))
            else:
                self.plan.append((SLOT, (ptrs.index(ptr), out)))  # the file's kind too
        self.arrays = [o for kind, o in self.plan if kind == FIXED and isinstance(o, _Array)]
        # fixed: a replay returns the recorded result itself (no output is an argument, nor is
        # it a list the caller could change); plain: no Array to give the replay's event either
        self.fixed = type(result) is not list and all(kind == FIXED for kind, _ in self.plan)
        self.plain = self.fixed and not self.arrays

    def replay(self, bufs: list[Any], ptrs: list[int]) -> cl.Event | None:
        """Replay with these argument buffers in place of the recorded ones."""
        subst: dict[int, Any] | None = None
        for j, recorded in self.slots:
            ptr = ptrs[j]
            if ptr != recorded:
                if subst is None:
                    subst = {}
                subst[recorded] = self.stage(j, bufs[j]) if ptr in self.hazard else bufs[j]
        if subst is None:
            return self.capture.replay()
        try:
            return self.capture.replay_with_new_buffers(subst)
        except ValueError:  # refused before anything was enqueued: an argument too small?
            small = [(j, r) for j, r in self.slots if int(bufs[j].size) < self.sizes[j]]
            if not small:
                raise
            for j, recorded in small:  # a replay needs the recorded size
                subst[recorded] = self.stage(j, bufs[j], self.sizes[j])
            return self.capture.replay_with_new_buffers(subst)

    def stage(self, j: int, buf: Any, size: int = 0) -> cl.Buffer:
        """A buffer of the capture's own holding a copy of argument buffer ``j``."""
        need = max(int(buf.size), size)
        if (scratch := self.scratch.get(j)) is None or int(scratch.size) < need:
            scratch = self.scratch[j] = cl.Buffer(buf.context, cl.mem_flags.READ_WRITE, need)
        queue = self.queues[j]
        event = cl.enqueue_copy(queue, scratch, buf, byte_count=int(buf.size))
        if device.out_of_order(queue):
            event.wait()  # the replay's first command does not wait for this copy otherwise
        return scratch

    def outputs(self, flat: tuple[Any, ...], bufs: list[Any], event: cl.Event | None) -> Any:
        """The result of a replay: the recorded outputs (Arrays told about the replay's event),
        those that were arguments of the recorded call taken from this call."""
        if event is not None:
            for array in self.arrays:
                array.events.clear()
                array.events.append(event)
        if self.fixed:
            return self.result
        items = [
            o if kind == FIXED else flat[o] if kind == ARG else _view(o[1], bufs[o[0]])
            for kind, o in self.plan
        ]
        if isinstance(self.result, (tuple, list)):
            return type(self.result)(items)
        return items[0] if items else None


def _view(view: Any, buf: cl.MemoryObjectHolder) -> Any:
    """``view`` (a Tensor or Array) on ``buf`` instead of its own buffer."""
    return make(TENSOR if isinstance(view, Tensor) else ARRAY, view, buf, view.queue)


def _outputs_of(result: Any, step: str) -> tuple[Any, ...]:
    """The Tensors and Arrays a step returned, in order; ``TypeError`` for anything else."""
    if result is None:
        return ()
    items = result if isinstance(result, (tuple, list)) else (result,)
    for i, item in enumerate(items):
        if not isinstance(item, (Tensor, _Array)):
            where = "" if items is not result else f" (item {i} of the {type(result).__name__})"
            raise TypeError(
                f"captured step {step}: returned {type(item).__name__}{where}; a captured step "
                "must return None, a Tensor, a pyopencl Array, or a tuple or list of them (a "
                "host value computed inside the step would not be recomputed by a replay)"
            )
    return tuple(items)


def _copies(result: Any, event: cl.Event | None) -> Any:
    """Copies of a result's Tensors and Arrays (in the same tuple, list or alone)."""
    if isinstance(result, (tuple, list)):
        return type(result)(_copies(item, event) for item in result)
    if result is None or isinstance(result, _Array):  # an Array's copy waits for its events
        return None if result is None else result.copy()
    new = Tensor.empty(result.shape, result.dtype, result.queue)
    if result.nbytes:
        cl.enqueue_copy(
            result.queue,
            new.buffer,
            result.buffer,
            byte_count=result.nbytes,
            wait_for=None if event is None else [event],
        )
    return new


def _compare(mine: Sequence[Any], theirs: Sequence[Any], atol: float) -> tuple[int, float] | None:
    """The first output (index, max abs diff) where a replay's outputs differ from a normal
    run's by more than ``atol`` (NaN in both places counts as equal, in one as infinite)."""
    if len(mine) != len(theirs):
        return min(len(mine), len(theirs)), math.inf
    for i, pair in enumerate(zip(mine, theirs, strict=True)):
        x, y = (np.asarray(o.get() if isinstance(o, _Array) else o.to_numpy()) for o in pair)
        if x.shape != y.shape:
            return i, math.inf
        if not x.size:
            continue
        wide = np.complex128 if np.iscomplexobj(x) or np.iscomplexobj(y) else np.float64
        x, y = x.astype(wide), y.astype(wide)
        diff = np.abs(x - y)
        diff[np.isnan(x) & np.isnan(y)] = 0.0
        diff[np.isnan(diff)] = np.inf
        if not diff.max() <= atol:
            return i, float(diff.max())
    return None


def _labels(fn: Callable[..., Any], npos: int, names: tuple[str, ...] | None) -> list[str]:
    """What messages call each argument of a call: parameter names, ``args[i]`` beyond them."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        params = []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    found = [p.name for p in params if p.kind in kinds][:npos]
    rest = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), "args")
    return found + [f"{rest}[{i}]" for i in range(npos - len(found))] + list(names or ())


def _unhashable(step: str, key: GuardKey, labels: Sequence[str]) -> TypeError:
    """The error for a call whose key cannot be hashed, naming the first such argument."""
    i = 0
    for i, part in enumerate(key[0]):  # noqa: B007 - the first that fails is named
        try:
            hash(part)
        except TypeError:
            break
    return TypeError(
        f"captured step {step}: argument {labels[i]} is an unhashable "
        f"{type(key[0][i][1]).__name__}; a captured step keys its captures on the "
        "values of its non-Tensor arguments, so they must be hashable: pass a tuple instead of "
        "a list, a Tensor instead of a numpy array, or read the value from outside the step"
    )


def _kind(part: tuple[Any, ...]) -> str:
    if part[0] in FIELDS:
        return "a Tensor" if part[0] == TENSOR else "a pyopencl Array"
    return f"a {part[0].__name__}"


def _change_reason(old: GuardKey | None, new: GuardKey, labels: Sequence[str]) -> str:
    """Why ``new`` needs a capture of its own, compared with ``old`` (the key used last):
    the first difference, e.g. ``shape of x changed (4,) -> (8,)``."""
    if old is None:
        return "first capture"
    if old == new:
        return "recorded again (its capture had been dropped)"
    (parts_old, names_old, _), (parts_new, names_new, _) = old, new
    if names_old != names_new:
        return f"keyword arguments changed {names_old or ()} -> {names_new or ()}"
    if len(parts_old) != len(parts_new):
        return f"number of arguments changed {len(parts_old)} -> {len(parts_new)}"
    for a, b, label in zip(parts_old, parts_new, labels, strict=True):
        if a == b:
            continue
        if a[0] != b[0] or len(a) != len(b):
            return f"{label} changed from {_kind(a)} to {_kind(b)}"
        if a[0] not in FIELDS:
            return f"value of {label} changed {short(a[1])} -> {short(b[1])}"
        name, x, y = next(f for f in zip(FIELDS[a[0]], a[1:], b[1:], strict=True) if f[1] != f[2])
        if name == "queue":
            same = x is not None and y is not None and x.context == y.context
            return f"{'queue' if same else 'context'} of {label} changed"
        return f"{name} of {label} changed {short(x)} -> {short(y)}"
    return "aliasing between Tensor arguments changed"


def _check_options(fn: Any, warmup: Any, max_captures: Any, check_atol: Any, name: Any) -> None:
    """Raise naming the option when an option of capture_step is not valid."""
    if not callable(fn):
        raise TypeError(
            f"capture_step: expected a callable step function, got {type(fn).__name__} {fn!r}"
        )
    for option, value, least in (("warmup", warmup, 0), ("max_captures", max_captures, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"capture_step: {option} must be an int >= {least}, got {value!r}")
    if (
        isinstance(check_atol, bool)
        or not isinstance(check_atol, (int, float))
        or not 0 <= check_atol < math.inf
    ):
        raise ValueError(
            f"capture_step: check_atol must be a finite number >= 0, got {check_atol!r}"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"capture_step: name must be a non-empty str or None, got {name!r}")


@overload
def capture_step(
    fn: Callable[P, R],
    /,
    *,
    warmup: int = 1,
    max_captures: int = 8,
    copy_outputs: bool = False,
    check: bool = False,
    check_atol: float = 0.0,
    name: str | None = None,
) -> CapturedStep[P, R]: ...
@overload
def capture_step(
    *,
    warmup: int = 1,
    max_captures: int = 8,
    copy_outputs: bool = False,
    check: bool = False,
    check_atol: float = 0.0,
    name: str | None = None,
) -> Callable[[Callable[P, R]], CapturedStep[P, R]]: ...
def capture_step(
    fn: Callable[P, R] | None = None, /, **options: Any
) -> CapturedStep[P, R] | Callable[[Callable[P, R]], CapturedStep[P, R]]:
    """Decorate a step function so that it is captured and replayed (``@capture_step`` or
    ``@capture_step(max_captures=4, ...)``); returns a :class:`CapturedStep`.

    Options: ``warmup`` normal calls per key before the recording one (1); ``max_captures``
    kept (8), the least recently used dropped beyond; ``copy_outputs`` returns copies;
    ``check`` runs the function beside each capture's first replay, :class:`StepCheckError` if
    an output differs by more than ``check_atol`` (0); ``name`` (the function's qualname).
    """
    if fn is None:
        return lambda f: CapturedStep(f, **options)
    return CapturedStep(fn, **options)
