"""capture_step: a step function that runs normally, records its launches, then replays them.

A :class:`CapturedStep` keeps one :class:`KernelCapture` per guard key (what the arguments look
like: see ``_step_plan``), at most ``max_captures`` of them, least recently used dropped first.
While a capture is the most recently used one, the step's ``__call__`` is a function generated
for that capture's arguments (``_step_fast``): attribute checks, the buffer map, the replay.
Any other call builds the guard key and looks it up.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from types import MethodType
from typing import Any, Generic, ParamSpec, TypeVar, overload

from netcl.core.log import get_logger
from netcl.runtime.capture import KernelCapture
from netcl.runtime.capture import _telemetry as tm
from netcl.runtime.capture._step_fast import (
    NESTING,
    RECORDING,
    compile_fast,
    enter_recording,
    leave_recording,
)
from netcl.runtime.capture._step_outputs import (
    StepCheckError,
    check_error,
    compare,
    copies,
    finish,
    outputs_of,
)
from netcl.runtime.capture._step_plan import (
    Capture,
    GuardKey,
    change_reason,
    check_options,
    guard,
    labels,
    positional_names,
    unhashable_error,
)
from netcl.runtime.capture._step_tally import (
    CAPTURES,
    EVICTIONS,
    REPLAYS,
    RUNS,
    StepStats,
    counts,
    register,
)

__all__ = ["CapturedStep", "StepCheckError", "StepStats", "capture_step"]

P = ParamSpec("P")
R = TypeVar("R")

log = get_logger("netcl.runtime.capture")

_DROPPED = sys.maxsize  # warm-up count of a key whose capture was dropped: record at once


class CapturedStep(Generic[P, R]):
    """A step function whose kernel launches are recorded once per guard key and replayed.

    Made by :func:`capture_step` (see it for the options). For each guard key (every Tensor
    or pyopencl Array argument's shape, dtype and queue, an Array's strides and offset, and
    the type and value of every other argument):

    - the first ``warmup`` calls run the function normally (compiling, allocating);
    - the next call records its launches while running normally;
    - every later call replays them, with each Tensor/Array argument's buffer substituted for
      the recorded one (validated as ``KernelCapture.replay_with_new_buffers`` does).

    **Outputs are the capture's own buffers**: a replay returns the Tensors (or Arrays) the
    recorded call returned, and the next call with the same key overwrites them. Copy what you
    keep (or pass ``copy_outputs=True``). Passing an output back as an argument is recognised
    (the replay works on a copy of it), never aliased. **Host-side effects** (a ``print``, a
    Python counter, a value read on the host) happen only when the function really runs: not
    on replays. For example::

        calls = []

        @capture_step
        def step(x):
            calls.append(1)  # runs on the warm-up and the recording call only
            return x * 2

        for _ in range(10):
            step(x)
        assert len(calls) == 2 and step.stats.replays == 8
    """

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
        check_options(fn, warmup, max_captures, check_atol, name)
        functools.update_wrapper(self, fn)
        self._fn = fn
        self.name: str = name or getattr(fn, "__qualname__", None) or repr(fn)
        self._warmup = warmup
        self._max = max_captures
        self._copy = bool(copy_outputs)
        self._check = bool(check)
        self._atol = float(check_atol)
        self._params, self._varargs = positional_names(fn)
        self._captures: OrderedDict[GuardKey, Capture] = OrderedDict()
        self._warm: OrderedDict[GuardKey, int] = OrderedDict()  # normal runs per uncaptured key
        self._mru: Capture | None = None
        self._lock = threading.RLock()
        self._counts = [0, 0, 0, 0]
        self._last_reason: str | None = None
        self._warned = False
        register(self)

    # -- the call ------------------------------------------------------------------------

    def __new__(cls, *args: Any, **kwargs: Any) -> CapturedStep[P, R]:
        # A class of its own per step, so that its __call__ can be the generated call path of
        # its most recently used capture (see _step_fast, set by _use): a __call__ calling
        # that path would add a Python frame, ~0.2 µs, 3 % of replaying a 4-launch step.
        own = type(cls.__name__, (cls,), {"__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
        return super().__new__(own)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        # while no capture is the most recently used one; see __new__
        return self._call(args, kwargs)  # type: ignore[no-any-return]

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        names: tuple[str, ...] | None = None
        flat: tuple[Any, ...] = args
        if kwargs:
            names = tuple(sorted(kwargs))
            flat = args + tuple(kwargs[k] for k in names)
        key, bufs, ptrs = guard(flat, names)
        try:
            entry = self._captures.get(key)
        except TypeError:
            raise unhashable_error(self.name, key, self._labels(len(args), names)) from None
        if entry is None or entry.pending_check or RECORDING[0]:
            return self._slow(key, args, kwargs, flat, bufs, ptrs)
        return finish(entry, flat, bufs, self._replay(entry, key, bufs, ptrs), self._copy)

    def _use(self, entry: Capture | None) -> None:
        """Make ``entry`` the most recently used capture (its call path the step's call)."""
        self._mru = entry
        fast = None if entry is None or entry.pending_check else entry.fast
        type(self).__call__ = CapturedStep.__call__ if fast is None else fast  # type: ignore[method-assign]

    def _replay(self, entry: Capture, key: GuardKey, bufs: list[Any], ptrs: list[int]) -> Any:
        if self._mru is not entry:
            # KeyError: dropped by another thread meanwhile; replay it this once
            with contextlib.suppress(KeyError):
                self._captures.move_to_end(key)
            self._use(entry)
        subst = entry.substitution(bufs, ptrs)
        cap = entry.capture
        if subst is None:
            event = cap.replay()
        else:
            try:
                event = cap.replay_with_new_buffers(subst)
            except ValueError:  # refused before anything was enqueued
                small = entry.small_substitution(bufs, ptrs)
                if small is None:
                    raise
                event = cap.replay_with_new_buffers(small)
        return event

    def _slow(self, key: GuardKey, args: tuple[Any, ...], kwargs: dict[str, Any],
              flat: tuple[Any, ...], bufs: list[Any], ptrs: list[int]) -> Any:
        if getattr(NESTING, "depth", 0):  # inside another step's recording: plain code (and
            return self._run(args, kwargs)  # no lock: two threads nesting steps crosswise)
        with self._lock:
            entry = self._captures.get(key)
            if entry is not None and entry.pending_check:
                return self._checked_replay(entry, key, args, kwargs, flat, bufs, ptrs)
            if entry is not None:  # a step recording in another thread sent us here
                event = self._replay(entry, key, bufs, ptrs)
                return finish(entry, flat, bufs, event, self._copy)
            seen = self._warm.get(key, 0)
            if seen < self._warmup:
                result = self._run(args, kwargs)
                self._remember(key, seen + 1)
                return result
            return self._record(key, args, kwargs, flat, bufs, ptrs, dropped=seen == _DROPPED)

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = self._fn(*args, **kwargs)
        outputs_of(result, self.name)  # fail on the first call, not at the recording
        self._counts[RUNS] += 1
        return result

    def _remember(self, key: GuardKey, seen: int) -> None:
        self._warm[key] = seen
        self._warm.move_to_end(key)
        while len(self._warm) > max(16, 2 * self._max):
            self._warm.popitem(last=False)

    # -- recording -----------------------------------------------------------------------

    def _record(self, key: GuardKey, args: tuple[Any, ...], kwargs: dict[str, Any],
                flat: tuple[Any, ...], bufs: list[Any], ptrs: list[int], dropped: bool) -> Any:
        labels = self._labels(len(args), tuple(sorted(kwargs)) if kwargs else None)
        reason = change_reason(next(reversed(self._captures), None), key, labels)
        if dropped and not reason.startswith("recorded again"):
            reason += f" (recorded before, dropped to keep {self._max} captures)"
        attributes = {tm.STEP_NAME: self.name, tm.STEP_REASON: reason}
        with tm.TEL.span(tm.STEP_CAPTURE_SPAN, attributes) as span:
            cap = KernelCapture()
            try:
                cap.begin()
            except RuntimeError as exc:
                if "already recording" not in str(exc):
                    raise
                # this thread records into a KernelCapture of the caller's: run as plain code,
                # that capture records the launches
                span.set("netcl.step.nested", True)
                return self._run(args, kwargs)
            enter_recording()
            try:
                result = self._fn(*args, **kwargs)
            except BaseException:
                cap.reset()
                raise
            finally:
                leave_recording()
            try:
                cap.end()
                entry = Capture(cap, key, labels, flat, bufs, ptrs, result,
                                outputs_of(result, self.name))
            except BaseException:
                cap.reset()
                raise
            entry.reason = reason
            entry.pending_check = self._check
            copy = self._copy
            entry.fast = compile_fast(
                entry, flat, bufs,
                None if entry.plain and not copy else functools.partial(finish, copy=copy),
            )
            evicted = self._insert(key, entry)
            self._counts[CAPTURES] += 1
            self._last_reason = reason
            span.set_many({"netcl.capture.launches": entry.launches,
                           "netcl.step.captures_kept": len(self._captures),
                           "netcl.step.evicted": evicted})
        return copies(result, None) if self._copy else result

    def _insert(self, key: GuardKey, entry: Capture) -> int:
        self._captures[key] = entry
        self._captures.move_to_end(key)
        self._use(entry)
        self._warm.pop(key, None)
        evicted = 0
        while len(self._captures) > self._max:
            old_key, old = self._captures.popitem(last=False)
            self._release(old)
            self._remember(old_key, _DROPPED)
            evicted += 1
            self._counts[EVICTIONS] += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "captured_step_evicted", step=self.name, max_captures=self._max,
                    reason=entry.reason,
                    detail="more distinct guard keys than max_captures; a non-Tensor argument "
                    "that changes on every call (a step counter) makes every call a new key",
                )
        return evicted

    # -- check mode ----------------------------------------------------------------------

    def _checked_replay(self, entry: Capture, key: GuardKey, args: tuple[Any, ...],
                        kwargs: dict[str, Any], flat: tuple[Any, ...], bufs: list[Any],
                        ptrs: list[int]) -> Any:
        with tm.TEL.span(tm.STEP_CHECK_SPAN, {tm.STEP_NAME: self.name}) as span:
            event = self._replay(entry, key, bufs, ptrs)
            replayed = entry.outputs(flat, bufs, event)
            if event is not None:
                event.wait()
            normal = self._run(args, kwargs)
            found = compare(outputs_of(replayed, self.name), outputs_of(normal, self.name),
                            self._atol)
            if found is not None:
                index, diff = found
                span.set_many({"netcl.step.output": index, "netcl.step.max_abs_diff": diff})
                self._drop(key, entry)
                raise check_error(self.name, entry.reason, replayed, index, diff, self._atol)
            entry.pending_check = False
            self._use(entry)
        return copies(replayed, event) if self._copy else replayed

    def _labels(self, npos: int, names: tuple[str, ...] | None) -> tuple[str, ...]:
        return labels(self._params, self._varargs, npos, names)

    def _release(self, entry: Capture) -> None:
        # replays are counted by each KernelCapture (nothing to add per call): keep its count
        self._counts[REPLAYS] += entry.capture.replay_count
        entry.release()

    def _drop(self, key: GuardKey, entry: Capture) -> None:
        if self._captures.get(key) is entry:
            del self._captures[key]
        self._release(entry)
        if self._mru is entry:
            self._use(None)
        self._remember(key, _DROPPED)

    # -- the public rest -----------------------------------------------------------------

    def reset(self) -> None:
        """Drop every capture (releasing the buffers each holds) and the warm-up counts."""
        with self._lock:
            for entry in self._captures.values():
                self._release(entry)
            self._captures.clear()
            self._warm.clear()
            self._use(None)

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
        return StepStats(*counts(self._counts, self._captures))

    @property
    def last_reason(self) -> str | None:
        """Why the latest capture was recorded, e.g. ``shape of x changed (4,) -> (8,)``."""
        return self._last_reason

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        # decorating a method: the instance is the first argument (and so part of the key)
        return self if obj is None else MethodType(self, obj)

    def __repr__(self) -> str:
        return (f"CapturedStep({self.name}, captures={len(self._captures)}/{self._max}, "
                f"replays={self.stats.replays})")


