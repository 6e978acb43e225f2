from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.tensor import Tensor

pytestmark = pytest.mark.usefixtures("otel_mode")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "float16"])
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 4), (0,), ()])
def test_round_trip(queue: cl.CommandQueue, dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    host = (rng.standard_normal(shape) * 100).astype(dtype)
    t = Tensor.from_numpy(host, queue)
    assert t.shape == shape
    assert t.dtype == np.dtype(dtype)
    assert t.nbytes == host.nbytes
    np.testing.assert_array_equal(t.to_numpy(), host)


def test_write_in_place_and_kernel_sees_it(queue: cl.CommandQueue) -> None:
    t = Tensor.empty((64,), "float32", queue)
    host = np.arange(64, dtype=np.float32)
    t.write(host)
    src = "__kernel void twice(__global float *a) { int i = get_global_id(0); a[i] *= 2; }"
    prg = cl.Program(queue.context, src).build()
    prg.twice(queue, (64,), None, t.buffer)
    np.testing.assert_array_equal(t.to_numpy(), host * 2)


def test_as_array_is_a_view(queue: cl.CommandQueue) -> None:
    t = Tensor.from_numpy(np.ones((4, 4), np.float32), queue)
    arr = t.as_array()
    arr += 1
    np.testing.assert_array_equal(t.to_numpy(), np.full((4, 4), 2, np.float32))


def test_write_rejects_mismatch(queue: cl.CommandQueue) -> None:
    t = Tensor.empty((4,), "float32", queue)
    expected = r"expected shape \(4,\) and dtype float32, got shape \(5,\)"
    with pytest.raises(ValueError, match=expected):
        t.write(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="got shape \\(4,\\) and dtype float64"):
        t.write(np.zeros(4, np.float64))


def test_buffer_too_small(queue: cl.CommandQueue) -> None:
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 16)
    with pytest.raises(ValueError, match="needs 32 bytes, but the buffer holds only 16"):
        Tensor(buf, (8,), "float32", queue)


@pytest.mark.parametrize("bad", [(-1,), (2.5,), ("3",), (True,)])
def test_bad_shape(queue: cl.CommandQueue, bad: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="every dimension must be an int >= 0"):
        Tensor.empty(bad, "float32", queue)  # type: ignore[arg-type]
