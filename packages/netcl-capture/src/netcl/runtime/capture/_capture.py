"""KernelCapture: record kernel launches (and copies/fills) once, replay them cheaply."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import pyopencl as cl

from netcl.core import telemetry
from netcl.core.log import get_logger
from netcl.runtime.capture import _intercept
from netcl.runtime.capture import _telemetry as tm
from netcl.runtime.capture._memory import CaptureMemory, SharedArena
from netcl.runtime.capture._program import ReplayProgram, build
from netcl.runtime.capture._recording import (
    CapturedLaunch,
    CapturedTransfer,
    RawLaunch,
    RawTransfer,
    Recording,
)

__all__ = ["KernelCapture", "get_capture", "load_capture"]

log = get_logger("netcl.runtime.capture")


class KernelCapture:
    """Records the kernel launches, copies and fills of one thread between :meth:`begin` and
    :meth:`end` (they run normally meanwhile), then replays them with per-launch host cost close
    to a bare ``enqueue_nd_range_kernel``, with the same buffers and host arrays (CUDA-graph
    static-buffer semantics). ``with cap:`` records the block, discarding it if it raises."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._recording: Recording | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._program: ReplayProgram | None = None
        self._replays = 0
        self._span = telemetry.NO_SPAN  # the record span, begin() .. end()
        self._shared: SharedArena | None = None  # a captured step's arena, shared by its keys

    def begin(self) -> None:
        """Start recording the calling thread's launches (drops any earlier recording)."""
        with self._lock:
            old = self._recording
            if old is not None and old.live:
                raise RuntimeError(
                    f"KernelCapture.begin: already recording (begun in thread "
                    f"{old.thread_name!r}); call end() before beginning again"
                )
            if old is not None:  # left over by an interrupted begin()/end(): dropped here
                self._discard("replaced by begin()")  # (install() reconciles pyopencl anyway)
            self._program = None
            self._replays = 0
            # open from begin() to end(), so never the current span
            span = tm.TEL.span(tm.RECORD_SPAN, current=False)
            self._recording = rec = Recording()  # before install: reset() finds it whatever follows
            try:
                _intercept.install(rec)
                # a capture dropped while recording must not leave pyopencl patched
                self._finalizer = weakref.finalize(self, _intercept.uninstall, rec)
            except BaseException as exc:
                self._recording = None
                _intercept.uninstall(rec)
                span.end(exc)
                raise
            self._span = span

    def end(self, *, allow_native: bool = False) -> int:
        """Stop recording and freeze it for replay; returns the number of kernel launches.
        ``RuntimeError`` (the recording discarded) if an exception such as KeyboardInterrupt
        struck between a command being issued and recorded, and, unless ``allow_native``, if
        code outside pyopencl and netcl reached a queue or memory object through its raw handle
        (a native library's work through it is invisible to the capture)."""
        with self._lock:
            rec = self._recording
            if rec is None or not rec.started:
                self._discard("end() without a started recording")
                raise RuntimeError("KernelCapture.end: not recording; call begin() first")
            rec.pinned = True  # keep the invoker memo installed while building
            rec.live = False  # nothing more is recorded from here on
            try:
                if rec.busy:
                    raise RuntimeError(
                        "KernelCapture.end: the recording may have missed a command "
                        "(an exception such as KeyboardInterrupt interrupted a "
                        "recorded launch, copy, host wait or argument setter); it "
                        "was discarded: record again"
                    )
                if rec.native and not allow_native:
                    raise RuntimeError(_native_refusal(rec))
                program = build(rec, self._shared)
            except BaseException as exc:
                self._discard(exc)
                raise
            native = list(rec.native)
            self._discard(program)
            self._program = program
            if program.opaque_launches:
                log.warning(
                    "capture_preset_arguments",
                    kernels=sorted(program.opaque_launches),
                    detail="arguments set before begin() are replayed but cannot be rebound",
                )
            if native:
                log.info("capture_native_access_accepted", callers=[str(a) for a in native])
            tm.RECORDED_LAUNCHES.add(program.num_launches)
            return program.num_launches

    def _discard(self, why: BaseException | str | ReplayProgram | None) -> None:
        """Drop the recording in progress (if any) and end its span: as failed with ``why``,
        or as done when ``why`` is the program it became. Restores pyopencl if no other
        recording is live. Idempotent."""
        rec = self._recording
        if rec is not None:
            _intercept.uninstall(rec)  # reconciles
            rec.clear()
        else:  # what an interrupted begin() or end() may have left
            _intercept.reconcile()
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()
        self._recording = None
        span, self._span = self._span, telemetry.NO_SPAN
        if isinstance(why, ReplayProgram):
            span.set_many(
                {
                    tm.LAUNCHES: why.num_launches,
                    tm.COMMANDS: why.num_commands,
                    tm.ARENA_BYTES: why.arena.memory.arena_bytes,
                }
            )
        elif not isinstance(why, BaseException):
            span.fail("discarded", f"capture {why or 'discarded'}")
        span.end(why if isinstance(why, BaseException) else None)

    def reset(self) -> None:
        """Forget the recording (and stop one in progress); releases the recorded buffers."""
        with self._lock:
            self._discard("discarded before end()" if self._recording is not None else None)
            self._program = None
            self._replays = 0

    def __enter__(self) -> KernelCapture:
        self.begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.end()
        else:
            self.reset()

    def replay(self) -> cl.Event | None:
        """Enqueue the recorded sequence again; returns the last event (None if it is empty)."""
        program = self._program  # read once: the hot path of a plain replay
        return self._replay(self._ready("replay") if program is None else program, None)

    def replay_with_new_buffers(self, buffer_map: Mapping[int, Any]) -> cl.Event | None:
        """Replay with buffers substituted for this replay only: keys are the ``int_ptr`` of
        recorded buffers, values the replacement ``cl.Buffer`` (or Tensor) for every command
        using them. ``ValueError`` before anything is enqueued for an unknown key or a
        replacement too small for a command using it."""
        program = self._ready("replay_with_new_buffers")
        return self._replay(program, program.index.validate(buffer_map))

    def _replay(
        self, program: ReplayProgram, subst: Mapping[int, cl.MemoryObjectHolder] | None
    ) -> cl.Event | None:
        # the one test of a plain replay
        if program.collector is not None or program.checker is not None or telemetry.tracing():
            event = self._observed(program, subst)
        else:
            with self._lock:
                event = program.run(subst)
                self._replays += 1
        tm.REPLAYS.add(1)
        tm.REPLAYED_LAUNCHES.add(program.num_launches)
        return event

    def _observed(
        self, program: ReplayProgram, subst: Mapping[int, cl.MemoryObjectHolder] | None
    ) -> cl.Event | None:
        """A replay with a span (when tracing), command by command in checked mode, and, on
        profiling queues, every command's event kept and handed to the device-time collector.
        The span is made after the launches, backdated: its ~10 µs of SDK work overlaps the
        device's instead of delaying it."""
        traced = telemetry.tracing()
        start = time.time_ns() if traced else 0
        error: BaseException | None = None
        keep: list[cl.Event] | None = None
        collector, begin, detail = program.collector, None, False
        if collector is not None:
            keep = []
            # drawn before the replay: a summary's replay keeps only its first and last events;
            # a plain queue's is bracketed on a side queue, its start stamped here
            begin = collector.begin(program.queue)
            detail = begin is None and collector.detail(program.num_commands)
        try:
            with self._lock:
                event = program.run(subst, keep, ends=not detail)
                self._replays += 1
        except BaseException as exc:
            error = exc
            raise
        finally:
            span = telemetry.NO_SPAN
            if traced:
                attributes = {tm.LAUNCHES: program.num_launches, tm.REBOUND: len(subst or ())}
                span = tm.TEL.span(tm.REPLAY_SPAN, attributes, start_time=start, current=False)
            # what was enqueued runs on the device, even when the replay failed later
            if collector is not None and keep:
                labels = program.labels[: len(keep)] if detail else ()
                collector.watch(
                    "replay",
                    keep,
                    labels=labels,
                    parent=span,
                    queue=program.queue,
                    detail=detail,
                    begin=begin,
                )
            span.end(error)
        return event

    def _ready(self, what: str) -> ReplayProgram:
        """The replay form, for ``KernelCapture.what`` (and this package's captured steps);
        RuntimeError before end()."""
        if (program := self._program) is not None:
            return program
        if self._recording is not None:
            raise RuntimeError(f"KernelCapture.{what}: still recording; call end() first")
        raise RuntimeError(
            f"KernelCapture.{what}: nothing captured; record with begin() ... end() first"
        )

    @property
    def is_recording(self) -> bool:
        """Whether begin() was called and end() not yet."""
        rec = self._recording
        return rec is not None and rec.live

    @property
    def num_launches(self) -> int:
        """Kernel launches recorded (so far, while recording)."""
        rec, program = self._recording, self._program
        return rec.launches if rec is not None else program.num_launches if program else 0

    @property
    def launches(self) -> tuple[CapturedLaunch, ...]:
        """The recorded kernel launches, in order (read-only records)."""
        return tuple(c for c in self.commands if isinstance(c, CapturedLaunch))

    @property
    def commands(self) -> tuple[CapturedLaunch | CapturedTransfer, ...]:
        """Everything recorded, launches and transfers, in the order replay issues them."""
        rec, program = self._recording, self._program
        found = list(rec.raw) if rec is not None else program.ops if program is not None else ()
        return tuple(r.record() for r in found if isinstance(r, (RawLaunch, RawTransfer)))

    @property
    def buffers(self) -> tuple[cl.MemoryObjectHolder, ...]:
        """The memory objects the recorded commands use, in order of first use (the capture's
        own references; their ``int_ptr`` are :meth:`replay_with_new_buffers`' keys)."""
        program = self._program
        return tuple(u.buffer for u in program.index.uses.values()) if program else ()

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the capture to ``path``: its programs, commands and every buffer it uses, with
        the contents of those not overwritten whole by their first use (guide, "Saved
        steps"); :func:`load_capture` replays it in another process. Returns the bytes."""
        program = self._ready("save")
        from netcl.runtime.capture import _saved  # on first use: json and the format

        return _saved.save(path, program, kind="capture")

    @property
    def memory(self) -> CaptureMemory | None:
        """The device memory the capture holds since its end() (None before): the bytes of its
        own arena, where the buffers nothing else could reach by then live, and of the buffers
        it refers to where the application keeps them."""
        program = self._program
        return None if program is None else program.arena.memory

    @property
    def replay_count(self) -> int:
        """Replays since the last end()."""
        return self._replays

    def __repr__(self) -> str:
        state = "recording" if self.is_recording else "ready" if self._program else "empty"
        return f"KernelCapture({state}, launches={self.num_launches}, replays={self._replays})"

    @classmethod
    def _of(cls, program: ReplayProgram) -> KernelCapture:
        """For this package's loaders: a capture that replays ``program`` (loaded from a file)."""
        capture = cls()
        capture._program = program
        return capture

    def _share_arena(self, arena: SharedArena) -> None:
        """For this package's captured steps: the next recording's own memory comes from
        ``arena``, which the step's keys share (they never run at once)."""
        self._shared = arena


def _native_refusal(rec: Recording) -> str:
    reached = "; ".join(str(a) for a in list(rec.native)[:5])
    more = f" and {len(rec.native) - 5} more" if len(rec.native) > 5 else ""
    return (
        "KernelCapture.end: while recording, code outside pyopencl and netcl reached a queue "
        f"or memory object through its raw handle: {reached}{more}. Work a native library "
        "enqueues through such a handle is invisible to the capture and would be missing "
        "from every replay. The recording was discarded: keep native calls outside the "
        "captured region (run them under capture_disabled(), or record one capture before "
        "and one after them), or call end(allow_native=True) to keep a capture that replays "
        "only what went through pyopencl"
    )


def load_capture(path: str | os.PathLike[str], queue: cl.CommandQueue) -> KernelCapture:
    """A capture saved by :meth:`KernelCapture.save` (or a step's, by ``CapturedStep.save``), ready
    to replay on ``queue``; its :attr:`~KernelCapture.buffers` are the saved capture's, in the same
    order. :class:`CaptureFileError` names the file and what is wrong with it."""
    from netcl.runtime.capture import _saved

    return KernelCapture._of(_saved.load(path, queue).program)


_singleton: KernelCapture | None = None
_singleton_lock = threading.Lock()


def get_capture() -> KernelCapture:
    """The process-wide KernelCapture, created on first call."""
    global _singleton
    with _singleton_lock:
        if _singleton is None:
            _singleton = KernelCapture()
        return _singleton
