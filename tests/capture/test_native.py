"""Work the capture cannot see: native code enqueuing on the recorded queue through its raw
handle. A real native enqueue (``clEnqueueNDRangeKernel`` through ctypes on the queue's
``int_ptr``, as pyvkfft or CLBlast do from C) is noticed, and ``end()`` refuses the recording
unless told to accept it."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

from netcl.runtime.capture import KernelCapture, _intercept, capture_disabled

N = 256
DOUBLE_SRC = "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }"


@pytest.fixture
def opencl(opencl_loader: ctypes.CDLL) -> ctypes.CDLL:
    """The loader with clEnqueueNDRangeKernel's signature."""
    lib = opencl_loader
    size_p = ctypes.POINTER(ctypes.c_size_t)
    lib.clEnqueueNDRangeKernel.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_uint,
        size_p,
        size_p,
        size_p,
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.clEnqueueNDRangeKernel.restype = ctypes.c_int
    return lib


@pytest.fixture
def twice(queue: cl.CommandQueue) -> cl.Kernel:
    return cl.Kernel(cl.Program(queue.context, DOUBLE_SRC).build(), "twice")


def native_double(lib: ctypes.CDLL, queue: cl.CommandQueue, kernel: cl.Kernel, n: int) -> None:
    """A stand-in for a native library: enqueues a launch from C on the caller's queue."""
    size = (ctypes.c_size_t * 1)(n)
    err = lib.clEnqueueNDRangeKernel(
        queue.int_ptr, kernel.int_ptr, 1, None, size, None, 0, None, None
    )
    assert err == 0, err


def _step(lib: ctypes.CDLL, queue: cl.CommandQueue, kernel: cl.Kernel, x: cla.Array) -> Any:
    y = x + 1  # pyopencl: recorded
    kernel.set_args(y.base_data)
    native_double(lib, queue, kernel, N)  # native: invisible to the capture
    return y * 3  # pyopencl: recorded


def test_end_refuses_a_capture_with_a_native_enqueue(
    queue: cl.CommandQueue, opencl: ctypes.CDLL, twice: cl.Kernel
) -> None:
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    cap = KernelCapture()
    cap.begin()
    z = _step(opencl, queue, twice, x)
    with pytest.raises(
        RuntimeError,
        match=rf"{__name__}\.native_double \(CommandQueue\.int_ptr\)"
        r".*allow_native=True",
    ) as info:
        cap.end()
    assert "invisible to the capture" in str(info.value)
    # the native launch ran (the code ran normally), and the capture is gone
    np.testing.assert_allclose(z.get(), (np.arange(N) + 1) * 2 * 3)
    assert not cap.is_recording and not _intercept.is_patched()
    with pytest.raises(RuntimeError, match="nothing captured"):
        cap.replay()


def test_allow_native_keeps_the_capture_without_the_native_work(
    queue: cl.CommandQueue, opencl: ctypes.CDLL, twice: cl.Kernel
) -> None:
    """The documented limitation: a capture accepted with native work replays only what went
    through pyopencl."""
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    cap = KernelCapture()
    cap.begin()
    z = _step(opencl, queue, twice, x)
    assert cap.end(allow_native=True) == 2
    x.set(np.full(N, 5.0, np.float32))
    done: Any = cap.replay()
    done.wait()
    np.testing.assert_allclose(z.get(), (5 + 1) * 3)  # no doubling: the native launch is gone


def test_native_work_under_capture_disabled_is_accepted(
    queue: cl.CommandQueue, opencl: ctypes.CDLL, twice: cl.Kernel
) -> None:
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    with KernelCapture() as cap:
        y = x + 1
        with capture_disabled():  # the way around: the native call outside the recording
            twice.set_args(y.base_data)
            native_double(opencl, queue, twice, N)
        y.finish()
    assert cap.num_launches == 1


def test_from_int_ptr_and_buffer_handles_are_noticed(queue: cl.CommandQueue) -> None:
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    cap = KernelCapture()
    cap.begin()
    y = x * 2
    ptr = y.base_data.int_ptr  # what a native library passes on
    cl.MemoryObject.from_int_ptr(ptr, retain=True)
    cl.CommandQueue.from_int_ptr(queue.int_ptr, retain=True)
    with pytest.raises(RuntimeError) as info:
        cap.end()
    message = str(info.value)
    for reached in (
        "MemoryObjectHolder.int_ptr",
        "MemoryObject.from_int_ptr",
        "CommandQueue.from_int_ptr",
        "CommandQueue.int_ptr",
    ):
        assert (
            f"{__name__}.test_from_int_ptr_and_buffer_handles_are_noticed ({reached})" in message
        ), message


