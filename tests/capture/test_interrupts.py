"""KeyboardInterrupt at random moments of begin/launch/end/replay/reset cycles: afterwards the
public API restores pyopencl exactly and a new capture records and replays exactly."""

from __future__ import annotations

import _weakrefset
import gc
import signal
import time
import weakref
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.runtime.capture import KernelCapture, _intercept

N = 64
SECONDS = 10.0


def _pyopencl_attributes() -> dict[tuple[Any, str], Any]:
    return {key: key[0].__dict__.get(key[1]) for key in _intercept.ORIGINALS}


# the weakref module's callbacks (WeakSet, WeakValueDictionary, finalize) run where an object
# dies, whichever frame that is
_WEAKREF_FILES = {weakref.__file__, _weakrefset.__file__}


def _in_callback(frame: Any) -> bool:
    codes = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes or frame.f_code.co_filename in _WEAKREF_FILES:
            return True
        frame = frame.f_back
    return False


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer (POSIX)")
def test_random_keyboard_interrupts_never_corrupt_pyopencl(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    pristine = _pyopencl_attributes()
    assert all(v is not None for v in pristine.values())
    y, x = buf(np.zeros(N)), buf(np.ones(N))
    armed = [False]

    def interrupt(signum: int, frame: Any) -> None:
        # one interrupt per cycle, never outside the guarded block, nor inside a gc callback
        # (another library's, e.g. hypothesis's) or a weakref one: CPython reports an
        # exception from one as unraisable and carries on, so that interrupt would never reach
        # this test
        if armed[0] and not _in_callback(frame):
            armed[0] = False
            raise KeyboardInterrupt

    rng = np.random.default_rng(7)
    caps = [KernelCapture(), KernelCapture()]
    previous = signal.signal(signal.SIGALRM, interrupt)
    cycles = interrupted = 0
    answers: list[str] = []
    deadline = time.monotonic() + SECONDS
    try:
        while time.monotonic() < deadline:
            cap = caps[cycles % 2]
            cycles += 1
            try:
                try:
                    armed[0] = True
                    signal.setitimer(signal.ITIMER_REAL, float(rng.uniform(2e-5, 1.5e-3)))
                    cap.begin()
                    for _ in range(int(rng.integers(1, 4))):
                        kernels.axpy(queue, (N,), None, y, x, 1.0)
                    cap.end()
                    cap.replay()
                    if rng.random() < 0.5:
                        cap.reset()
                finally:  # an interrupt here still lands in the handlers below
                    armed[0] = False
            except KeyboardInterrupt:
                interrupted += 1
            except RuntimeError as exc:
                # the public API's answers to a state an interrupt left behind
                answers.append(str(exc))
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted > 20, (cycles, interrupted)
    expected = (
        "missed a command",
        "already recording",
        "not recording",
        "nothing captured",
        "still recording",
    )
    assert all(any(e in a for e in expected) for a in answers), set(answers)
    # recover with the public API only
    for cap in caps:
        cap.reset()
    assert _pyopencl_attributes() == pristine
    assert not _intercept.is_patched()
    queue.finish()
    # a fresh capture records exactly what runs and replays exactly that
    cl._cl._enqueue_fill_buffer(queue, y, np.float32(0), 0, 4 * N)
    fresh = KernelCapture()
    with fresh:
        for _ in range(5):
            kernels.axpy(queue, (N,), None, y, x, 1.0)
    assert fresh.num_launches == 5
    np.testing.assert_allclose(host_read(y, N), 5.0)
    fresh.replay()
    np.testing.assert_allclose(host_read(y, N), 10.0)
    fresh.reset()
    assert _pyopencl_attributes() == pristine


def test_an_interrupt_between_launch_and_record_is_reported(
    queue: cl.CommandQueue, kernels: Any, buf: Any, spans: Any
) -> None:
    y, x = buf(np.zeros(N)), buf(np.ones(N))
    cap = KernelCapture()
    cap.begin()
    kernels.axpy(queue, (N,), None, y, x, 1.0)
    rec = cap._recording
    assert rec is not None
    recorded = rec.raw

    class Interrupted(list):  # type: ignore[type-arg]
        def append(self, item: Any) -> None:  # the launch ran; recording it is interrupted
            raise KeyboardInterrupt

    rec.raw = Interrupted(recorded)
    try:
        with pytest.raises(KeyboardInterrupt):
            kernels.axpy(queue, (N,), None, y, x, 1.0)
    finally:
        rec.raw = recorded
    with pytest.raises(RuntimeError) as info:
        cap.end()
    assert str(info.value) == (
        "KernelCapture.end: the recording may have missed a command (an exception such as "
        "KeyboardInterrupt interrupted a recorded launch, copy, host wait or argument setter); "
        "it was discarded: record again"
    )
    assert not cap.is_recording and not _intercept.is_patched()
    record = [s for s in spans.get_finished_spans() if s.name == "netcl.capture.record"][-1]
    assert record.attributes["error.type"] == "RuntimeError"
    with pytest.raises(RuntimeError, match="nothing captured"):
        cap.replay()
