"""KernelCapture: record kernel launches (and copies/fills) once, replay them cheaply."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import pyopencl as cl
from opentelemetry.trace import Span, Status, StatusCode

from netcl.core import telemetry
from netcl.core.log import get_logger
from netcl.runtime.capture import _intercept, _telemetry
from netcl.runtime.capture._recording import KernelOp, Recording
from netcl.runtime.capture._records import CapturedLaunch, CapturedTransfer
from netcl.runtime.capture._replay import ReplayProgram

__all__ = ["KernelCapture", "get_capture"]

log = get_logger("netcl.runtime.capture")


class KernelCapture:
    """Records the kernel launches of one thread between :meth:`begin` and :meth:`end`, then
    replays them with per-launch host cost close to a bare ``enqueue_nd_range_kernel``.

    Launches run normally while recorded. Copies and fills issued in the capture are recorded
    too and replayed in order with the same buffers and host arrays (CUDA-graph static-buffer
    semantics). Also a context manager: ``with cap: ...`` records the block; if the block raises,
    the partial recording is discarded.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._recording: Recording | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._program: ReplayProgram | None = None
        self._replays = 0
        self._span: Span | None = None

    # -- recording -------------------------------------------------------------------------

    def begin(self) -> None:
        """Start recording the calling thread's launches (drops any earlier recording)."""
        with self._lock:
            if self._recording is not None:
                raise RuntimeError(
                    "KernelCapture.begin: already recording (begun in thread "
                    f"{self._recording.thread}); call end() before beginning again"
                )
            rec = Recording(threading.get_ident())
            _intercept.install(rec)
            self._recording = rec
            # a capture dropped while recording must not leave pyopencl patched
            self._finalizer = weakref.finalize(self, _intercept.uninstall, rec)
            self._program = None
            self._replays = 0
            if telemetry.tracing():
                self._span = _telemetry.tracer.start_span("netcl.capture.record")

    def end(self) -> int:
        """Stop recording and freeze it for replay; returns the number of kernel launches."""
        with self._lock:
            rec = self._stop("end")
            program = ReplayProgram(rec.ops)
            self._program = program
            if program.opaque_launches:
                log.warning(
                    "capture_preset_arguments",
                    kernels=sorted(set(program.opaque_launches)),
                    detail="arguments set before begin() are replayed but cannot be rebound",
                )
            span, self._span = self._span, None
            if span is not None:
                span.set_attribute("netcl.capture.launches", program.num_launches)
                span.set_attribute("netcl.capture.commands", program.num_commands)
                span.end()
            _telemetry.count_recorded(program.num_launches)
            return program.num_launches

    def _stop(self, what: str) -> Recording:
        rec = self._recording
        if rec is None:
            raise RuntimeError(f"KernelCapture.{what}: not recording; call begin() first")
        self._recording = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _intercept.uninstall(rec)
        return rec

    def reset(self) -> None:
        """Forget the recording (and stop one in progress); releases the recorded buffers."""
        with self._lock:
            if self._recording is not None:
                self._stop("reset")
                span, self._span = self._span, None
                if span is not None:
                    span.set_status(Status(StatusCode.ERROR, "capture discarded before end()"))
                    span.end()
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

    # -- replay ----------------------------------------------------------------------------

    def replay(self) -> cl.Event | None:
        """Enqueue the recorded sequence again; returns the last event (None if it is empty)."""
        program = self._program
        if program is None:
            raise self._cannot("replay")
        if telemetry.tracing():
            return self._traced(program, None)
        with self._lock:
            event = program.run()
            self._replays += 1
        _telemetry.count_replay(program.num_launches)
        return event

    def replay_with_new_buffers(self, buffer_map: Mapping[int, Any]) -> cl.Event | None:
        """Replay with buffers substituted for this replay only.

        Keys are the ``int_ptr`` of recorded buffers, values the replacement ``cl.Buffer`` (or
        Tensor); every launch, argument and transfer using a key's buffer gets the replacement.
        An unknown key or a replacement smaller than the recorded buffer raises ``ValueError``
        before anything is enqueued.
        """
        program = self._program
        if program is None:
            raise self._cannot("replay_with_new_buffers")
        subst = program.validate(buffer_map)
        if telemetry.tracing():
            return self._traced(program, subst)
        with self._lock:
            event = program.run_rebound(subst)
            self._replays += 1
        _telemetry.count_replay(program.num_launches)
        return event

    def _traced(
        self, program: ReplayProgram, subst: dict[int, Any] | None
    ) -> cl.Event | None:
        # The span is made after the launches are enqueued, with the start time taken before:
        # the same span, but its ~10 µs of SDK work overlaps the device's work instead of
        # delaying the first launch.
        start = time.time_ns()
        error: BaseException | None = None
        try:
            with self._lock:
                event = program.run() if subst is None else program.run_rebound(subst)
                self._replays += 1
        except BaseException as exc:
            error = exc
            raise
        finally:
            span = _telemetry.tracer.start_span(
                "netcl.capture.replay",
                attributes={
                    "netcl.capture.launches": program.num_launches,
                    "netcl.capture.rebound": 0 if subst is None else len(subst),
                },
                start_time=start,
            )
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, str(error)))
            span.end()
        _telemetry.count_replay(program.num_launches)
        return event

    def _cannot(self, what: str) -> RuntimeError:
        if self._recording is not None:
            return RuntimeError(f"KernelCapture.{what}: still recording; call end() first")
        return RuntimeError(
            f"KernelCapture.{what}: nothing captured; record with begin() ... end() first"
        )

    # -- properties ------------------------------------------------------------------------

    @property
    def is_recording(self) -> bool:
        """Whether begin() was called and end() not yet."""
        return self._recording is not None

    @property
    def num_launches(self) -> int:
        """Kernel launches recorded (so far, while recording)."""
        rec, program = self._recording, self._program
        if rec is not None:
            return sum(isinstance(op, KernelOp) for op in rec.ops)
        return program.num_launches if program is not None else 0

    @property
    def launches(self) -> tuple[CapturedLaunch, ...]:
        """The recorded kernel launches, in order (read-only records)."""
        return tuple(op.record for op in self._ops() if isinstance(op, KernelOp))

    @property
    def commands(self) -> tuple[CapturedLaunch | CapturedTransfer, ...]:
        """Everything recorded, launches and transfers, in the order replay issues them."""
        return tuple(op.record for op in self._ops())

    @property
    def replay_count(self) -> int:
        """Replays since the last end()."""
        return self._replays

    def _ops(self) -> tuple[Any, ...]:
        rec, program = self._recording, self._program
        if rec is not None:
            return tuple(rec.ops)
        return program.ops if program is not None else ()

    def __repr__(self) -> str:
        state = "recording" if self.is_recording else "ready" if self._program else "empty"
        return (
            f"KernelCapture({state}, launches={self.num_launches}, "
            f"replays={self._replays})"
        )


_singleton: KernelCapture | None = None
_singleton_lock = threading.Lock()


def get_capture() -> KernelCapture:
    """The process-wide KernelCapture, created on first call."""
    global _singleton
    if _singleton is None:
        with _singleton_lock:
            if _singleton is None:
                _singleton = KernelCapture()
    return _singleton
