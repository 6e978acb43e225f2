"""capture_step on real kernels: a step runs normally, records on its second call, replays with
new argument buffers after; guards, the bound on captures, outputs, check mode, telemetry."""

from __future__ import annotations

import gc
import logging
import math
import weakref
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

from netcl.core.tensor import Tensor
from netcl.runtime.capture import (
    CapturedStep,
    KernelCapture,
    StepCheckError,
    StepStats,
    capture_step,
)

from .conftest import MLP_SOURCE

SOURCE = (
    MLP_SOURCE
    + """
__kernel void scale(__global float *out, __global const float *x, const float s) {
    int i = get_global_id(0);
    out[i] = x[i] * s;
}
__kernel void neighbours(__global float *out, __global const float *x, const int n) {
    int i = get_global_id(0);
    out[i] = x[i] + 0.5f * x[(i + 1) % n];
}
__kernel void axpy(__global float *y, __global const float *x, const float a) {
    int i = get_global_id(0);
    y[i] += a * x[i];
}
"""
)

F32 = np.float32
Host = np.ndarray[Any, Any]


class K:
    """The test kernels, with their scalar argument types set."""

    def __init__(self, ctx: cl.Context) -> None:
        prg = cl.Program(ctx, SOURCE).build()
        self.matmul = cl.Kernel(prg, "matmul")
        self.matmul.set_scalar_arg_dtypes([None, None, None, np.int32, np.int32])
        self.bias_relu = cl.Kernel(prg, "bias_relu")
        self.bias_relu.set_scalar_arg_dtypes([None, None, None, np.int32])
        self.scale = cl.Kernel(prg, "scale")
        self.scale.set_scalar_arg_dtypes([None, None, F32])
        self.neighbours = cl.Kernel(prg, "neighbours")
        self.neighbours.set_scalar_arg_dtypes([None, None, np.int32])
        self.axpy = cl.Kernel(prg, "axpy")
        self.axpy.set_scalar_arg_dtypes([None, None, F32])


@pytest.fixture(scope="module")
def k(ctx: cl.Context) -> K:
    return K(ctx)


def _host(rng: np.random.Generator, *shape: int) -> Host:
    return rng.standard_normal(shape).astype(F32)


def _scale_step(k: K, queue: cl.CommandQueue, **options: Any) -> CapturedStep[Any, Any]:
    @capture_step(**options)
    def scale(x: Tensor, s: float) -> Tensor:
        out = Tensor.empty(x.shape, F32, queue)
        k.scale(queue, (x.size,), None, out.buffer, x.buffer, s)
        return out

    return scale


# -- done-when: real steps against numpy on every call --------------------------------------


class MLP:
    """A two-layer MLP (matmul, bias + ReLU, twice) as a step of netcl Tensors."""

    def __init__(self, k: K, queue: cl.CommandQueue, rng: np.random.Generator) -> None:
        self.w = [_host(rng, 8, 16) / 4, _host(rng, 16, 4) / 4]
        self.b = [_host(rng, 16), _host(rng, 4)]
        self.dev = [
            (Tensor.from_numpy(w, queue), Tensor.from_numpy(b, queue))
            for w, b in zip(self.w, self.b, strict=True)
        ]
        self.k, self.queue = k, queue

    def step(self, x: Tensor) -> Tensor:
        queue, h = self.queue, x
        for w, b in self.dev:
            rows, (kk, m) = h.shape[0], w.shape
            z = Tensor.empty((rows, m), F32, queue)
            self.k.matmul(queue, (z.size,), None, z.buffer, h.buffer, w.buffer, kk, m)
            h = Tensor.empty((rows, m), F32, queue)
            self.k.bias_relu(queue, (h.size,), None, h.buffer, z.buffer, b.buffer, m)
        return h

    def reference(self, x: Host) -> Host:
        for w, b in zip(self.w, self.b, strict=True):
            x = np.maximum(x @ w + b, 0)
        return x


def test_mlp_step_gives_numpys_answer_on_every_call(k: K, queue: cl.CommandQueue) -> None:
    rng = np.random.default_rng(1)
    mlp = MLP(k, queue, rng)
    step = capture_step(mlp.step)
    assert step.last_reason is None  # nothing recorded yet
    outs = []
    for i in range(8):
        x = _host(rng, 5, 8)
        out = step(Tensor.from_numpy(x, queue))  # a new input tensor every call
        np.testing.assert_allclose(
            out.to_numpy(), mlp.reference(x), rtol=1e-5, atol=1e-5, err_msg=f"call {i}"
        )
        outs.append(out)
    assert step.stats == StepStats(runs=1, captures=1, replays=6, evictions=0)
    assert step.num_captures == 1 and step.last_reason == "first capture"
    assert step.num_launches == 4
    # replays return the capture's own output: the recorded call's Tensor, every time
    assert outs[0] is not outs[1]
    assert all(o is outs[1] for o in outs[2:])


@pytest.mark.parametrize("check", [False, True])  # a checked first replay too
def test_pyopencl_array_step_gives_numpys_answer(queue: cl.CommandQueue, check: bool) -> None:
    rng = np.random.default_rng(2)
    w = _host(rng, 32)
    dev_w = cla.to_device(queue, w)
    zeros = cla.zeros(queue, 32, F32)

    @capture_step(check=check)
    def step(a: cla.Array, b: cla.Array) -> tuple[cla.Array, cla.Array]:
        s = a * dev_w + b
        return cla.maximum(s, zeros), (a - b) * 2

    recorded_events: list[Any] = []
    for i in range(6):
        a, b = _host(rng, 32), _host(rng, 32)
        relu, diff = step(cla.to_device(queue, a), cla.to_device(queue, b))
        if i == 1:
            recorded_events = [*relu.events, *diff.events]
        elif i > 1:  # an output array waits for the replay that wrote it, not the recording
            assert relu.events[0] not in recorded_events and diff.events[0] is relu.events[0]
            # (a checked replay's comparison reads the outputs: pyopencl adds those reads)
            assert len(relu.events) == 1 or (check and i == 2)
        np.testing.assert_allclose(
            relu.get(), np.maximum(a * w + b, 0), rtol=1e-6, err_msg=f"call {i}"
        )
        np.testing.assert_allclose(diff.get(), (a - b) * 2, rtol=1e-6, err_msg=f"call {i}")
    assert step.stats.replays == 4 and step.stats.captures == 1


