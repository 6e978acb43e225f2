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


def test_rebinding_an_output_and_a_larger_replacement(
    chain: Any, buf: Any, host_read: Any
) -> None:
    cap, _, b, _, _, out2 = chain
    bigger = buf(np.zeros(2 * N))
    before = host_read(out2, N)
    cap.replay_with_new_buffers({out2.int_ptr: bigger, b.int_ptr: Tensor(buf(np.full(N, 3.0)),
                                                                          N, np.float32,
                                                                          cap.launches[0].queue)})
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


def _assert_nothing_enqueued(cap: KernelCapture, out: cl.Buffer, host_read: Any,
                             before: np.ndarray) -> None:  # type: ignore[type-arg]
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


def test_too_small_replacement_raises_before_enqueue(
    chain: Any, buf: Any, host_read: Any
) -> None:
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