@overload
def capture_step(fn: Callable[P, R], /) -> CapturedStep[P, R]: ...


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
    fn: Callable[P, R] | None = None,
    /,
    *,
    warmup: int = 1,
    max_captures: int = 8,
    copy_outputs: bool = False,
    check: bool = False,
    check_atol: float = 0.0,
    name: str | None = None,
) -> CapturedStep[P, R] | Callable[[Callable[P, R]], CapturedStep[P, R]]:
    """Decorate a step function so that it is captured and replayed (``@capture_step`` or
    ``@capture_step(max_captures=4, ...)``); returns a :class:`CapturedStep`.

    - ``warmup``: normal calls per guard key before the recording one (default 1: the first
      call compiles and allocates, the second records, later calls replay; 0 records the
      first call).
    - ``max_captures``: captures kept (default 8); the least recently used is dropped, with
      the buffers it holds, when a new key would exceed it.
    - ``copy_outputs``: return copies of the outputs instead of the capture's own buffers
      (one device copy and one allocation per output and call).
    - ``check``: on the first replay of each capture, also run the function normally and
      compare the outputs; :class:`StepCheckError` names the first output that differs by
      more than ``check_atol`` (default 0: identical). The check runs the step twice, so use
      it on steps that do not update their inputs in place.
    - ``name``: the step's name in telemetry and messages (default: the function's
      qualified name).
    """
    options = {"warmup": warmup, "max_captures": max_captures, "copy_outputs": copy_outputs,
               "check": check, "check_atol": check_atol, "name": name}

    def decorate(f: Callable[P, R]) -> CapturedStep[P, R]:
        return CapturedStep(f, **options)  # type: ignore[arg-type]

    return decorate if fn is None else decorate(fn)