def test_shape_change_records_again_and_both_shapes_keep_replaying(
    k: K, queue: cl.CommandQueue
) -> None:
    rng = np.random.default_rng(3)
    mlp = MLP(k, queue, rng)
    step = capture_step(mlp.step)
    for i, rows in enumerate([4, 4, 4, 9, 9, 9, 4, 9, 4, 9]):
        x = _host(rng, rows, 8)
        got = step(Tensor.from_numpy(x, queue)).to_numpy()
        assert got.shape == (rows, 4)
        np.testing.assert_allclose(
            got, mlp.reference(x), rtol=1e-5, atol=1e-5, err_msg=f"call {i}, {rows} rows"
        )
    assert step.num_captures == 2
    assert step.stats == StepStats(runs=2, captures=2, replays=6, evictions=0)
    assert step.last_reason == "shape of x changed (4, 8) -> (9, 8)"


def test_bound_on_captures_holds_drops_the_least_recently_used_and_frees_its_buffers(
    k: K, queue: cl.CommandQueue
) -> None:
    step = _scale_step(k, queue, max_captures=2, warmup=0)
    refcount = cl.mem_info.REFERENCE_COUNT

    def call(n: int) -> Tensor:
        x = np.arange(n, dtype=F32)
        out: Tensor = step(Tensor.from_numpy(x, queue), 2.0)
        np.testing.assert_allclose(out.to_numpy(), 2 * x)
        return out

    a = call(4)
    a_buffer = a.buffer
    held = a_buffer.get_info(refcount)  # the Tensor's own and the capture's reference
    a_ref = weakref.ref(a)
    call(8)
    call(4)  # A used last: B is now the least recently used
    assert step.num_captures == 2
    b_again = call(16)  # a third shape drops B, not A
    assert step.num_captures == 2 and step.stats.evictions == 1
    assert call(4) is a  # A still replays
    call(8)  # B records again (dropping C, the least recently used now)
    assert step.stats.captures == 4 and step.num_captures == 2
    # compared with the capture used last (A, shape 4)
    assert step.last_reason == (
        "shape of x changed (4,) -> (8,) (recorded before, dropped to keep 2 captures)"
    )
    del b_again
    # dropping a capture frees its buffers: A's capture goes with the fourth shape
    call(32)
    assert step.num_captures == 2
    del a
    gc.collect()
    assert a_ref() is None, "the dropped capture's output Tensor is still alive"
    assert a_buffer.get_info(refcount) == held - 1, "the dropped capture kept its reference"


def test_reset_drops_every_capture_and_its_buffers(k: K, queue: cl.CommandQueue) -> None:
    step = _scale_step(k, queue, warmup=0)
    out = step(Tensor.from_numpy(np.ones(4, F32), queue), 3.0)
    ref = weakref.ref(out)
    del out
    step.reset()
    gc.collect()
    assert step.num_captures == 0 and ref() is None
    np.testing.assert_allclose(step(Tensor.from_numpy(np.ones(4, F32), queue), 3.0).to_numpy(), 3)


# -- check mode --------------------------------------------------------------------------------

SCALE = 2.0


def test_check_mode_catches_a_step_that_reads_a_changing_global(
    k: K, queue: cl.CommandQueue
) -> None:
    global SCALE
    SCALE = 2.0

    @capture_step(check=True)
    def scaled(x: Tensor) -> Tensor:
        out = Tensor.empty(x.shape, F32, queue)
        k.scale(queue, (x.size,), None, out.buffer, x.buffer, SCALE)  # not a guarded argument
        return out

    x = Tensor.from_numpy(np.arange(6, dtype=F32), queue)
    scaled(x)
    scaled(x)  # recorded with SCALE = 2
    SCALE = 3.0
    with pytest.raises(StepCheckError, match=r"the output differs .*max abs diff 5\b") as info:
        scaled(x)
    assert info.value.output == 0 and info.value.max_abs_diff == pytest.approx(5.0)
    assert str(info.value).endswith(
        "The step depends on something its guards do not see (a global or closure value that "
        "changed, a host-side decision): pass it as an argument. The capture was dropped; the "
        "next call with these arguments records again."
    )
    assert scaled.num_captures == 0  # the wrong capture is gone
    # the next call records again, with the current value, and then replays correctly
    scaled(x)
    np.testing.assert_allclose(scaled(x).to_numpy(), 3 * np.arange(6))


def _two_outputs(k: K, queue: cl.CommandQueue, factor: list[float], **options: Any) -> Any:
    """A checked step of two outputs: x, and x scaled by ``factor[0]`` (changed by the test)."""

    @capture_step(check=True, warmup=0, **options)
    def two(x: Tensor) -> tuple[Tensor, Tensor]:
        same, changing = Tensor.empty(x.shape, F32, queue), Tensor.empty(x.shape, F32, queue)
        k.scale(queue, (x.size,), None, same.buffer, x.buffer, 1.0)
        k.scale(queue, (x.size,), None, changing.buffer, x.buffer, factor[0])
        return same, changing

    return two


def test_check_mode_names_the_differing_output_of_a_tuple(k: K, queue: cl.CommandQueue) -> None:
    factor = [1.0]
    two = _two_outputs(k, queue, factor)
    x = Tensor.from_numpy(np.ones(4, F32), queue)
    two(x)
    factor[0] = 1.5
    message = r"\(first capture\): output 1 differs .*max abs diff 0\.5"
    with pytest.raises(StepCheckError, match=message) as info:
        two(x)
    assert info.value.output == 1
    two(x)  # recorded again, and its reason says why
    assert two.last_reason == "first capture (recorded before, dropped by a failed check)"