def test_handles_read_by_other_threads_or_by_pyopencl_are_not_native(
    queue: cl.CommandQueue,
) -> None:
    from netcl.core.memory import BufferPool

    pool = BufferPool(queue)
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    cap = KernelCapture()
    cap.begin()
    seen: list[int] = []
    other = threading.Thread(target=lambda: seen.append(queue.int_ptr))
    other.start()
    other.join()
    t = pool.allocate((N,), np.float32)  # netcl's own code may read handles
    y = (x + 1).with_queue(queue)
    z = cla.sum(y)  # pyopencl's internals too
    assert cap.end() >= 2
    assert seen == [queue.int_ptr]
    pool.release(t)
    assert float(z.get()) == pytest.approx(float((np.arange(N) + 1).sum()))


def _function_in(module: str) -> Any:
    """A function whose code belongs to ``module`` (as the capture sees a caller)."""
    namespace: dict[str, Any] = {"__name__": module}
    exec(  # a fixed snippet, compiled as if it lived in `module`
        "def reach(queue, buf):\n    return queue.int_ptr, buf.int_ptr\n", namespace
    )
    return namespace["reach"]


def test_raw_handles_read_by_pyopencl_or_netcl_are_not_native_work(
    queue: cl.CommandQueue,
) -> None:
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    cap = KernelCapture()
    cap.begin()
    y = x * 2
    for module in ("pyopencl", "pyopencl.array", "netcl.runtime.graph._executor"):
        _function_in(module)(queue, y.base_data)
    assert cap.end() == 1
    cap.begin()
    _function_in("pyvkfft.opencl")(queue, y.base_data)
    with pytest.raises(
        RuntimeError,
        match=r"pyvkfft\.opencl\.reach \(CommandQueue\.int_ptr\); "
        r"pyvkfft\.opencl\.reach \(MemoryObjectHolder\.int_ptr\)",
    ):
        cap.end()


def _queue_reader(module: str) -> Any:
    """A function of ``module`` that reads the queue's raw handle (one native access)."""
    namespace: dict[str, Any] = {"__name__": module}
    exec("def reach(queue):\n    return queue.int_ptr\n", namespace)  # a fixed snippet
    return namespace["reach"]


@pytest.mark.parametrize("accesses", [1, 5, 6, 8])
def test_end_refusal_message_names_five_accesses_and_counts_the_rest(
    queue: cl.CommandQueue, accesses: int
) -> None:
    """The refusal users read: the first five raw-handle accesses in order, how many more (only
    past five), the reason and both ways out, word for word."""
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    cap = KernelCapture()
    cap.begin()
    x * 2
    for i in range(accesses):
        _queue_reader(f"vendorlib{i}")(queue)
    with pytest.raises(RuntimeError) as info:
        cap.end()
    reached = "; ".join(
        f"vendorlib{i}.reach (CommandQueue.int_ptr)" for i in range(min(accesses, 5))
    )
    more = f" and {accesses - 5} more" if accesses > 5 else ""
    assert str(info.value) == (
        "KernelCapture.end: while recording, code outside pyopencl and netcl reached a queue or "
        f"memory object through its raw handle: {reached}{more}. Work a native library "
        "enqueues through such a handle is invisible to the capture and would be missing from "
        "every replay. The recording was discarded: keep native calls outside the captured "
        "region (run them under capture_disabled(), or record one capture before and one after "
        "them), or call end(allow_native=True) to keep a capture that replays only what went "
        "through pyopencl"
    )


def test_an_access_from_code_without_a_module_name_is_named_by_a_question_mark(
    queue: cl.CommandQueue,
) -> None:
    """Code run by ``exec`` in a namespace with no ``__name__`` (no module of its own) is named
    ``?`` in the refusal, with its function's qualified name."""
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    namespace: dict[str, Any] = {}
    exec("class Vendor:\n    def reach(queue):\n        return queue.int_ptr\n", namespace)
    cap = KernelCapture()
    cap.begin()
    x * 2
    namespace["Vendor"].reach(queue)
    reached = r"raw handle: \?\.Vendor\.reach \(CommandQueue\.int_ptr\)\."
    with pytest.raises(RuntimeError, match=reached):
        cap.end()


def test_allow_native_logs_every_caller_it_accepted(
    queue: cl.CommandQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """end(allow_native=True) logs ``capture_native_access_accepted`` naming each access."""
    x = cla.to_device(queue, np.arange(N, dtype=np.float32))
    cap = KernelCapture()
    cap.begin()
    y = x * 2
    _function_in("vendorlib")(queue, y.base_data)
    with caplog.at_level(logging.INFO, logger="netcl.runtime.capture"):
        assert cap.end(allow_native=True) == 1
    (event,) = [
        r for r in caplog.records if getattr(r, "event", None) == "capture_native_access_accepted"
    ]
    assert event.callers == [  # type: ignore[attr-defined]
        "vendorlib.reach (CommandQueue.int_ptr)",
        "vendorlib.reach (MemoryObjectHolder.int_ptr)",
    ]
