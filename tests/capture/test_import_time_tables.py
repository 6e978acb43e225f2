"""What the capture package sets up when it is imported, checked here because the mutation run
only runs, for each function, the tests that call it inside a test: the hook table (every entry
point that records gets its stand-in, the invoker's memo included) and the lazily imported names
(the same object on every lookup)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import netcl.runtime.capture as capture
from netcl.runtime.capture import KernelCapture, _intercept


def test_the_hook_table_made_again_covers_the_same_entry_points() -> None:
    again = _intercept._hooks()
    assert again and set(again) == set(_intercept.HOOKS)
    assert _intercept._memo_invoker in again.values()
    # and in absolute terms (a mutant at import changes HOOKS as well): every entry point of the
    # pinned contract gets its stand-in, except those the replay itself calls and programs
    left_out = {e.kind for e, owner, _ in _intercept.BOUND if (owner, e.name) not in again}
    assert left_out == {"replay", "program"}


@pytest.mark.parametrize("name", ["capture_step", "load_step", "CaptureFileError"])
def test_a_lazy_name_is_the_same_object_on_every_lookup(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(vars(capture), name, raising=False)  # as before its first lookup
    first = getattr(capture, name)
    assert first is not None and getattr(capture, name) is first


def test_stand_ins_made_again_record_what_they_are_given(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    # the installed stand-ins were made at import; these are made now, by the same code
    made = {
        (e.owner, e.name, e.kind): _intercept._hook_for(e, orig) for e, _, orig in _intercept.BOUND
    }
    launch = made[("pyopencl._cl", "enqueue_nd_range_kernel", "launch")]
    x, y = buf(np.arange(16)), buf(np.zeros(16))
    kernels.add.set_args(y, x, x)
    with KernelCapture() as cap:
        launch(queue, kernels.add, (16,), None)
        launch(queue, kernels.add, (8,), None)  # another shape of the same kernel
    assert cap.num_launches == 2
    cl._cl._enqueue_fill_buffer(queue, y, np.float32(0), 0, 64)
    cap.replay()
    np.testing.assert_allclose(host_read(y, 16), 2 * np.arange(16))
    native, handle = made[("pyopencl.CommandQueue", "from_int_ptr", "wrap")], queue.int_ptr
    cap.begin()
    native(handle)  # noted as native access, which end() refuses by name
    with pytest.raises(
        RuntimeError,
        match=r"test_stand_ins_made_again_record_what_they_are_giv"
        r"en \(CommandQueue\.from_int_ptr\)\. Work a native library",
    ):
        cap.end()


def test_generic_stand_ins_made_again_record_copies_and_read_handles(
    queue: cl.CommandQueue, buf: Any, host_read: Any
) -> None:
    """A copy through a stand-in made now is recorded and replayed, also after one that failed
    (end() does not take the recording for interrupted); a raw-handle stand-in still reads the
    handle and names the function it stands for."""
    made = {
        (e.owner, e.name, e.kind): (_intercept._hook_for(e, orig), orig)
        for e, _, orig in _intercept.BOUND
    }
    copy, copy_orig = made[("pyopencl._cl", "_enqueue_copy_buffer", "transfer")]
    assert copy.__wrapped__ is copy_orig and copy.__name__ == copy_orig.__name__
    x, y = buf(np.arange(16)), buf(np.zeros(16))
    copy(queue, x, y, 32, 0, 0, None).wait()  # not recording: straight to pyopencl
    copy(queue, x, y, byte_count=16, src_offset=0, dst_offset=32).wait()
    np.testing.assert_allclose(host_read(y, 16), [*range(8), 0, 1, 2, 3, *[0] * 4])
    ooo = cl.CommandQueue(
        queue.context, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    )
    with KernelCapture() as cap:
        with pytest.raises(cl.Error):  # the driver refuses it: nothing ran, nothing recorded
            copy(ooo, x, y, 1 << 20, 0, 0, None)
        copy(ooo, x, y, byte_count=16, src_offset=48, dst_offset=48).wait()
    np.testing.assert_allclose(host_read(y, 16), [*range(8), 0, 1, 2, 3, 12, 13, 14, 15])
    assert cap.num_launches == 0 and len(cap.commands) == 1
    assert cap.commands[0].kwargs == {"byte_count": 16, "src_offset": 48, "dst_offset": 48}
    cl._cl._enqueue_fill_buffer(queue, y, np.float32(0), 0, 64).wait()
    done = cap.replay()  # an out-of-order queue's replay: its event is the copy's
    assert isinstance(done, cl.Event)
    done.wait()
    np.testing.assert_allclose(host_read(y, 16), [0] * 12 + [12, 13, 14, 15])
    handle, handle_orig = made[("pyopencl.CommandQueue", "int_ptr", "handle")]
    assert handle.__get__(queue) == queue.int_ptr
    assert handle.fget.__wrapped__ is handle_orig.fget and handle.__doc__ == handle_orig.__doc__
    seen: list[int] = []
    other = threading.Thread(target=lambda: seen.append(handle.__get__(queue)))
    other.start()
    other.join()
    assert seen == [queue.int_ptr]  # a thread that never recorded reads it plainly
    cap.begin()
    assert handle.__get__(queue) == queue.int_ptr  # recording: noted, and still the handle
    with pytest.raises(RuntimeError) as refused:
        cap.end()
    assert (
        f"raw handle: {__name__}.test_generic_stand_ins_made_again_record_copies_and_read_"
        "handles (CommandQueue.int_ptr). Work" in str(refused.value)
    ), refused.value


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError) as info:
        capture.no_such_name  # noqa: B018
    assert str(info.value) == "module 'netcl.runtime.capture' has no attribute 'no_such_name'"