def test_check_mode_counts_a_nan_against_a_number_as_an_infinite_difference(
    k: K, queue: cl.CommandQueue
) -> None:
    """The replay gives numbers where the normal run gives NaN: the check fails with an
    infinite max abs diff (NaN in both places would count as equal)."""
    factor = [1.0]
    two = _two_outputs(k, queue, factor)
    x = Tensor.from_numpy(np.ones(4, F32), queue)
    two(x)
    factor[0] = float("nan")
    with pytest.raises(StepCheckError, match=r"output 1 differs .*max abs diff inf") as info:
        two(x)
    assert (info.value.output, info.value.max_abs_diff) == (1, math.inf)


def test_check_mode_names_the_first_output_the_normal_run_added(
    k: K, queue: cl.CommandQueue
) -> None:
    """The normal run returns more outputs than the capture did: the check fails at the first
    index one of them lacks, with an infinite difference."""
    more = [False]

    @capture_step(check=True, warmup=0)
    def outputs(x: Tensor) -> list[Tensor]:
        made = [Tensor.empty(x.shape, F32, queue) for _ in range(2 if more[0] else 1)]
        for out in made:
            k.scale(queue, (x.size,), None, out.buffer, x.buffer, 1.0)
        return made

    x = Tensor.from_numpy(np.ones(4, F32), queue)
    outputs(x)
    more[0] = True
    with pytest.raises(StepCheckError, match=r"output 1 differs") as info:
        outputs(x)
    assert (info.value.output, info.value.max_abs_diff) == (1, math.inf)


def test_check_mode_passes_a_faithful_step_and_stops_checking(k: K, queue: cl.CommandQueue) -> None:
    rng = np.random.default_rng(4)
    mlp = MLP(k, queue, rng)
    runs = [0]

    def counted(x: Tensor) -> Tensor:
        runs[0] += 1
        return mlp.step(x)

    step = capture_step(counted, check=True)
    for _ in range(5):
        x = _host(rng, 3, 8)
        np.testing.assert_allclose(
            step(Tensor.from_numpy(x, queue)).to_numpy(), mlp.reference(x), rtol=1e-5, atol=1e-5
        )
    assert runs[0] == 3  # warm-up, recording, and the checked first replay; then replays only
    assert step.stats.replays == 3


def test_check_mode_passes_a_step_returning_its_argument_among_its_outputs(
    k: K, queue: cl.CommandQueue
) -> None:
    """The checked first replay of a step that returns one of its arguments, and a view of its
    buffer, returns this call's argument and a view of this call's buffer there, as plain
    replays do, and the check passes."""

    @capture_step(check=True, warmup=0)
    def scaled_and_input(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = Tensor.empty(x.shape, F32, queue)
        k.scale(queue, (x.size,), None, out.buffer, x.buffer, 2.0)
        return out, x, Tensor(x.buffer, (2, 2), F32, queue)

    for i in range(3):  # recorded, the checked first replay, a plain replay
        x = Tensor.from_numpy(np.full(4, i, F32), queue)
        out, same, matrix = scaled_and_input(x)
        assert same is x and matrix.buffer is x.buffer and matrix.shape == (2, 2)
        np.testing.assert_allclose(out.to_numpy(), 2 * i)
    assert scaled_and_input.stats.replays == 2 and scaled_and_input.num_captures == 1


def test_check_mode_with_copy_outputs_returns_a_copy_from_the_checked_replay(
    k: K, queue: cl.CommandQueue
) -> None:
    """With ``copy_outputs=True`` the checked first replay, like a plain one, returns a copy
    that later calls do not overwrite."""
    step = _scale_step(k, queue, check=True, warmup=0, copy_outputs=True)
    outs = [step(Tensor.from_numpy(np.full(4, i, F32), queue), 2.0) for i in range(4)]
    assert step.stats.replays == 3
    for i, out in enumerate(outs):  # recorded, checked replay, two plain replays
        np.testing.assert_allclose(out.to_numpy(), 2 * i, err_msg=f"call {i}")


# -- outputs --------------------------------------------------------------------------------


def test_an_output_passed_back_as_input_is_not_aliased(k: K, queue: cl.CommandQueue) -> None:
    """``h = step(h)``: from the third call on the input is the capture's own output buffer,
    which the replay writes while reading the input; the step must work on a copy."""
    n = 16

    @capture_step
    def smooth(x: Tensor) -> Tensor:
        out = Tensor.empty(x.shape, F32, queue)
        k.neighbours(queue, (n,), None, out.buffer, x.buffer, n)
        return out

    host = np.random.default_rng(5).standard_normal(n).astype(F32)
    h = Tensor.from_numpy(host, queue)
    for i in range(6):
        h = smooth(h)
        host = host + 0.5 * np.roll(host, -1)
        np.testing.assert_allclose(h.to_numpy(), host, rtol=1e-5, err_msg=f"call {i}")


def test_copy_outputs_returns_tensors_the_next_call_does_not_overwrite(
    k: K, queue: cl.CommandQueue
) -> None:
    step = _scale_step(k, queue, copy_outputs=True)
    outs = [step(Tensor.from_numpy(np.full(4, i, F32), queue), 2.0) for i in range(5)]
    assert len({id(o) for o in outs}) == 5
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out.to_numpy(), 2 * i)


