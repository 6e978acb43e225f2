"""replay_with_new_buffers: substitution for one replay, validation before any enqueue."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.tensor import Tensor
from netcl.runtime.capture import KernelCapture

N = 64


@pytest.fixture
def chain(queue: cl.CommandQueue, kernels: Any, buf: Any) -> Any:
    """tmp = a + b; out = tmp * 2 + 1; out2 = a + out   (``a`` used in two launches)."""
    a, b = buf(np.arange(N)), buf(np.ones(N))
    tmp, out, out2 = buf(np.zeros(N)), buf(np.zeros(N)), buf(np.zeros(N))
    cap = KernelCapture()
    cap.begin()
    kernels.add(queue, (N,), None, tmp, a, b)
    kernels.scale_shift(queue, (N,), None, out, tmp, 2.0, 1)
    kernels.add(queue, (N,), None, out2, a, out)
    cap.end()
    return cap, a, b, tmp, out, out2


def test_rebinding_an_input_everywhere(chain: Any, buf: Any, host_read: Any) -> None:
    cap, a, _, _, out, out2 = chain
    a_new = np.linspace(-1, 1, N, dtype=np.float32)
    a2 = buf(a_new)
    cap.replay_with_new_buffers({a.int_ptr: a2})
    expect_out = (a_new + 1) * 2 + 1
    np.testing.assert_allclose(host_read(out, N), expect_out, rtol=1e-6)
    np.testing.assert_allclose(host_read(out2, N), a_new + expect_out, rtol=1e-6)
    # for that replay only: the next plain replay reads the recorded buffer again
    cap.replay()
    a0 = np.arange(N, dtype=np.float32)
    np.testing.assert_allclose(host_read(out, N), (a0 + 1) * 2 + 1)
    assert cap.replay_count == 2


def test_rebinding_an_output_and_a_larger_replacement(chain: Any, buf: Any, host_read: Any) -> None:
    cap, _, b, _, _, out2 = chain
    bigger = buf(np.zeros(2 * N))
    before = host_read(out2, N)
    cap.replay_with_new_buffers(
        {
            out2.int_ptr: bigger,
            b.int_ptr: Tensor(buf(np.full(N, 3.0)), N, np.float32, cap.launches[0].queue),
        }
    )
    a0 = np.arange(N, dtype=np.float32)
    expect_out = (a0 + 3) * 2 + 1
    np.testing.assert_allclose(host_read(bigger, N), a0 + expect_out)
    np.testing.assert_allclose(host_read(out2, N), before)  # the recorded output is untouched


def test_the_same_buffer_in_several_arguments(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    x, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()
    with cap:
        kernels.add(queue, (N,), None, out, x, x)
    x2 = buf(np.full(N, 5.0))
    cap.replay_with_new_buffers({x.int_ptr: x2})
    np.testing.assert_allclose(host_read(out, N), 10.0)


def _assert_nothing_enqueued(
    cap: KernelCapture, out: cl.Buffer, host_read: Any, before: np.ndarray
) -> None:  # type: ignore[type-arg]
    assert cap.replay_count == 0
    np.testing.assert_array_equal(host_read(out, N), before)


def test_unknown_key_raises_before_enqueue(chain: Any, buf: Any, host_read: Any) -> None:
    cap, a, _, _, _, out2 = chain
    stranger = buf(np.zeros(N))
    before = host_read(out2, N)
    with pytest.raises(ValueError, match=f"key {stranger.int_ptr:#x} matches no buffer"):
        # a valid entry first: nothing of it may be applied either
        cap.replay_with_new_buffers({a.int_ptr: buf(np.zeros(N)), stranger.int_ptr: stranger})
    _assert_nothing_enqueued(cap, out2, host_read, before)


def test_too_small_replacement_raises_before_enqueue(chain: Any, buf: Any, host_read: Any) -> None:
    cap, a, _, _, _, out2 = chain
    before = host_read(out2, N)
    with pytest.raises(ValueError, match=rf"holds {4 * (N - 1)} bytes.*holds {4 * N}"):
        cap.replay_with_new_buffers({a.int_ptr: buf(np.zeros(N - 1))})
    _assert_nothing_enqueued(cap, out2, host_read, before)


def test_bad_key_and_value_types(chain: Any, buf: Any) -> None:
    cap, a, *_ = chain
    with pytest.raises(TypeError, match="int_ptr"):
        cap.replay_with_new_buffers({a: buf(np.zeros(N))})
    with pytest.raises(TypeError, match=r"must be a cl\.Buffer"):
        cap.replay_with_new_buffers({a.int_ptr: np.zeros(N)})
    assert cap.replay_count == 0


def test_empty_map_is_a_plain_replay(chain: Any, host_read: Any) -> None:
    cap = chain[0]
    cap.replay_with_new_buffers({})
    assert cap.replay_count == 1


def test_arguments_are_restored_after_a_failing_enqueue(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    # a replacement from another context is refused before anything is enqueued; the
    # recorded arguments are untouched
    x, out = buf(np.ones(N)), buf(np.zeros(N))
    cap = KernelCapture()
    with cap:
        kernels.add(queue, (N,), None, out, x, x)
    other_ctx = cl.Context(queue.context.devices)
    foreign = cl.Buffer(other_ctx, cl.mem_flags.READ_WRITE, 4 * N)
    with pytest.raises(ValueError, match="another OpenCL context"):
        cap.replay_with_new_buffers({x.int_ptr: foreign})
    cl._cl._enqueue_fill_buffer(queue, out, np.float32(0), 0, 4 * N)
    cap.replay()
    np.testing.assert_allclose(host_read(out, N), 2.0)


# -- a substitution must fit every recorded transfer, offsets included ---------------------

OFF = 4 * 16  # bytes: a recorded transfer at an offset into its buffer


def _offset_capture(queue: cl.CommandQueue, kernels: Any, buf: Any, kind: str) -> Any:
    """A launch (the canary: it must not run when the rebinding is refused), then one transfer
    of ``kind`` touching bytes [OFF, OFF + 4 * N) of ``dev``. Returns (capture, dev, canary)."""
    dev, other, canary, ones = (
        buf(np.zeros(N + 16)),
        buf(np.zeros(N + 16)),
        buf(np.zeros(N)),
        buf(np.ones(N)),
    )
    host = np.arange(N, dtype=np.float32)
    cap = KernelCapture()
    with cap:
        kernels.add(queue, (N,), None, canary, ones, ones)
        if kind == "write":
            cl.enqueue_copy(queue, dev, host, dst_offset=OFF)
        elif kind == "read":
            cl.enqueue_copy(queue, host, dev, src_offset=OFF)
        elif kind == "copy_src":
            cl.enqueue_copy(queue, other, dev, src_offset=OFF, byte_count=4 * N)
        elif kind == "copy_dst":
            cl.enqueue_copy(queue, dev, other, dst_offset=OFF, byte_count=4 * N)
        else:
            cl.enqueue_fill_buffer(queue, dev, np.float32(1), OFF, 4 * N)
    return cap, dev, canary


@pytest.mark.parametrize("kind", ["write", "read", "copy_src", "copy_dst", "fill"])
def test_a_replacement_must_hold_a_transfers_offset_plus_its_bytes(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any, kind: str
) -> None:
    cap, dev, canary = _offset_capture(queue, kernels, buf, kind)
    cl._cl._enqueue_fill_buffer(queue, canary, np.float32(-1), 0, 4 * N)
    # large enough for the bytes moved, not for offset + bytes
    small = buf(np.zeros(N))
    with pytest.raises(
        ValueError,
        match=rf"holds {4 * N} bytes, but recorded command 1 "
        rf"\(\w+\) uses {OFF + 4 * N} bytes",
    ):
        cap.replay_with_new_buffers({dev.int_ptr: small})
    _assert_nothing_enqueued(cap, canary, host_read, np.full(N, -1, np.float32))
    exact = buf(np.zeros(N + 16))  # offset + bytes: accepted, and the replay runs whole
    done = cap.replay_with_new_buffers({dev.int_ptr: exact})
    assert done is not None
    done.wait()
    np.testing.assert_allclose(host_read(canary, N), 2.0)


# -- two keys onto one buffer: no recorded copy may then overlap itself ---------------------


@pytest.fixture
def copy_chain(queue: cl.CommandQueue, kernels: Any, buf: Any) -> Any:
    """out = copy of src into dst, doubled (``copy_buffer`` src -> dst, then a launch)."""
    src, dst, out = buf(np.arange(N)), buf(np.zeros(N)), buf(np.zeros(N))
    cap = KernelCapture()
    with cap:
        kernels.add(queue, (N,), None, out, out, out)  # the canary: first command
        cl.enqueue_copy(queue, dst, src)
        kernels.add(queue, (N,), None, out, dst, dst)
    return cap, src, dst, out


def test_two_keys_onto_one_buffer_under_one_copy_are_refused_naming_both(
    copy_chain: Any, buf: Any, host_read: Any
) -> None:
    cap, src, dst, out = copy_chain
    before = host_read(out, N)
    shared = buf(np.ones(N))
    with pytest.raises(
        ValueError,
        match=rf"key {src.int_ptr:#x} and key {dst.int_ptr:#x} would "
        rf"both be buffer {shared.int_ptr:#x}.*command 1 \(copy_buffer\)",
    ):
        cap.replay_with_new_buffers({src.int_ptr: shared, dst.int_ptr: shared})
    _assert_nothing_enqueued(cap, out, host_read, before)


def test_a_key_onto_the_other_end_of_a_recorded_copy_is_refused(
    copy_chain: Any, host_read: Any
) -> None:
    cap, src, dst, out = copy_chain
    before = host_read(out, N)
    with pytest.raises(
        ValueError,
        match=rf"key {src.int_ptr:#x} and the recorded buffer "
        rf"{dst.int_ptr:#x} would both be buffer {dst.int_ptr:#x}",
    ):
        cap.replay_with_new_buffers({src.int_ptr: dst})
    _assert_nothing_enqueued(cap, out, host_read, before)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_copy_between_disjoint_ranges_of_one_buffer_is_allowed(
    queue: cl.CommandQueue, buf: Any, host_read: Any, direction: str
) -> None:
    # forward: the first half of src into the second half of dst; backward: the second half
    # into the first. Mapped onto one buffer, the two ranges touch at one byte boundary and do
    # not overlap, whichever comes first
    half = 4 * (N // 2)
    offsets = {"dst_offset": half} if direction == "forward" else {"src_offset": half}
    src, dst = buf(np.arange(N)), buf(np.zeros(N))
    cap = KernelCapture()
    with cap:
        cl.enqueue_copy(queue, dst, src, byte_count=half, **offsets)
    shared = buf(np.arange(N) * 10)
    done: Any = cap.replay_with_new_buffers({src.int_ptr: shared, dst.int_ptr: shared})
    done.wait()
    got = host_read(shared, N)
    if direction == "forward":
        np.testing.assert_allclose(got[N // 2 :], np.arange(N // 2) * 10)
    else:
        np.testing.assert_allclose(got[: N // 2], np.arange(N // 2, N) * 10)


def test_a_replacement_needs_only_the_bytes_its_own_operand_touches(
    queue: cl.CommandQueue, buf: Any, host_read: Any
) -> None:
    # a copy of the first 4N bytes of a larger source into dst at an offset: the source's
    # replacement needs 4N bytes, neither the recorded source's size nor the destination's
    # offset + count
    src, dst = buf(np.zeros(N + 16)), buf(np.zeros(N + 16))
    cap = KernelCapture()
    with cap:
        cl.enqueue_copy(queue, dst, src, byte_count=4 * N, dst_offset=OFF)
    exact = buf(np.arange(N) + 1.0)
    done: Any = cap.replay_with_new_buffers({src.int_ptr: exact})
    done.wait()
    np.testing.assert_allclose(host_read(dst, N + 16)[OFF // 4 :], np.arange(N) + 1.0)


def test_a_buffer_of_a_launch_after_repeated_launches_can_be_rebound(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any
) -> None:
    # repeated launches of one shape stand for one another; the launch after them, of another
    # shape, is indexed too: its own buffer can be rebound
    a, tmp, out = buf(np.arange(N)), buf(np.zeros(N)), buf(np.zeros(N))
    cap = KernelCapture()
    with cap:
        kernels.add(queue, (N,), None, tmp, a, a)
        kernels.add(queue, (N,), None, tmp, a, a)
        kernels.scale_shift(queue, (N,), None, out, tmp, 2.0, 1)
    other = buf(np.zeros(N))
    done: Any = cap.replay_with_new_buffers({out.int_ptr: other})
    done.wait()
    np.testing.assert_allclose(host_read(other, N), np.arange(N) * 4.0 + 1)
    with pytest.raises(ValueError, match="recorded buffers: 0x"):  # the message lists them
        cap.replay_with_new_buffers({other.int_ptr: other})


# -- the errors in full: each names the object, what was expected and what was found -------

WHO = "KernelCapture.replay_with_new_buffers"


def _message(cap: KernelCapture, mapping: Any, exc: type[Exception]) -> str:
    with pytest.raises(exc) as info:
        cap.replay_with_new_buffers(mapping)
    return str(info.value)


def test_every_refusal_message_in_full(
    chain: Any, copy_chain: Any, buf: Any, ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    cap, a, b, tmp, out, out2 = chain
    assert _message(cap, {a: a}, TypeError) == (
        f"{WHO}: keys must be cl.Buffer.int_ptr values (int), got Buffer {a!r}"
    )
    assert _message(cap, {True: a}, TypeError) == (
        f"{WHO}: keys must be cl.Buffer.int_ptr values (int), got bool True"
    )
    recorded = ", ".join(
        hex(p) for p in (tmp.int_ptr, a.int_ptr, b.int_ptr, out.int_ptr, out2.int_ptr)
    )
    stranger = buf(np.zeros(N))
    assert _message(cap, {stranger.int_ptr: stranger}, ValueError) == (
        f"{WHO}: key {stranger.int_ptr:#x} matches no buffer of the recorded arguments "
        f"(recorded buffers: {recorded})"
    )
    assert _message(cap, {a.int_ptr: np.zeros(N)}, TypeError) == (
        f"{WHO}: the replacement for {a.int_ptr:#x} must be a cl.Buffer (or Tensor), got ndarray"
    )
    image = cl.image_from_array(ctx, np.zeros((4, 4), np.float32), 1)
    assert _message(cap, {a.int_ptr: image}, TypeError) == (
        f"{WHO}: the replacement for {a.int_ptr:#x} is a Image, the recorded object a Buffer"
    )
    foreign = cl.Buffer(cl.Context([queue.device]), cl.mem_flags.READ_WRITE, 4 * N)
    assert _message(cap, {a.int_ptr: foreign}, ValueError) == (
        f"{WHO}: the replacement for {a.int_ptr:#x} belongs to another OpenCL context than "
        "the recorded buffer"
    )
    copy_cap, src, dst, _ = copy_chain
    assert _message(copy_cap, {src.int_ptr: dst}, ValueError) == (
        f"{WHO}: key {src.int_ptr:#x} and the recorded buffer {dst.int_ptr:#x} would both be "
        f"buffer {dst.int_ptr:#x}, and recorded command 1 (copy_buffer) copies from one to the "
        "other: its source and destination would overlap (OpenCL refuses such a copy); map "
        "the keys to different buffers"
    )


def test_the_unknown_key_message_lists_at_most_eight_buffers(
    queue: cl.CommandQueue, kernels: Any, buf: Any
) -> None:
    bufs = [buf(np.zeros(N)) for _ in range(9)]
    cap = KernelCapture()
    with cap:
        for k in range(0, 9, 3):
            kernels.add(queue, (N,), None, *bufs[k : k + 3])
    stranger = buf(np.zeros(N))
    message = _message(cap, {stranger.int_ptr: stranger}, ValueError)
    shown = message.split("(recorded buffers: ", 1)[1]
    assert shown.endswith(", ...)") and shown.count("0x") == 8, message
