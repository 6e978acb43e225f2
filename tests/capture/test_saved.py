"""Saved steps and captures: saved here, loaded in a fresh process without the step's code,
bit-identical to the step run normally; every damaged or foreign file refused by name."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netcl.core.device import device_identity
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.capture import (
    CaptureFileError,
    KernelCapture,
    _cli,
    _format,
    _saved,
    capture_step,
    load_capture,
    load_step,
)

from .conftest import MLP_SOURCE

CHILD = Path(__file__).parents[2] / "demo" / "load_saved.py"  # loads and calls a saved step
CALLS = 20

BATCH, WIDTH, LAYERS = 16, 64, 8
Arrays = list[np.ndarray]  # type: ignore[type-arg]


def _load_in_child(path: Path, calls: list[Arrays], kind: str, tmp: Path) -> list[Arrays]:
    """Every call's outputs from a fresh process that loads ``path`` and calls it."""
    inputs = {f"c{c}_{i}": a for c, args in enumerate(calls) for i, a in enumerate(args)}
    np.savez(tmp / "in.npz", kind=np.array(kind), **inputs)
    done = subprocess.run(
        [sys.executable, str(CHILD), str(path), str(tmp / "in.npz"), str(tmp / "out.npz")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = np.load(tmp / "out.npz")
    return [
        [
            found[k]
            for k in sorted(
                (k for k in found.files if k.startswith(f"c{c}_")),
                key=lambda k: int(k.split("_")[1]),
            )
        ]
        for c in range(len(calls))
    ]


def _host(result: Any) -> Arrays:
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [i.to_numpy() if isinstance(i, Tensor) else i.get() for i in items]


def _check_round_trip(
    step: Any,
    make_args: Callable[[int], Arrays],
    to_device: Callable[[np.ndarray], Any],
    kind: str,
    tmp: Path,
) -> None:  # type: ignore[type-arg]
    """Warm up, record, save; the saved file loaded elsewhere gives, for CALLS new inputs,
    exactly what the step's function gives when run normally."""
    for c in range(2):  # the warm-up, then the recording call
        step(*[to_device(a) for a in make_args(1000 + c)])
    assert step.save(tmp / "step.ncl") > 0
    calls = [make_args(c) for c in range(CALLS)]
    normal = [_host(step.__wrapped__(*[to_device(a) for a in args])) for args in calls]
    loaded = _load_in_child(tmp / "step.ncl", calls, kind, tmp)
    for c, (want, got) in enumerate(zip(normal, loaded, strict=True)):
        assert len(want) == len(got)
        for w, g in zip(want, got, strict=True):
            assert w.dtype == g.dtype and w.shape == g.shape
            assert w.tobytes() == g.tobytes(), f"call {c} differs"
    assert not all(np.array_equal(loaded[0][0], o[0]) for o in loaded[1:])  # new data each call


class _MLP:
    """An 8-layer MLP step as framework-style ops: outputs from a BufferPool, intermediates
    released as soon as they are consumed, weights in the closure (constants of the file)."""

    def __init__(self, queue: cl.CommandQueue) -> None:
        self.queue, self.pool = queue, BufferPool(queue)
        prg = cl.Program(queue.context, MLP_SOURCE).build()
        self.matmul, self.bias_relu = cl.Kernel(prg, "matmul"), cl.Kernel(prg, "bias_relu")
        self.matmul.set_scalar_arg_dtypes([None, None, None, np.int32, np.int32])
        self.bias_relu.set_scalar_arg_dtypes([None, None, None, np.int32])
        rng = np.random.default_rng(7)
        self.w = [
            Tensor.from_numpy((rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32), queue)
            for _ in range(LAYERS)
        ]
        self.b = [
            Tensor.from_numpy(rng.standard_normal(WIDTH).astype(np.float32), queue)
            for _ in range(LAYERS)
        ]

    def step(self, x: Tensor) -> Tensor:
        h = x
        for w, b in zip(self.w, self.b, strict=True):
            z = self.pool.allocate((BATCH, WIDTH), np.float32)
            self.matmul(self.queue, (z.size,), None, z.buffer, h.buffer, w.buffer, WIDTH, WIDTH)
            if h is not x:
                self.pool.release(h)
            h = self.pool.allocate((BATCH, WIDTH), np.float32)
            self.bias_relu(self.queue, (h.size,), None, h.buffer, z.buffer, b.buffer, WIDTH)
            self.pool.release(z)
        return h


def _rand(shape: tuple[int, ...], dtype: Any = np.float32) -> Callable[[int], Arrays]:
    def make(seed: int) -> Arrays:
        rng = np.random.default_rng(seed)
        if np.dtype(dtype).kind == "c":
            return [(rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)]
        return [rng.standard_normal(shape).astype(dtype)]

    return make


def test_an_8_layer_mlp(queue: cl.CommandQueue, tmp_path: Path) -> None:
    mlp = _MLP(queue)
    step = capture_step(mlp.step)
    _check_round_trip(
        step, _rand((BATCH, WIDTH)), lambda a: Tensor.from_numpy(a, queue), "tensor", tmp_path
    )
    info = _saved.inspect(tmp_path / "step.ncl")
    assert info["launches"] == 2 * LAYERS
    assert info["buffers"]["input"]["count"] == 1
    assert info["buffers"]["constant"]["bytes"] >= LAYERS * (WIDTH * WIDTH + WIDTH) * 4


def test_a_pyopencl_array_step(queue: cl.CommandQueue, tmp_path: Path) -> None:
    """pyopencl's own kernels (elementwise, reduction) and a tuple of two outputs."""
    w = cla.to_device(queue, np.linspace(-1, 1, 256).astype(np.float32))

    @capture_step
    def step(x: cla.Array, y: cla.Array) -> tuple[cla.Array, cla.Array]:
        z = cla.maximum(x * 2 + y, w)
        return z, cla.sum(z * w)

    def make(seed: int) -> Arrays:
        return _rand((256,))(seed) + _rand((256,))(seed + 99)

    _check_round_trip(step, make, lambda a: cla.to_device(queue, a), "array", tmp_path)


def test_a_reikna_fft(queue: cl.CommandQueue, tmp_path: Path) -> None:
    """A third-party kernel library's computation: reikna's FFT (its own program generator)."""
    ocl_api = pytest.importorskip("reikna.cluda").ocl_api
    fft_type = pytest.importorskip("reikna.fft").FFT
    thread = ocl_api().Thread(queue)
    x0 = np.zeros((32, 64), np.complex64)
    fft = fft_type(x0).compile(thread)
    out = thread.empty_like(x0)

    @capture_step
    def step(x: cla.Array) -> cla.Array:
        fft(out, x)
        return out

    _check_round_trip(
        step, _rand(x0.shape, np.complex64), lambda a: thread.to_device(a), "array", tmp_path
    )


def test_256_mb_of_weights(queue: cl.CommandQueue, tmp_path: Path) -> None:
    """A loaded step with 256 MiB of weights answers with them, not with stale or missing
    data (a loaded JIT returning the capturing run's outputs; one that does not run)."""
    rows, cols = 1024, 65536  # float32: 256 MiB
    prg = cl.Program(
        queue.context,
        """
    __kernel void matvec(__global float *y, __global const float *w, __global const float *x,
                         const int cols) {
        int r = get_global_id(0); float acc = 0.0f;
        for (int c = 0; c < cols; ++c) acc += w[r * cols + c] * x[c];
        y[r] = acc;
    }""",
    ).build()
    kernel = cl.Kernel(prg, "matvec")
    kernel.set_scalar_arg_dtypes([None, None, None, np.int32])
    w = Tensor.empty((rows, cols), np.float32, queue)
    for r in range(0, rows, 128):  # filled in slices: no 256 MiB host copy here either
        part = np.random.default_rng(r).integers(-2, 3, (128, cols)).astype(np.float32)
        cl.enqueue_copy(queue, w.buffer, part, dst_offset=r * cols * 4)
    y = Tensor.empty((rows,), np.float32, queue)

    @capture_step
    def step(x: Tensor) -> Tensor:
        kernel(queue, (rows,), None, y.buffer, w.buffer, x.buffer, cols)
        return y

    def make(seed: int) -> Arrays:  # small integers: every sum exact in float32
        return [np.random.default_rng(seed).integers(-2, 3, cols).astype(np.float32)]

    for c in range(2):
        step(Tensor.from_numpy(make(1000 + c)[0], queue))
    step.save(tmp_path / "big.ncl")
    assert (tmp_path / "big.ncl").stat().st_size > rows * cols * 4
    calls = [make(c) for c in range(3)]
    got = _load_in_child(tmp_path / "big.ncl", calls, "tensor", tmp_path)
    for r0 in range(0, rows, 128):
        part = np.random.default_rng(r0).integers(-2, 3, (128, cols)).astype(np.float64)
        for (x,), (g,) in zip(calls, got, strict=True):
            np.testing.assert_array_equal(g[r0 : r0 + 128], part @ x)


def test_a_kernel_capture_and_its_buffers(
    queue: cl.CommandQueue, ctx: cl.Context, kernels: Any, buf: Any, tmp_path: Path
) -> None:
    """KernelCapture.save: every buffer it uses; the loaded capture's buffers in the saved
    order, replayable and rebindable."""
    x, y = buf(np.arange(64)), buf(np.ones(64))
    with KernelCapture() as cap:
        kernels.axpy(queue, (64,), None, y, x, np.float32(2))
        kernels.axpy(queue, (64,), None, y, x, np.float32(0.5))
    cap.save(tmp_path / "cap.ncl")
    loaded = load_capture(tmp_path / "cap.ncl", queue)
    assert [int(b.size) for b in loaded.buffers] == [int(b.size) for b in cap.buffers]
    y2, x2 = loaded.buffers
    # the launch records as recorded, with the loaded capture's own buffers
    assert [launch.args for launch in loaded.launches] == [(y2, x2, 2), (y2, x2, 0.5)]
    loaded.replay()
    got = np.empty(64, np.float32)
    cl.enqueue_copy(queue, got, y2)
    # y held 1 + 2.5 * x when saved; the replay adds 2.5 * x again
    np.testing.assert_array_equal(got, 1 + 5 * np.arange(64, dtype=np.float32))
    fresh = buf(np.zeros(64))
    loaded.replay_with_new_buffers({y2.int_ptr: fresh})
    cl.enqueue_copy(queue, got, fresh)
    np.testing.assert_array_equal(got, 2.5 * np.arange(64, dtype=np.float32))
    with pytest.raises(CaptureFileError, match="holds a KernelCapture, not a step"):
        load_step(tmp_path / "cap.ncl", queue)


def test_a_local_memory_argument_is_saved_by_its_size(
    queue: cl.CommandQueue, kernels: Any, buf: Any, tmp_path: Path
) -> None:
    """A ``cl.LocalMemory`` argument is saved as its size and loaded as local memory of that
    size: the loaded capture's reduction sums each group as the recorded one did."""
    group, n = 16, 64
    x, sums = buf(np.arange(n)), buf(np.zeros(n // group))
    with KernelCapture() as cap:
        kernels.block_sum(queue, (n,), (group,), x, sums, cl.LocalMemory(4 * group))
    path = tmp_path / "sums.ncl"
    cap.save(path)
    with open(path, "rb") as f:
        (launch,) = _format.read(f, str(path), path.stat().st_size).launches
    assert [a.local for a in launch.args] == [None, None, 4 * group]
    loaded = load_capture(path, queue)
    _, loaded_sums = loaded.buffers
    cl.enqueue_fill_buffer(queue, loaded_sums, np.float32(-1), 0, 4 * (n // group))
    loaded.replay()
    got = np.empty(n // group, np.float32)
    cl.enqueue_copy(queue, got, loaded_sums)
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32).reshape(-1, group).sum(1))


def test_a_sub_buffer_of_constants_is_saved_with_its_parents_contents(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any, tmp_path: Path
) -> None:
    """A kernel reads a region of a buffer of constants (a sub-buffer): the parent, which no
    command names, is saved with its contents, so the loaded capture reads the same values."""
    align = queue.device.mem_base_addr_align // 8
    n = max(64, align // 4)  # the region's origin (n floats in) on the device's alignment
    weights, y = buf(np.arange(2 * n)), buf(np.zeros(n))
    upper = weights.get_sub_region(4 * n, 4 * n)  # the second half: n .. 2n - 1
    with KernelCapture() as cap:
        kernels.axpy(queue, (n,), None, y, upper, np.float32(1))
    cap.save(tmp_path / "cap.ncl")
    loaded = load_capture(tmp_path / "cap.ncl", queue)
    fresh = buf(np.zeros(n))
    y2 = loaded.launches[0].args[0]
    loaded.replay_with_new_buffers({y2.int_ptr: fresh})
    np.testing.assert_array_equal(host_read(fresh, n), np.arange(n, 2 * n, dtype=np.float32))


def test_a_buffer_first_overwritten_whole_is_saved_without_contents_and_a_finish_replays(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any, tmp_path: Path
) -> None:
    """y's first use writes all of it (its contents then are not saved: scratch), x is read (a
    constant); a queue.finish() between the commands is saved and replayed."""
    x, y = buf(np.arange(64)), buf(np.zeros(64))
    fresh = np.full(64, 3, np.float32)
    with KernelCapture() as cap:
        cl.enqueue_copy(queue, y, fresh)
        queue.finish()
        kernels.axpy(queue, (64,), None, y, x, np.float32(2))
    cap.save(tmp_path / "cap.ncl")
    roles = _saved.inspect(tmp_path / "cap.ncl")["buffers"]
    assert roles == {
        "constant": {"count": 1, "bytes": 256},
        "scratch": {"count": 1, "bytes": 256},
    }, roles
    loaded = load_capture(tmp_path / "cap.ncl", queue)
    loaded.replay()
    queue.finish()
    y2 = next(b for b in loaded.buffers if b.int_ptr != loaded.launches[0].args[1].int_ptr)
    np.testing.assert_array_equal(host_read(y2, 64), 3 + 2 * np.arange(64, dtype=np.float32))


def test_saved_steps_returning_none_and_their_argument(
    queue: cl.CommandQueue, kernels: Any, tmp_path: Path
) -> None:
    @capture_step
    def shift(x: Tensor) -> None:
        kernels.scale_shift(queue, x.shape, None, x.buffer, x.buffer, 1.0, 1)

    @capture_step
    def doubled(x: Tensor) -> Tensor:
        kernels.scale_shift(queue, x.shape, None, x.buffer, x.buffer, 2.0, 0)
        return x

    x = Tensor.from_numpy(np.arange(8, dtype=np.float32), queue)
    for name, step in (("shift", shift), ("doubled", doubled)):
        step(x), step(x)
        step.save(tmp_path / f"{name}.ncl")
    loaded_shift = load_step(tmp_path / "shift.ncl", queue)
    loaded_doubled = load_step(tmp_path / "doubled.ncl", queue)
    y = Tensor.from_numpy(np.arange(8, dtype=np.float32), queue)
    assert loaded_shift(y) is None
    np.testing.assert_array_equal(y.to_numpy(), np.arange(8) + 1)
    assert loaded_doubled(y) is y  # the output is this call's argument
    np.testing.assert_array_equal(y.to_numpy(), 2 * (np.arange(8) + 1))


def _views_step(queue: cl.CommandQueue, path: Path) -> np.ndarray:  # type: ignore[type-arg]
    """Save a step whose outputs view its second argument's buffer (a slice at an offset, a
    transpose) to ``path``; the host values of that argument."""

    @capture_step
    def views(w: cla.Array, x: cla.Array) -> tuple[cla.Array, cla.Array]:
        x *= w  # in place
        return x[1:], x.T

    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    for _ in range(2):
        views(cla.to_device(queue, host), cla.to_device(queue, host))
    views.save(path)
    return host


def test_outputs_viewing_an_argument_are_saved_by_its_position(
    queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """The file names an output that views an argument's buffer by that buffer argument's
    position (``slot``), with the view's own shape, offset and strides, and no file buffer."""
    _views_step(queue, tmp_path / "views.ncl")
    manifest, _ = _manifest((tmp_path / "views.ncl").read_bytes())
    outputs = [
        {k: o.get(k) for k in ("type", "shape", "strides", "offset", "slot", "buffer")}
        for o in manifest["step"]["outputs"]
    ]
    assert outputs == [
        {
            "type": "Array",
            "shape": [2, 4],
            "strides": [16, 4],
            "offset": 16,
            "slot": 1,
            "buffer": None,
        },
        {
            "type": "Array",
            "shape": [4, 3],
            "strides": [4, 16],
            "offset": 0,
            "slot": 1,
            "buffer": None,
        },
    ]


def test_a_loaded_step_returns_views_of_the_new_argument(
    queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """Outputs that view an argument's buffer come back from the loaded step as views of the
    loaded call's argument, with the saved offset and strides (such a file once saved its
    outputs as kind "view", which loading refused)."""
    host = _views_step(queue, tmp_path / "views.ncl")
    loaded = load_step(tmp_path / "views.ncl", queue)
    x = cla.to_device(queue, host + 1)
    rows, t = loaded(cla.to_device(queue, host), x)
    assert rows.base_data is x.base_data and t.base_data is x.base_data
    assert rows.offset == 16 and t.strides == (4, 16)
    np.testing.assert_array_equal(rows.get(), host[1:] * (host[1:] + 1))
    np.testing.assert_array_equal(t.get(), (host * (host + 1)).T)


def test_a_step_saved_with_one_array_as_both_arguments_replays_on_one_array(
    queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """A step saved from a call passing the same array twice (aliased arguments) replays a
    loaded call passing one array twice: both arguments read that array."""

    @capture_step
    def add(a: cla.Array, b: cla.Array) -> cla.Array:
        return a + 2 * b

    x = cla.to_device(queue, np.arange(8, dtype=np.float32))
    add(x, x), add(x, x)
    add.save(tmp_path / "aliased.ncl")
    loaded = load_step(tmp_path / "aliased.ncl", queue)
    y = cla.to_device(queue, np.arange(8, dtype=np.float32) + 10)
    np.testing.assert_array_equal(loaded(y, y).get(), 3 * (np.arange(8) + 10))
    with pytest.raises(ValueError, match="loaded step"):
        loaded(y, cla.to_device(queue, np.zeros(8, np.float32)))  # not the saved aliasing


def test_a_loaded_step_called_inside_a_recording_says_it_has_no_function(
    queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """Inside a recording a captured step runs its function (a replay would not be recorded);
    a loaded step has none, and says so."""

    @capture_step
    def double(a: cla.Array) -> cla.Array:
        return 2 * a

    x = cla.to_device(queue, np.arange(8, dtype=np.float32))
    double(x), double(x)
    double.save(tmp_path / "double.ncl")
    loaded = load_step(tmp_path / "double.ncl", queue)
    with KernelCapture(), pytest.raises(RuntimeError) as info:
        loaded(x)
    assert str(info.value) == (
        "a loaded step has no function to run: it cannot be called inside "
        "a recording (a KernelCapture or another captured step)"
    )
    np.testing.assert_array_equal(loaded(x).get(), 2 * np.arange(8))  # outside: replayed


def test_guards_as_for_a_captured_step(
    queue: cl.CommandQueue, kernels: Any, tmp_path: Path
) -> None:
    @capture_step
    def step(x: Tensor, scale: float) -> Tensor:
        out = Tensor.empty(x.shape, x.dtype, queue)
        kernels.scale_shift(queue, x.shape, None, out.buffer, x.buffer, scale, 1)
        return out

    x = Tensor.from_numpy(np.arange(8, dtype=np.float32), queue)
    step(x, 2.0), step(x, 2.0)
    step.save(tmp_path / "s.ncl")
    loaded = load_step(tmp_path / "s.ncl", queue)
    np.testing.assert_array_equal(loaded(x, 2.0).to_numpy(), np.arange(8) * 2 + 1)
    with pytest.raises(
        ValueError,
        match=r"loaded step .*step: shape of x changed \(8,\) -> "
        r"\(4,\).*saved with, \(x: Tensor\(8,\) float32, scale=2.0\): pass "
        r"arguments like those, or save a capture of these arguments$",
    ):
        loaded(Tensor.from_numpy(np.zeros(4, np.float32), queue), 2.0)
    with pytest.raises(ValueError, match=r"value of scale changed 2\.0 -> 3\.0"):
        loaded(x, 3.0)
    assert loaded.stats.replays == 1
    assert loaded.max_captures == loaded.num_captures == 1  # the saved call's, no other


def test_save_before_a_capture_and_unsaveable_arguments(
    queue: cl.CommandQueue, kernels: Any, tmp_path: Path
) -> None:
    @capture_step
    def step(x: Tensor, opts: object) -> Tensor:
        kernels.scale_shift(queue, x.shape, None, x.buffer, x.buffer, 1.0, 1)
        return x

    with pytest.raises(RuntimeError, match="nothing captured yet: call it 2 times"):
        step.save(tmp_path / "s.ncl")
    x = Tensor.from_numpy(np.zeros(4, np.float32), queue)
    step(x, (1, 2)), step(x, (1, 2))
    with pytest.raises(CaptureFileError, match=r"argument opts is a tuple \(\(1, 2\)\)"):
        step.save(tmp_path / "s.ncl")
    assert not (tmp_path / "s.ncl").exists() and not list(tmp_path.iterdir())  # nothing left


def test_captures_that_cannot_be_saved_are_refused_by_name(
    queue: cl.CommandQueue, ctx: cl.Context, kernels: Any, buf: Any, tmp_path: Path
) -> None:
    """save() refuses a capture on two queues, one on an out-of-order queue, an empty one and one
    holding a rectangle copy, each with its own message naming the file, and leaves no file
    behind."""
    x, y = buf(np.arange(8)), buf(np.ones(8))
    path = tmp_path / "cap.ncl"
    where = f"save({str(path)!r}): "
    one_queue = (
        "the capture uses {} queues (or an out-of-order queue); only a capture on one "
        "in-order queue can be saved"
    )
    other = cl.CommandQueue(ctx)
    ooo = cl.CommandQueue(ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    with KernelCapture() as two:
        kernels.axpy(queue, (8,), None, y, x, np.float32(2))
        kernels.axpy(other, (8,), None, y, x, np.float32(2))
    with KernelCapture() as unordered:
        kernels.axpy(ooo, (8,), None, y, x, np.float32(2))
    with KernelCapture() as empty:
        pass
    with KernelCapture() as rect:
        cl.enqueue_copy(
            queue,
            y,
            x,
            src_origin=(0, 0),
            dst_origin=(4, 0),
            region=(16, 1),
            src_pitches=(16,),
            dst_pitches=(16,),
        )
    rect_message = (
        "the capture holds a copy_buffer_rect, which a file cannot hold yet (buffer "
        "reads, writes, copies and fills can)"
    )
    for cap, message in (
        (two, one_queue.format(2)),
        (unordered, one_queue.format(1)),
        (empty, "the capture is empty"),
        (rect, rect_message),
    ):
        with pytest.raises(CaptureFileError) as refused:
            cap.save(path)
        assert str(refused.value) == where + message
    assert not list(tmp_path.iterdir())


def test_a_save_replaces_the_file_and_reports_its_size(
    queue: cl.CommandQueue,
    kernels: Any,
    buf: Any,
    tmp_path: Path,
    spans: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """save() writes the whole file in place of an older one (no partial file left) and
    returns its size; its span and its ``capture_saved`` event tell the file, the bytes and
    the launches."""
    x, y = buf(np.arange(8)), buf(np.ones(8))
    with KernelCapture() as cap:
        kernels.axpy(queue, (8,), None, y, x, np.float32(2))
        kernels.axpy(queue, (8,), None, y, x, np.float32(3))
    path = tmp_path / "cap.ncl"
    path.write_bytes(b"an older file")
    with caplog.at_level(logging.INFO, logger="netcl.runtime.capture"):
        size = cap.save(path)
    assert size == path.stat().st_size > 100 and list(tmp_path.iterdir()) == [path]
    (span,) = [s for s in spans.get_finished_spans() if s.name == "netcl.capture.save"]
    sections = _saved.inspect(path)["sections"]
    assert dict(span.attributes) == {
        "netcl.capture.file": str(path),
        "netcl.capture.bytes": size,
        "netcl.capture.sections": sections,
        "netcl.capture.launches": 2,
    }
    (event,) = [r for r in caplog.records if getattr(r, "event", None) == "capture_saved"]
    assert (event.file, event.bytes, event.launches) == (str(path), size, 2)  # type: ignore[attr-defined]
    loaded = load_capture(path, queue)
    assert loaded.num_launches == 2


@pytest.mark.parametrize("shape", [(), (1,)], ids=["0-d", "one-element"])
def test_a_buffer_first_copied_from_keeps_its_contents_and_a_repeated_launch_is_one_shape(
    queue: cl.CommandQueue,
    kernels: Any,
    buf: Any,
    host_read: Any,
    tmp_path: Path,
    shape: tuple[int, ...],
) -> None:
    """x is first the source of a copy (read whole: a constant, saved with its contents), y
    its destination (overwritten whole: scratch); a scalar set as a numpy array of one number
    (0-d, or 1-d of one element: pyopencl passes its bytes) is saved as that number; the same
    launch repeated is one launch of the file, and a command per repeat."""
    x, y = buf(np.arange(64)), buf(np.zeros(64))
    axpy = cl.Kernel(kernels.program, "axpy")
    with KernelCapture() as cap:
        cl.enqueue_copy(queue, y, x)
        axpy.set_args(y, x, np.full(shape, 0.5, np.float32))
        for _ in range(4):
            cl.enqueue_nd_range_kernel(queue, axpy, (64,), None)
    path = tmp_path / "cap.ncl"
    cap.save(path)
    assert _saved.inspect(path)["buffers"] == {
        "constant": {"count": 1, "bytes": 256},
        "scratch": {"count": 1, "bytes": 256},
    }
    manifest, _ = _manifest(path.read_bytes())
    assert len(manifest["launches"]) == 1 and len(manifest["commands"]) == 5
    loaded = load_capture(path, queue)
    cl.enqueue_copy(queue, x, np.zeros(64, np.float32))  # this process's x: not the file's
    loaded.replay()
    y2 = loaded.launches[0].args[0]
    np.testing.assert_array_equal(host_read(y2, 64), 3 * np.arange(64, dtype=np.float32))


BY_VALUE = """
__kernel void axpy_or_add(__global float *y, __global const float *x, const float a) {
    int i = get_global_id(0);
    y[i] += x ? a * x[i] : a;  /* x NULL: add a */
}
__kernel void add_first(__global float *y, const float16 v) {
    y[get_global_id(0)] += v.s0;
}
__kernel void add_real(__global float *y, const float2 z) {
    y[get_global_id(0)] += z.x;
}
"""


def test_arguments_set_one_at_a_time_and_null_pointers_are_saved(
    ctx: cl.Context, queue: cl.CommandQueue, buf: Any, host_read: Any, tmp_path: Path
) -> None:
    """Arguments set with ``Kernel.set_arg`` (a buffer, a one-number scalar, None for a NULL
    pointer) or a NULL pointer set with ``_set_arg_null`` are saved as set: the loaded
    capture's launches show them and its replay computes what the recorded launches did."""
    knl = cl.Kernel(cl.Program(ctx, BY_VALUE).build(), "axpy_or_add")
    y, x = buf(np.zeros(8)), buf(np.arange(8))
    with KernelCapture() as cap:
        knl.set_arg(0, y)
        knl.set_arg(1, x)
        knl.set_arg(2, np.float32(2))
        cl.enqueue_nd_range_kernel(queue, knl, (8,), None)  # y += 2 x
        knl.set_arg(1, None)
        cl.enqueue_nd_range_kernel(queue, knl, (8,), None)  # y += 2
        knl.set_arg(1, x)
        knl._set_arg_null(1)
        knl.set_arg(2, np.float32(0.5))
        cl.enqueue_nd_range_kernel(queue, knl, (8,), None)  # y += 0.5
    assert [launch.args for launch in cap.launches] == [(y, x, 2), (y, None, 2), (y, None, 0.5)]
    path = tmp_path / "cap.ncl"
    cap.save(path)
    loaded = load_capture(path, queue)
    y2, x2 = loaded.buffers
    assert [launch.args for launch in loaded.launches] == [
        (y2, x2, 2),
        (y2, None, 2),
        (y2, None, 0.5),
    ]
    loaded.replay()  # y held 2 x + 2.5 when saved
    np.testing.assert_array_equal(host_read(y2, 8), 4 * np.arange(8, dtype=np.float32) + 5)


def test_an_argument_a_file_cannot_hold_is_refused_by_name(
    ctx: cl.Context, queue: cl.CommandQueue, buf: Any, tmp_path: Path
) -> None:
    """save() refuses a kernel argument that is neither a buffer, a scalar of one number, local
    memory nor None, naming its index, its type and its value (cut to 60 characters): a
    by-value vector set as a numpy array of several numbers, a complex scalar that pyopencl
    packs into bytes. No file is left."""
    prg = cl.Program(ctx, BY_VALUE).build()
    add_first, add_real = cl.Kernel(prg, "add_first"), cl.Kernel(prg, "add_real")
    add_real.set_scalar_arg_dtypes([None, np.complex64])
    y = buf(np.zeros(4))
    with KernelCapture() as vector:
        add_first(queue, (4,), None, y, np.arange(16, dtype=np.float32))
    with KernelCapture() as packed:
        add_real(queue, (4,), None, y, np.complex64(0.5 - 2j))
    path = tmp_path / "cap.ncl"
    holds = "a file holds buffers, scalars of one number, local memory and None"
    for cap, what in (
        (vector, "ndarray (array([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10.)"),
        (packed, "bytes (b'\\x00\\x00\\x00?\\x00\\x00\\x00\\xc0')"),
    ):
        with pytest.raises(CaptureFileError) as refused:
            cap.save(path)
        assert str(refused.value) == f"save({str(path)!r}): kernel argument 1 is a {what}; {holds}"
    assert not list(tmp_path.iterdir())


def test_a_scalar_set_again_to_an_equal_value_keeps_one_launch_of_the_file(
    queue: cl.CommandQueue, kernels: Any, buf: Any, tmp_path: Path
) -> None:
    """A launch repeated with a scalar equal to the last one (a new object of the same type) is
    one launch of the saved file; an equal value of another type is recorded as passed (the
    capture's launch records show its type) and starts a launch of its own."""
    x, y = buf(np.arange(8)), buf(np.zeros(8))
    with KernelCapture() as cap:
        for _ in range(3):
            kernels.axpy(queue, (8,), None, y, x, np.float32(0.5))  # a new np.float32 each time
        kernels.axpy(queue, (8,), None, y, x, 2)
        kernels.axpy(queue, (8,), None, y, x, 2.0)
    recorded = [(np.float32, 0.5)] * 3 + [(int, 2), (float, 2.0)]
    assert [(type(a := launch.args[2]), a) for launch in cap.launches] == recorded
    path = tmp_path / "cap.ncl"
    cap.save(path)
    manifest, _ = _manifest(path.read_bytes())
    assert len(manifest["launches"]) == 3 and len(manifest["commands"]) == 5


def test_a_buffer_first_read_whole_keeps_its_contents(
    queue: cl.CommandQueue, kernels: Any, buf: Any, host_read: Any, tmp_path: Path
) -> None:
    """A buffer whose first use reads all of it to the host (a read overwrites the host array,
    not the buffer) is a constant: saved with its contents, which the loaded replay uses."""
    x, y = buf(np.arange(64)), buf(np.zeros(64))
    seen = np.empty(64, np.float32)
    with KernelCapture() as cap:
        cl.enqueue_copy(queue, seen, x)
        kernels.axpy(queue, (64,), None, y, x, np.float32(2))
    path = tmp_path / "cap.ncl"
    cap.save(path)
    assert _saved.inspect(path)["buffers"] == {"constant": {"count": 2, "bytes": 512}}
    loaded = load_capture(path, queue)
    y2, x2 = loaded.launches[0].args[:2]
    cl.enqueue_copy(queue, x, np.zeros(64, np.float32))  # this process's x: not the file's
    loaded.replay()  # y held 2 x when saved; the replay adds 2 x again
    np.testing.assert_array_equal(host_read(y2, 64), 4 * np.arange(64, dtype=np.float32))
    np.testing.assert_array_equal(host_read(x2, 64), np.arange(64, dtype=np.float32))


def test_sections_start_at_64_byte_aligned_offsets(
    queue: cl.CommandQueue, kernels: Any, buf: Any, tmp_path: Path
) -> None:
    """The layout the format declares: every section (program binary and source, a
    constant's contents, a write's host array of 12 bytes: not a multiple of 64) starts at
    a multiple of 64, and the manifest follows the last section."""
    x, y = buf(np.arange(64)), buf(np.zeros(64))
    with KernelCapture() as cap:
        cl.enqueue_copy(queue, y, np.ones(3, np.float32))
        kernels.axpy(queue, (64,), None, y, x, np.float32(2))
    path = tmp_path / "cap.ncl"
    cap.save(path)
    m = _format.read(open(path, "rb"), str(path), path.stat().st_size)  # noqa: SIM115
    assert len(m.sections) >= 4 and any(s.size % 64 for s in m.sections), m.sections
    assert [s.start % 64 for s in m.sections] == [0] * len(m.sections), m.sections
    _, offset = _manifest(path.read_bytes())
    assert offset == max(s.start + s.size for s in m.sections)


# -- hostile files ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, queue: cl.CommandQueue) -> bytes:
    """A valid saved step (the 8-layer MLP), as bytes."""
    step = capture_step(_MLP(queue).step)
    x = Tensor.from_numpy(np.ones((BATCH, WIDTH), np.float32), queue)
    step(x), step(x)
    path = tmp_path_factory.mktemp("saved") / "mlp.ncl"
    step.save(path)
    return path.read_bytes()


def _manifest(data: bytes) -> tuple[dict[str, Any], int]:
    _, _, _, offset, length, _ = _format.HEADER.unpack(data[: _format.HEADER.size])
    return json.loads(data[offset : offset + length]), offset


def _with_manifest(data: bytes, manifest: dict[str, Any]) -> bytes:
    """``data`` with another manifest (valid checksum): what a foreign but intact file is."""
    _, offset = _manifest(data)
    text = json.dumps(manifest).encode()
    head = _format.HEADER.pack(b"NETCLCAP", 2, 0, offset, len(text), zlib.crc32(text))
    return head + data[len(head) : offset] + text


def _refused(tmp: Path, data: bytes, queue: cl.CommandQueue, match: str) -> None:
    path = tmp / "hostile.ncl"
    path.write_bytes(data)
    with pytest.raises(CaptureFileError, match=match) as info:
        load_step(path, queue)
    assert str(path) in str(info.value)


def test_hostile_files_each_give_their_error(
    saved: bytes, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    manifest, offset = _manifest(saved)
    binary = list(manifest["sections"][manifest["programs"][0]["binary"]].values())
    flipped = bytearray(saved)
    flipped[binary[0] + binary[1] // 2] ^= 0x10  # one bit of the program binary
    weights = next(b["data"] for b in manifest["buffers"] if b["role"] == "constant")
    weight = bytearray(saved)
    weight[manifest["sections"][weights]["start"] + 3] ^= 0x01
    manifest_bit = bytearray(saved)
    manifest_bit[offset + 10] ^= 0x02
    cases = {
        "truncated in the data": (saved[: binary[0] + 100], "truncated"),
        "truncated in the header": (saved[:20], "shorter than the header"),
        "empty": (b"", "shorter than the header"),
        "a bit of a binary": (
            bytes(flipped),
            rf"section {manifest['programs'][0]['binary']} "
            "is damaged",
        ),
        "a bit of the weights": (bytes(weight), rf"section {weights} is damaged"),
        "a bit of the manifest": (bytes(manifest_bit), "manifest: its checksum does not match"),
        "another format": (b"PK\x03\x04" + saved[4:], "not a saved capture"),
        "a later version": (saved[:8] + struct.pack("<I", 3) + saved[12:], "format version 3"),
        "an oversized header": (
            saved[:24] + struct.pack("<Q", 1 << 40) + saved[32:],
            "more than the 67108864 a saved capture can have",
        ),
        "sections beyond the data": (
            _with_manifest(
                saved,
                {
                    **manifest,
                    "sections": [
                        {**manifest["sections"][0], "size": 1 << 30},
                        *manifest["sections"][1:],
                    ],
                },
            ),
            r"sections\[0\]: bytes .* lie outside the data",
        ),
        "a malformed manifest": (
            _with_manifest(saved, {**manifest, "launches": "?"}),
            r'launches: "\?", expected a list',
        ),
    }
    for name, (data, match) in cases.items():
        try:
            _refused(tmp_path, data, queue, match)
        except BaseException as exc:
            raise AssertionError(f"case {name!r}") from exc


def test_a_file_whose_buffers_exceed_the_devices_memory_is_refused_with_both_sizes(
    saved: bytes, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """A file needing more buffer memory than the device has is refused before anything is
    allocated, by a message giving the bytes it needs, the device's name and its memory."""
    manifest, _ = _manifest(saved)
    dev = queue.device
    spare = next(
        b for b in manifest["buffers"] if b.get("data") is None and b.get("parent") is None
    )
    buffers = [*manifest["buffers"], {**spare, "size": dev.global_mem_size}]
    need = sum(b["size"] for b in buffers if b.get("parent") is None)
    path = tmp_path / "huge.ncl"
    path.write_bytes(_with_manifest(saved, {**manifest, "buffers": buffers}))
    with pytest.raises(CaptureFileError) as info:
        load_step(path, queue)
    assert str(info.value).endswith(
        f"its buffers need {need} bytes, more than {dev.name.strip()!r} has ({dev.global_mem_size})"
    )
    assert str(path) in str(info.value)


def _header(data: bytes, **fields: int) -> bytes:
    """``data`` with header fields (version, flags, offset, length, crc) replaced."""
    magic, *values = _format.HEADER.unpack(data[: _format.HEADER.size])
    now = dict(zip(("version", "flags", "offset", "length", "crc"), values, strict=True))
    return _format.HEADER.pack(magic, *(now | fields).values()) + data[_format.HEADER.size :]


def test_a_damaged_header_or_manifest_gives_its_whole_message(
    saved: bytes, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """The whole message of each refusal of a damaged header or manifest: the file, then what
    is wrong, with the header's own numbers (a manifest's byte range, a version, flags)."""
    _, _, _, offset, length, _ = _format.HEADER.unpack(saved[: _format.HEADER.size])
    size, most = len(saved), _format.MAX_MANIFEST
    later = "load it with the netcl-capture that saved it, or a later one"
    manifest_bit = bytearray(saved)
    manifest_bit[offset + 10] ^= 0x02
    cases = {
        "cut in the manifest": (
            saved[: offset + 10],
            f"truncated: the manifest lies at bytes "
            f"{offset}..{offset + length} of a {offset + 10}-byte file",
        ),
        "a manifest of the most bytes": (
            _header(saved, length=most),
            f"truncated: the manifest"
            f" lies at bytes {offset}..{offset + most} of a "
            f"{size}-byte file",
        ),
        "one byte more": (
            _header(saved, length=most + 1),
            f"its manifest claims {most + 1} "
            f"bytes, more than the {most} a saved capture can have: the header "
            "is damaged",
        ),
        "a manifest inside the header": (
            _header(saved, offset=10),
            f"truncated: the manifest lies at bytes 10..{10 + length} of a {size}-byte file",
        ),
        "a manifest right after the header": (
            _header(saved, offset=64),
            "manifest: its checksum does not match: the file is damaged",
        ),
        "a bit of the manifest": (
            bytes(manifest_bit),
            "manifest: its checksum does not match: the file is damaged",
        ),
        "version 0": (
            _header(saved, version=0),
            f"format version 0 (flags 0); this netcl-capture reads versions 1 to 2: {later}",
        ),
        "flags": (
            _header(saved, flags=1),
            f"format version 2 (flags 1); this netcl-capture reads versions 1 to 2: {later}",
        ),
        "another format": (
            b"PK\x03\x04" + saved[4:],
            "not a saved capture: it starts with b'PK\\x03\\x04LCAP', expected b'NETCLCAP'",
        ),
        "20 bytes": (saved[:20], "20 bytes, shorter than the header"),
        "empty": (b"", "not a saved capture: 0 bytes, shorter than the header"),
    }
    path = tmp_path / "hostile.ncl"
    for name, (data, message) in cases.items():
        path.write_bytes(data)
        with pytest.raises(CaptureFileError) as info:
            load_step(path, queue)
        assert str(info.value) == f"{path}: {message}", name


def test_another_device_rebuilds_from_source_or_is_refused_by_name(
    saved: bytes,
    queue: cl.CommandQueue,
    tmp_path: Path,
    spans: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    manifest, _ = _manifest(saved)
    other = {**manifest, "device": {"identity": "Another GPU | 1.0", "name": "Another GPU"}}
    path = tmp_path / "other.ncl"
    path.write_bytes(_with_manifest(saved, other))
    with caplog.at_level(logging.INFO, logger="netcl.runtime.capture"):
        step = load_step(path, queue)  # rebuilt from the saved source
    x = Tensor.from_numpy(np.ones((BATCH, WIDTH), np.float32), queue)
    assert np.isfinite(step(x).to_numpy()).all()
    load = next(s for s in spans.get_finished_spans() if s.name == "netcl.capture.load")
    assert load.attributes["netcl.capture.rebuilt_programs"] == 1
    assert any(getattr(r, "event", None) == "capture_program_rebuilt" for r in caplog.records)
    no_source = {**other, "programs": [{**p, "source": None} for p in other["programs"]]}
    _refused(
        tmp_path,
        _with_manifest(saved, no_source),
        queue,
        r"saved for device 'Another GPU \| 1.0'; this queue's device is '.*', and program 0 "
        r"\(kernels matmul, bias_relu\) was saved without its source \(it was built from a "
        r"binary\), so it cannot be rebuilt here: save the capture on this device, or from a "
        r"process that built the program from source$",
    )


def test_a_program_whose_source_does_not_build_is_refused_naming_the_file(
    saved: bytes, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """A program saved without a binary (or for another device) is built from its source; a
    source that does not build here is refused naming the file, the program and the device,
    with the compiler's message (not as the program cache's or pyopencl's own error)."""
    manifest, _ = _manifest(saved)
    broken = [
        {**p, "binary": None, "options": "-Dfloat=no_such_type"} for p in manifest["programs"]
    ]
    path = tmp_path / "broken.ncl"
    path.write_bytes(_with_manifest(saved, {**manifest, "programs": broken}))
    with pytest.raises(CaptureFileError) as info:
        load_step(path, queue)
    message = str(info.value)
    assert message.startswith(
        f"{path}: programs[0].source does not build on {device_identity(queue.device)!r} "
        "(kernels matmul, bias_relu): "
    ), message
    assert "no_such_type" in message, message


def test_a_source_that_is_not_utf_8_is_refused_by_name(
    saved: bytes, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """A program's source section that is not UTF-8 text (here: the weights' bytes) is refused
    naming the field, before anything is built from it."""
    manifest, _ = _manifest(saved)
    weights = next(b["data"] for b in manifest["buffers"] if b["role"] == "constant")
    first = {**manifest["programs"][0], "binary": None, "source": weights}
    programs = [first, *manifest["programs"][1:]]
    _refused(
        tmp_path,
        _with_manifest(saved, {**manifest, "programs": programs}),
        queue,
        r"programs\[0\]\.source is not UTF-8 text$",
    )


def test_spans_and_inspect(
    saved: bytes,
    queue: cl.CommandQueue,
    tmp_path: Path,
    spans: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # whole lines (a COLUMNS the runner set would wrap a long temporary path onto its own line)
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "mlp.ncl"
    path.write_bytes(saved)
    load_step(path, queue)
    (load,) = [s for s in spans.get_finished_spans() if s.name == "netcl.capture.load"]
    assert load.attributes["netcl.capture.bytes"] == len(saved)
    assert load.attributes["netcl.capture.rebuilt_programs"] == 0
    assert load.attributes["netcl.capture.launches"] == 2 * LAYERS
    parser = argparse.ArgumentParser(prog="netcl")  # the command as `netcl` registers it
    _cli.register(parser.add_subparsers())

    def netcl(*argv: str) -> tuple[int, str, str]:
        args = parser.parse_args(["capture", "inspect", *argv])
        code = args.func(args)
        out, err = capsys.readouterr()
        return code, out, err

    code, text, _ = netcl(str(path))
    assert code == 0 and "matmul, bias_relu" in text and "constant" in text, text
    code, json_text, _ = netcl(str(path), "--json")
    doc = json.loads(json_text)
    assert doc["name"] == "_MLP.step" and doc["device"] == queue.device.name
    lines = text.splitlines()  # the text: a field per line, then a table of programs, of buffers
    assert [line.split()[0] for line in lines[:4]] == ["file", "holds", "device", "commands"]
    assert lines[0].endswith(f", format {doc['format_version']})")
    assert lines[1].split(None, 1)[1] == f"a step ({doc['name']})"
    assert lines[3].split(None, 1)[1] == f"{doc['commands']} ({2 * LAYERS} launches)"
    at = lines.index("programs:")
    assert lines[at + 1].split() == ["#", "binary", "source", "kernels"]
    assert lines[at + 2].split()[3:] == ["yes", "matmul,", "bias_relu"]  # 0, size, unit, ...
    assert len(lines) - lines.index("buffers:") - 2 == len(doc["buffers"])  # a header, then rows
    assert doc["launches"] == 2 * LAYERS and doc["kind"] == "step"
    code, text, err = netcl(str(tmp_path / "missing.ncl"))
    assert code == 1 and "cannot be read" in err
    with pytest.raises(SystemExit):
        netcl("--help")
    assert "print exactly one JSON document on stdout (messages go to stderr)" in " ".join(
        capsys.readouterr().out.split()
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 1 << 20),
    st.booleans(),
)
def test_random_mutations_never_crash(
    saved: bytes,
    queue: cl.CommandQueue,
    tmp_path: Path,
    flips: list[tuple[int, int]],
    cut: int,
    truncate: bool,
) -> None:
    data = bytearray(saved)
    for at, value in flips:
        data[at % len(data)] = value
    if truncate:
        data = data[: cut % len(data)]
    path = tmp_path / f"fuzz-{os.getpid()}.ncl"
    path.write_bytes(bytes(data))
    with contextlib.suppress(CaptureFileError):  # anything else fails the test
        load_step(path, queue)