@pytest.mark.parametrize("as_tuple", [False, True])
def test_a_copied_output_waits_for_the_commands_launched_on_another_queue(
    k: K, ctx: cl.Context, queue: cl.CommandQueue, as_tuple: bool
) -> None:
    """``copy_outputs``: the copy of an output (made on the output's queue), alone or in a
    tuple, waits for the commands that write it, the recording call's as a replay's, even when
    the step launched on another queue; while that queue is held, the copy does not run and
    read what was there before."""
    import threading

    other = cl.CommandQueue(ctx)

    @capture_step(warmup=0, copy_outputs=True)
    def scale(x: Tensor) -> Any:
        out = Tensor.empty(x.shape, F32, other)  # the output's queue is not the launch's
        k.scale(queue, (x.size,), None, out.buffer, x.buffer, 2.0)
        return (out,) if as_tuple else out

    def scaled(x: Tensor) -> Tensor:
        result = scale(x)
        return result[0] if as_tuple else result  # type: ignore[no-any-return]

    for i in range(1, 4):  # the recording call, then two replays
        assert scale.stats == StepStats(
            runs=0, captures=min(1, i - 1), replays=max(0, i - 2), evictions=0
        )
        x = Tensor.from_numpy(np.full(4, i, F32), queue)
        queue.finish()
        gate = cl.UserEvent(ctx)
        cl.enqueue_marker(queue, wait_for=[gate])  # the step's commands wait behind this
        # opened later: meanwhile the copy would run, were it not waiting for those commands
        opener = threading.Timer(0.3, gate.set_status, [cl.command_execution_status.COMPLETE])
        opener.start()
        out = scaled(x)
        other.flush()
        opener.join()
        np.testing.assert_array_equal(out.to_numpy(), 2 * i, err_msg=f"call {i}")
    assert scale.stats == StepStats(runs=0, captures=1, replays=2, evictions=0)


def test_the_recording_call_with_copy_outputs_waits_for_every_queue_it_launched_on(
    k: K, ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    """``copy_outputs``: the recording call returns copies made after the commands it recorded
    are done on every queue they used, not only the last one: the output's writer, held on its
    queue until a gate opens, is copied after it ran, though a later launch used another
    queue."""
    import threading

    other, last = cl.CommandQueue(ctx), cl.CommandQueue(ctx)

    @capture_step(warmup=0, copy_outputs=True)
    def scale(x: Tensor) -> Tensor:
        out = Tensor.empty(x.shape, F32, other)  # copied on its own queue
        k.scale(queue, (x.size,), None, out.buffer, x.buffer, 2.0)  # held behind the gate
        spare = Tensor.empty(x.shape, F32, last)
        k.scale(last, (x.size,), None, spare.buffer, x.buffer, 1.0)  # the last command
        return out

    x = Tensor.from_numpy(np.full(4, 3.5, F32), queue)
    queue.finish()
    gate = cl.UserEvent(ctx)
    cl.enqueue_marker(queue, wait_for=[gate])
    opener = threading.Timer(0.3, gate.set_status, [cl.command_execution_status.COMPLETE])
    opener.start()
    out = scale(x)  # the recording call
    opener.join()
    np.testing.assert_array_equal(out.to_numpy(), np.full(4, 7, F32))
    assert scale.stats == StepStats(runs=0, captures=1, replays=0, evictions=0)


def test_a_key_part_way_through_its_warmup_keeps_its_count_while_others_record(
    k: K, queue: cl.CommandQueue
) -> None:
    """The warm-up counts kept (at least 16) are those of keys not recorded: a key that ran
    once of ``warmup=1`` records at its next call even after 16 other keys (a step counter)
    each warmed up and recorded meanwhile."""
    step = _scale_step(k, queue, warmup=1, max_captures=8)
    x = Tensor.from_numpy(np.ones(4, F32), queue)
    step(x, 100.0)  # warms up
    for s in range(16):
        for _ in range(2):  # the warm-up, the recording
            step(x, float(s))
    assert step.stats == StepStats(runs=17, captures=16, replays=0, evictions=8)
    np.testing.assert_array_equal(step(x, 100.0).to_numpy(), np.full(4, 100, F32))
    assert step.stats == StepStats(runs=17, captures=17, replays=0, evictions=9)
    assert step.last_reason == "value of s changed 15.0 -> 100.0"


def test_repr_names_the_step_its_captures_and_replays(k: K, queue: cl.CommandQueue) -> None:
    """``repr`` of a step: its name, captures kept out of ``max_captures``, replays."""
    step = _scale_step(k, queue, max_captures=3, name="scaler")
    assert repr(step) == "CapturedStep(scaler, captures=0/3, replays=0)"
    for _ in range(4):  # the warm-up, the recording, two replays
        step(Tensor.from_numpy(np.ones(4, F32), queue), 2.0)
    assert repr(step) == "CapturedStep(scaler, captures=1/3, replays=2)"


@pytest.mark.parametrize("warmup", [0, 1, 2, 3])
def test_warmup_is_the_number_of_normal_calls_before_the_recording(
    k: K, queue: cl.CommandQueue, warmup: int
) -> None:
    """With ``warmup=n`` the first n calls of a key run the step, call n + 1 records, the
    later ones replay; every call gives the right answer."""
    step = _scale_step(k, queue, warmup=warmup)
    seen = []
    for i in range(warmup + 3):
        x = np.full(4, i, F32)
        np.testing.assert_allclose(step(Tensor.from_numpy(x, queue), 2.0).to_numpy(), 2 * x)
        seen.append(tuple(step.stats))
    assert seen == (
        [(i + 1, 0, 0, 0) for i in range(warmup)]
        + [(warmup, 1, 0, 0), (warmup, 1, 1, 0), (warmup, 1, 2, 0)]
    )


def test_copy_outputs_of_none_an_array_and_keyword_arguments(queue: cl.CommandQueue) -> None:
    """``copy_outputs`` with a step returning None (None on every call) and one returning a
    pyopencl Array (a copy the next call does not overwrite); keyword arguments reach the
    step in its warm-up, recording and replays alike."""

    @capture_step(copy_outputs=True)
    def nothing(x: cla.Array) -> None:
        x += 1  # in place

    @capture_step(copy_outputs=True)
    def twice(x: cla.Array, *, scale: float) -> cla.Array:
        return x * scale

    outs = []
    for i in range(4):
        x = cla.to_device(queue, np.full(4, i, F32))
        assert nothing(x) is None
        np.testing.assert_array_equal(x.get(), i + 1)
        outs.append(twice(x=x, scale=2.0))
    assert len({id(o) for o in outs}) == 4
    for i, out in enumerate(outs):
        assert isinstance(out, cla.Array)
        np.testing.assert_array_equal(out.get(), 2 * (i + 1))
    assert nothing.stats == twice.stats == StepStats(runs=1, captures=1, replays=2, evictions=0)


def test_in_place_step_returning_none_and_one_returning_its_argument(
    k: K, queue: cl.CommandQueue
) -> None:
    @capture_step
    def update(w: Tensor, g: Tensor) -> None:
        k.axpy(queue, (w.size,), None, w.buffer, g.buffer, -0.5)

    @capture_step
    def doubled(w: Tensor) -> Tensor:
        k.axpy(queue, (w.size,), None, w.buffer, w.buffer, 1.0)
        return w

    @capture_step
    def as_matrix(w: Tensor) -> Tensor:
        k.axpy(queue, (w.size,), None, w.buffer, w.buffer, 1.0)
        return Tensor(w.buffer, (2, 2), F32, queue)  # a view of the argument's buffer

    for i in range(4):
        w = Tensor.from_numpy(np.full(4, i, F32), queue)
        assert update(w, Tensor.from_numpy(np.full(4, 2, F32), queue)) is None
        np.testing.assert_allclose(w.to_numpy(), i - 1)
        v = Tensor.from_numpy(np.full(4, i, F32), queue)
        assert doubled(v) is v  # the output was the argument: this call's argument
        np.testing.assert_allclose(v.to_numpy(), 2 * i)
        u = Tensor.from_numpy(np.full(4, i, F32), queue)
        m = as_matrix(u)
        assert m.buffer is u.buffer and m.shape == (2, 2)
        np.testing.assert_allclose(m.to_numpy(), np.full((2, 2), 2 * i))
    assert update.stats.replays == doubled.stats.replays == as_matrix.stats.replays == 2


def test_outputs_viewing_an_argument_at_an_offset_or_transposed(queue: cl.CommandQueue) -> None:
    """Views of the argument's buffer (a slice at an offset, a transpose with other strides):
    each replay returns them on this call's argument, with the recorded offset and strides."""

    @capture_step
    def views(x: cla.Array) -> tuple[cla.Array, cla.Array]:
        x *= 2  # in place
        return x[1:], x.T

    for i in range(4):
        host = np.arange(12, dtype=F32).reshape(3, 4) + i
        x = cla.to_device(queue, host)
        rows, t = views(x)
        assert rows.offset == 16 and t.strides == (4, 16)
        np.testing.assert_array_equal(rows.get(), 2 * host[1:], err_msg=f"call {i}")
        np.testing.assert_array_equal(t.get(), 2 * host.T, err_msg=f"call {i}")
    assert views.stats.replays == 2


def test_a_list_result_is_a_new_list_on_every_replay(k: K, queue: cl.CommandQueue) -> None:
    """The caller may change the list a step returned: the next replay's list is whole."""

    @capture_step
    def pair(x: Tensor) -> list[Tensor]:
        a, b = Tensor.empty(x.shape, F32, queue), Tensor.empty(x.shape, F32, queue)
        k.scale(queue, (x.size,), None, a.buffer, x.buffer, 2.0)
        k.scale(queue, (x.size,), None, b.buffer, x.buffer, 3.0)
        return [a, b]

    for i in range(4):
        x = Tensor.from_numpy(np.full(4, i, F32), queue)
        got = pair(x)
        assert len(got) == 2, f"call {i}"
        np.testing.assert_array_equal(got[0].to_numpy(), 2 * i)
        np.testing.assert_array_equal(got[1].to_numpy(), 3 * i)
        got.clear()
    assert pair.stats.replays == 2


@pytest.mark.parametrize("copy", [False, True])
def test_a_call_waiting_while_another_thread_records_replays_that_capture(
    k: K, queue: cl.CommandQueue, copy: bool
) -> None:
    """A call with the key another thread is recording waits for that recording, then
    replays it (it neither records again nor runs the step) and gets its outputs: the
    recorded output, its own argument, a view of its argument; with ``copy_outputs``, copies
    of them that the next call does not overwrite."""
    import threading
    import time

    others: list[Any] = []
    errors: list[BaseException] = []
    y = Tensor.from_numpy(np.full(4, 5, F32), queue)

    def other_call() -> None:
        try:
            others.append(step(y))
        except BaseException as exc:
            errors.append(exc)

    @capture_step(warmup=0, copy_outputs=copy)
    def step(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = Tensor.empty(x.shape, F32, queue)
        k.scale(queue, (x.size,), None, out.buffer, x.buffer, 2.0)
        if not others and not errors and not hasattr(step, "thread"):
            step.thread = threading.Thread(target=other_call)  # type: ignore[attr-defined]
            step.thread.start()  # type: ignore[attr-defined]
            time.sleep(0.5)  # the other call finds no capture yet and waits for this one
        return out, x, Tensor(x.buffer, (2, 2), F32, queue)

    x = Tensor.from_numpy(np.full(4, 1, F32), queue)
    first = step(x)
    step.thread.join()  # type: ignore[attr-defined]
    assert not errors, errors
    (other,) = others
    if copy:  # each call's own copies, of its own result
        assert all(isinstance(o, Tensor) for o in other)
        assert other[0] is not first[0] and other[1] is not y and other[2].buffer is not y.buffer
        np.testing.assert_array_equal(first[0].to_numpy(), 2)
    else:
        assert other[0] is first[0]  # a replay returns the recorded output, overwritten
        assert other[1] is y and other[2].buffer is y.buffer  # this call's argument, and a view
    assert other[2].shape == (2, 2)
    step(Tensor.from_numpy(np.full(4, 7, F32), queue))  # overwrites the recorded output
    np.testing.assert_array_equal(other[0].to_numpy(), 14 if not copy else 10)
    np.testing.assert_array_equal(other[1].to_numpy(), 5)
    np.testing.assert_array_equal(other[2].to_numpy(), np.full((2, 2), 5))
    assert step.stats == StepStats(runs=0, captures=1, replays=2, evictions=0)


def test_host_side_effects_run_only_when_the_step_runs(k: K, queue: cl.CommandQueue) -> None:
    calls = []

    @capture_step
    def step(x: Tensor) -> Tensor:
        calls.append(x.shape)  # a Python side effect: not part of a replay
        out = Tensor.empty(x.shape, F32, queue)
        k.scale(queue, (x.size,), None, out.buffer, x.buffer, 2.0)
        return out

    for _ in range(5):
        step(Tensor.from_numpy(np.ones(3, F32), queue))
    assert len(calls) == 2  # the warm-up call and the recording call


# -- guards and bad input -------------------------------------------------------------------


def test_a_non_tensor_argument_is_part_of_the_key(k: K, queue: cl.CommandQueue) -> None:
    step = _scale_step(k, queue)
    x = np.arange(4, dtype=F32)
    for s in [2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 2.0, 3.0]:
        np.testing.assert_allclose(step(Tensor.from_numpy(x, queue), s).to_numpy(), s * x)
    assert step.num_captures == 2
    assert step.last_reason == "value of s changed 2.0 -> 3.0"
    # keyword arguments are guarded the same way (the generic call path)
    for s in [4.0, 4.0, 4.0]:
        np.testing.assert_allclose(step(Tensor.from_numpy(x, queue), s=s).to_numpy(), s * x)
    assert step.last_reason == "keyword arguments changed () -> ('s',)"


def test_an_unhashable_argument_is_a_type_error_naming_it(k: K, queue: cl.CommandQueue) -> None:
    step = _scale_step(k, queue)
    x = Tensor.from_numpy(np.ones(4, F32), queue)
    with pytest.raises(TypeError) as caught:
        step(x, [2.0])  # type: ignore[arg-type]
    assert str(caught.value) == (
        "captured step _scale_step.<locals>.scale: argument s is an unhashable list; a captured "
        "step keys its captures on the values of its non-Tensor arguments, so they must be "
        "hashable: pass a tuple instead of a list, a Tensor instead of a numpy array, or read "
        "the value from outside the step"
    )
    assert step.stats == StepStats(0, 0, 0, 0)  # nothing ran
    np.testing.assert_allclose(step(x, 2.0).to_numpy(), 2)

    @capture_step
    def three(x: Tensor, s: Any, t: Any) -> None:
        raise AssertionError("not called")

    for args, kwargs in [((x, [1.0], 2.0), {}), ((x,), {"t": 2.0, "s": {1.0}})]:
        with pytest.raises(TypeError, match=r": argument s is an unhashable (list|set);"):
            three(*args, **kwargs)  # the first unhashable argument is named, not the last


@pytest.mark.parametrize("warmup", [1, 0])
def test_a_step_returning_a_host_value_is_refused_at_its_first_call(
    queue: cl.CommandQueue, warmup: int
) -> None:
    """Whether the first call runs the step (warm-up) or records it, a host value returned
    alone or inside a tuple is a TypeError naming the step, the type and the item."""

    @capture_step(warmup=warmup, name="total")
    def total(a: cla.Array, pair: bool) -> Any:
        value = float(cla.sum(a).get())
        return (a, value) if pair else value

    rule = (
        "; a captured step must return None, a Tensor, a pyopencl Array, or a tuple or list "
        "of them (a host value computed inside the step would not be recomputed by a "
        "replay)"
    )
    a = cla.to_device(queue, np.ones(4, F32))
    with pytest.raises(TypeError) as caught:
        total(a, False)
    assert str(caught.value) == "captured step total: returned float" + rule
    with pytest.raises(TypeError) as caught:
        total(a, True)
    assert str(caught.value) == "captured step total: returned float (item 1 of the tuple)" + rule
    assert total.num_captures == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_captures": 0}, "max_captures must be an int >= 1, got 0"),
        ({"max_captures": 2.0}, "max_captures must be an int >= 1, got 2.0"),
        ({"warmup": -1}, "warmup must be an int >= 0, got -1"),
        ({"warmup": True}, "warmup must be an int >= 0, got True"),
        ({"check_atol": float("nan")}, "check_atol must be a finite number >= 0, got nan"),
        ({"check_atol": float("inf")}, "check_atol must be a finite number >= 0, got inf"),
        ({"check_atol": -1e-9}, "check_atol must be a finite number >= 0, got -1e-09"),
        ({"check_atol": True}, "check_atol must be a finite number >= 0, got True"),
        ({"check_atol": "0"}, "check_atol must be a finite number >= 0, got '0'"),
        ({"name": ""}, "name must be a non-empty str or None, got ''"),
        ({"name": 3}, "name must be a non-empty str or None, got 3"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    """Each bad option is a ValueError naming it and the value given."""
    with pytest.raises(ValueError) as caught:
        capture_step(**options)(lambda: None)
    assert str(caught.value) == f"capture_step: {message}"


def test_the_least_options_are_accepted_and_a_non_callable_refused() -> None:
    """``warmup=0``, ``max_captures=1``, ``check_atol=0`` and a name are valid; a step that is
    not callable is a TypeError naming its type."""
    step = capture_step(warmup=0, max_captures=1, check_atol=0, name="s")(lambda: None)
    assert (step.name, step.max_captures) == ("s", 1)
    with pytest.raises(TypeError) as caught:
        capture_step(5)  # type: ignore[call-overload]
    assert str(caught.value) == "capture_step: expected a callable step function, got int 5"


def test_aliased_arguments_get_a_capture_of_their_own(k: K, queue: cl.CommandQueue) -> None:
    @capture_step(warmup=0)
    def add_scaled(y: Tensor, x: Tensor) -> Tensor:
        k.axpy(queue, (y.size,), None, y.buffer, x.buffer, 1.0)
        return y

    for i in range(3):
        a, b = (Tensor.from_numpy(np.full(4, v, F32), queue) for v in (i, 10))
        np.testing.assert_allclose(add_scaled(a, b).to_numpy(), i + 10)
        c = Tensor.from_numpy(np.full(4, i, F32), queue)
        np.testing.assert_allclose(add_scaled(c, c).to_numpy(), 2 * i)
    assert add_scaled.num_captures == 2


def test_an_input_smaller_than_the_recorded_buffer_is_staged(k: K, queue: cl.CommandQueue) -> None:
    step = _scale_step(k, queue, warmup=0)
    big = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4096)  # e.g. a pool's size class
    recorded = Tensor(big, (4,), F32, queue)
    recorded.write(np.ones(4, F32))
    step(recorded, 2.0)
    for i in range(3):  # exact-size buffers: the replay needs the recorded size
        np.testing.assert_allclose(
            step(Tensor.from_numpy(np.full(4, i, F32), queue), 2.0).to_numpy(), 2 * i
        )


def test_an_array_without_a_queue_is_staged_on_the_first_commands_queue(
    queue: cl.CommandQueue,
) -> None:
    """An Array argument made on a context (no queue) and smaller than the recorded buffer: its
    staging copy goes on the queue of the capture's first command."""

    @capture_step(warmup=0)
    def double(a: cla.Array) -> cla.Array:
        return a.with_queue(queue) * 2

    big = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4096)  # e.g. a pool's size class
    recorded = cla.Array(queue.context, (4,), F32, data=big)
    recorded.set(np.ones(4, F32), queue=queue)
    double(recorded)
    for i in range(3):  # exact-size buffers: the replay needs the recorded size
        x = cla.Array(queue.context, (4,), F32)
        x.set(np.full(4, i, F32), queue=queue)
        np.testing.assert_allclose(double(x).get(queue=queue), 2 * i)


def test_nested_steps_and_methods(k: K, queue: cl.CommandQueue) -> None:
    class Model:
        def __init__(self, s: float) -> None:
            self.s = s

        @capture_step
        def inner(self, x: Tensor) -> Tensor:
            out = Tensor.empty(x.shape, F32, queue)
            k.scale(queue, (x.size,), None, out.buffer, x.buffer, self.s)
            return out

    model = Model(3.0)

    @capture_step
    def outer(x: Tensor) -> Tensor:
        return model.inner(model.inner(x))  # runs normally while outer records

    for i in range(5):
        x = np.full(4, i, F32)
        np.testing.assert_allclose(outer(Tensor.from_numpy(x, queue)).to_numpy(), 9 * x)
        np.testing.assert_allclose(model.inner(Tensor.from_numpy(x, queue)).to_numpy(), 3 * x)
    assert outer.stats.replays == 3
    assert Model.inner.stats.replays >= 2  # type: ignore[attr-defined]


def test_a_step_inside_a_users_recording_runs_as_plain_code(k: K, queue: cl.CommandQueue) -> None:
    step = _scale_step(k, queue, warmup=0)
    x = Tensor.from_numpy(np.ones(4, F32), queue)
    cap = KernelCapture()
    with cap:
        out = step(x, 5.0)  # would record: the user's capture records it instead
    assert cap.num_launches == 1 and step.num_captures == 0
    x.write(np.full(4, 2, F32))
    cap.replay()
    np.testing.assert_allclose(out.to_numpy(), 10)


# -- telemetry ------------------------------------------------------------------------------


def _points(metric_points: Any, name: str, step: str) -> float:
    return sum(p.value for p in metric_points(name) if p.attributes.get("netcl.step.name") == step)


def test_spans_and_metrics(k: K, queue: cl.CommandQueue, spans: Any, metric_points: Any) -> None:
    step = _scale_step(k, queue, name="test-step-telemetry", max_captures=1)
    for n in (4, 4, 4, 4, 8, 8, 8):
        step(Tensor.from_numpy(np.ones(n, F32), queue), 2.0)
    captures = [s for s in spans.get_finished_spans() if s.name == "netcl.step.capture"]
    assert [s.attributes["netcl.step.reason"] for s in captures] == [
        "first capture",
        "shape of x changed (4,) -> (8,)",
    ]
    assert all(s.attributes["netcl.step.name"] == "test-step-telemetry" for s in captures)
    assert captures[1].attributes["netcl.step.evicted"] == 1
    assert captures[1].attributes["netcl.capture.launches"] == 1
    # the KernelCapture's own recording span is a child of the step's
    records = [s for s in spans.get_finished_spans() if s.name == "netcl.capture.record"]
    assert {s.parent.span_id for s in records} == {s.context.span_id for s in captures}
    assert _points(metric_points, "netcl.step.replays", "test-step-telemetry") == 3
    assert _points(metric_points, "netcl.step.captures", "test-step-telemetry") == 2
    assert _points(metric_points, "netcl.step.runs", "test-step-telemetry") == 2
    assert _points(metric_points, "netcl.step.evictions", "test-step-telemetry") == 1
    assert _points(metric_points, "netcl.step.captures_kept", "test-step-telemetry") == 1


def test_a_checked_replay_counts_as_a_replay_and_a_failed_ones_span_names_the_output(
    k: K, queue: cl.CommandQueue, spans: Any, metric_points: Any
) -> None:
    """Check mode: each checked first replay counts once in ``netcl.step.replays``, like a plain
    replay, and the ``netcl.step.check`` span of a failed check carries the differing output's
    index and its max abs diff (a passing check's carries neither)."""
    factor = [1.0]
    two = _two_outputs(k, queue, factor, name="test-step-checked")
    x4 = Tensor.from_numpy(np.ones(4, F32), queue)
    for _ in range(3):  # recorded, the checked first replay (passes), a plain replay
        two(x4)
    assert _points(metric_points, "netcl.step.replays", "test-step-checked") == 2
    x8 = Tensor.from_numpy(np.ones(8, F32), queue)
    two(x8)  # recorded with factor 1
    factor[0] = 1.5
    with pytest.raises(StepCheckError):
        two(x8)
    assert _points(metric_points, "netcl.step.replays", "test-step-checked") == 3
    assert two.stats.replays == 3
    checks = [s for s in spans.get_finished_spans() if s.name == "netcl.step.check"]
    assert [s.attributes["netcl.step.name"] for s in checks] == ["test-step-checked"] * 2
    assert "netcl.step.output" not in checks[0].attributes
    assert "netcl.step.max_abs_diff" not in checks[0].attributes
    assert checks[1].attributes["netcl.step.output"] == 1
    assert checks[1].attributes["netcl.step.max_abs_diff"] == pytest.approx(0.5)


def test_captures_kept_drops_when_a_step_is_garbage_collected(
    k: K, queue: cl.CommandQueue, metric_points: Any
) -> None:
    """The ``netcl.step.captures_kept`` gauge counts a step's captures while the step lives and
    gives them back when the step is collected."""
    step = _scale_step(k, queue, name="test-step-collected")
    for n in (4, 4, 4, 8, 8, 8):
        step(Tensor.from_numpy(np.ones(n, F32), queue), 2.0)
    assert _points(metric_points, "netcl.step.captures_kept", "test-step-collected") == 2
    del step
    gc.collect()
    assert _points(metric_points, "netcl.step.captures_kept", "test-step-collected") == 0


def test_results_are_correct_under_a_failing_sdk(
    k: K, queue: cl.CommandQueue, hostile_sdk: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    step = _scale_step(k, queue, check=True, max_captures=1)
    for n in (4, 4, 4, 4, 8, 8, 8):
        x = np.arange(n, dtype=F32)
        np.testing.assert_allclose(step(Tensor.from_numpy(x, queue), 2.0).to_numpy(), 2 * x)
        hostile_sdk()
    # per shape: a warm-up run, a recording, then replays (the first one checked by a run)
    assert step.stats == (4, 2, 3, 1)  # runs, captures, replays, evictions


def test_out_of_order_queue(k: K, ctx: cl.Context) -> None:
    """On an out-of-order queue the replay keeps the recorded dependencies, and the copy of an
    output passed back in is complete before the replay reads it."""
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    queue = cl.CommandQueue(ctx, properties=props)
    n = 64

    @capture_step
    def smooth_twice(x: Tensor) -> Tensor:
        mid, out = Tensor.empty(x.shape, F32, queue), Tensor.empty(x.shape, F32, queue)
        first = k.neighbours(queue, (n,), None, mid.buffer, x.buffer, n)
        k.neighbours(queue, (n,), None, out.buffer, mid.buffer, n, wait_for=[first])
        return out

    host = np.random.default_rng(6).standard_normal(n).astype(F32)
    h = Tensor.from_numpy(host, queue)
    for i in range(6):
        h = smooth_twice(h)
        queue.finish()  # Tensors carry no events
        for _ in range(2):
            host = host + 0.5 * np.roll(host, -1)
        np.testing.assert_allclose(h.to_numpy(), host, rtol=1e-5, err_msg=f"call {i}")


def test_the_first_eviction_of_each_step_logs_one_warning(
    k: K, queue: cl.CommandQueue, caplog: pytest.LogCaptureFixture
) -> None:
    def evicted() -> list[Any]:
        return [r for r in caplog.records if getattr(r, "event", None) == "captured_step_evicted"]

    with caplog.at_level(logging.WARNING, logger="netcl.runtime.capture"):
        for _ in range(2):  # two steps of one name: each warns once, at its first eviction
            step = _scale_step(k, queue, max_captures=1, warmup=0, name="test-step-evicted")
            for n in (4, 8, 16):
                step(Tensor.from_numpy(np.ones(n, F32), queue), 2.0)
            assert step.stats.evictions == 2
    fields = [
        (r.step, r.max_captures, r.reason, r.detail)  # type: ignore[attr-defined]
        for r in evicted()
    ]
    # each names the key whose recording evicted a capture, and tells the likely cause
    assert (
        fields
        == [
            (
                "test-step-evicted",
                1,
                "shape of x changed (4,) -> (8,)",
                "more distinct guard keys than max_captures; a non-Tensor argument that "
                "changes on every call (a step counter) makes every call a new key",
            )
        ]
        * 2
    )


def test_thread_records_is_true_while_this_thread_records(queue: cl.CommandQueue) -> None:
    import threading

    from netcl.runtime.capture import _intercept, capture_disabled

    assert not _intercept.thread_records()
    seen: list[bool] = []
    cap = KernelCapture()
    with cap:
        seen.append(_intercept.thread_records())
        with capture_disabled():  # the recording goes on after the block
            seen.append(_intercept.thread_records())
        other = threading.Thread(target=lambda: seen.append(_intercept.thread_records()))
        other.start()
        other.join()
    assert seen == [True, True, False] and not _intercept.thread_records()


def test_a_step_that_would_replay_inside_a_users_recording_runs_as_plain_code(
    k: K, queue: cl.CommandQueue
) -> None:
    """The caller's capture records the step's launches (a replay would not be recorded)."""
    step = _scale_step(k, queue, warmup=0)
    x = Tensor.from_numpy(np.ones(4, F32), queue)
    step(x, 5.0)  # recorded: the next call with this key would replay
    cap = KernelCapture()
    with cap:
        out = step(x, 5.0)
    assert cap.num_launches == 1 and step.stats == StepStats(1, 1, 0, 0)
    x.write(np.full(4, 3, F32))
    cap.replay()
    np.testing.assert_allclose(out.to_numpy(), 15)
