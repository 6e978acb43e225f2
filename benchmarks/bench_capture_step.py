"""capture_step against the hand-written replay of the same step.

The step: a two-layer MLP (matmul, bias + ReLU, twice: 4 launches) on Tensors, the same as
pyopencl.array operations (6 launches), and an eight-layer one on Tensors (16 launches: the
size of bench_capture's MLP step). The hand-written contender records the step once with a
KernelCapture and, per call, builds ``{recorded_input.int_ptr: new_input.buffer}`` and calls
``replay_with_new_buffers``, returning the recorded output: what a user writes without
``capture_step``. Both are called with a different input each time (two inputs alternating).
Target: decorated / hand-written ≤ 1.05.

Host time = the calls themselves, with the queue held behind a user event (so the device's
work does not compete with the timed thread) and drained between rounds. Ratios are measured
in the same run, the contenders alternating round by round (``interleaved_times``), and stored
in ``extra_info``: ``*_min`` the fastest rounds, the others medians; ``*_e2e`` include a
``finish``. pytest-benchmark's own stats time the decorated step, with the hand-written one
timed right before each round (``paired_floor_s``).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from pyopencl.elementwise import ElementwiseKernel

sys.path.insert(0, str(Path(__file__).parent))
from capture_workloads import MLP_SRC, interleaved_times
from paired import HeldQueues, paired_floor, record_floor

from netcl.core.tensor import Tensor
from netcl.runtime.capture import KernelCapture, capture_step

BATCH, WIDTH = 16, 64


class _Workload:
    """A step function, its decorated form and its hand-written replay, and two inputs."""

    def __init__(self, queue: cl.CommandQueue, kind: str, layers: int) -> None:
        self.queue = queue
        self.kind = kind
        self.tensors = kind == "tensor"
        rng = np.random.default_rng(0)
        self.w_host = [
            (rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32) for _ in range(layers)
        ]
        self.b_host = [rng.standard_normal(WIDTH).astype(np.float32) for _ in range(layers)]
        # inputs 0 and 1 alternate in the timed calls; 2 and 3 are the recorded ones, so that
        # every timed call substitutes its input in both contenders
        self.x_host = [rng.standard_normal((BATCH, WIDTH)).astype(np.float32) for _ in range(4)]
        fn = self._tensor_step() if kind == "tensor" else self._array_step()
        self.decorated = capture_step(fn)
        self.inputs = [self._input(x) for x in self.x_host]
        for x in self.inputs[3], self.inputs[3]:  # warm-up call, recording call
            self.decorated(x)
        recorded = self.inputs[2]
        self.cap = KernelCapture()
        with self.cap:
            self.out = fn(recorded)
        self.recorded_ptr = self._buffer(recorded).int_ptr
        self.recorded = recorded
        self.calls = 0

    def _input(self, host: np.ndarray[Any, Any]) -> Any:
        if self.kind == "tensor":
            return Tensor.from_numpy(host, self.queue)
        return cla.to_device(self.queue, host)

    def _buffer(self, x: Any) -> Any:
        return x.buffer if self.kind == "tensor" else x.base_data

    def _tensor_step(self) -> Callable[[Tensor], Tensor]:
        queue = self.queue
        prg = cl.Program(queue.context, MLP_SRC).build()
        matmul, bias_relu = cl.Kernel(prg, "matmul"), cl.Kernel(prg, "bias_relu")
        matmul.set_scalar_arg_dtypes([None, None, None, np.int32, np.int32])
        bias_relu.set_scalar_arg_dtypes([None, None, None, np.int32])
        weights = [
            (Tensor.from_numpy(w, queue), Tensor.from_numpy(b, queue))
            for w, b in zip(self.w_host, self.b_host, strict=True)
        ]

        def step(x: Tensor) -> Tensor:
            h = x
            for w, b in weights:
                z = Tensor.empty((BATCH, WIDTH), np.float32, queue)
                matmul(queue, (z.size,), None, z.buffer, h.buffer, w.buffer, WIDTH, WIDTH)
                h = Tensor.empty((BATCH, WIDTH), np.float32, queue)
                bias_relu(queue, (h.size,), None, h.buffer, z.buffer, b.buffer, WIDTH)
            return h

        return step

    def _array_step(self) -> Callable[[cla.Array], cla.Array]:
        queue = self.queue
        matmul = ElementwiseKernel(
            queue.context,
            "float *out, const float *x, const float *w, int k, int m",
            "int row = i / m, col = i % m; float acc = 0.0f;"
            "for (int j = 0; j < k; ++j) acc += x[row * k + j] * w[j * m + col];"
            "out[i] = acc",
            "bench_step_matmul",
        )
        weights = [
            (cla.to_device(queue, w), cla.to_device(queue, np.tile(b, (BATCH, 1))))
            for w, b in zip(self.w_host, self.b_host, strict=True)
        ]
        zeros = cla.zeros(queue, (BATCH, WIDTH), np.float32)

        def step(x: cla.Array) -> cla.Array:
            h = x
            for w, b in weights:
                z = cla.empty_like(zeros)
                matmul(z, h, w, np.int32(WIDTH), np.int32(WIDTH))
                h = cla.maximum(z + b, zeros)
            return h

        return step

    def hand(self) -> Any:
        """The hand-written replay: rebind the input, replay, return the recorded output."""
        x = self.inputs[self.calls & 1]
        self.calls += 1
        if self.tensors:
            self.cap.replay_with_new_buffers({self.recorded_ptr: x.buffer})
        else:
            self.cap.replay_with_new_buffers({self.recorded_ptr: x.base_data})
        return self.out

    def step(self) -> Any:
        x = self.inputs[self.calls & 1]
        self.calls += 1
        return self.decorated(x)

    def check(self) -> None:
        for fn in (self.hand, self.step):
            for _ in range(2):
                i = self.calls & 1
                out = fn()
                got = out.to_numpy() if self.kind == "tensor" else out.get()
                h = self.x_host[i]
                for w, b in zip(self.w_host, self.b_host, strict=True):
                    h = np.maximum(h @ w + b, 0)
                np.testing.assert_allclose(got, h, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=["tensor-2", "pyopencl_array-2", "tensor-8"])
def workload(request: pytest.FixtureRequest, queue: cl.CommandQueue) -> _Workload:
    kind, layers = request.param.split("-")
    return _Workload(queue, kind, int(layers))


def _rounds(benchmark: Any, full: int) -> int:
    return 3 if benchmark.disabled else full


@pytest.mark.benchmark(group="capture-step")
def test_step_decorated_vs_hand(benchmark: Any, workload: _Workload) -> None:
    """``capture_step`` against the hand-written ``replay_with_new_buffers``; target ≤ 1.05."""
    workload.check()
    held = HeldQueues(workload.queue)
    fns = {"hand": workload.hand, "decorated": workload.step}
    host = interleaved_times(fns, _rounds(benchmark, 2000), setup=held)
    held.release()

    def finished(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            fn()
            workload.queue.finish()

        return run

    e2e = interleaved_times(
        {k: finished(f) for k, f in fns.items()},
        _rounds(benchmark, 500),
        setup=workload.queue.finish,
    )
    med = {k: statistics.median(v) for k, v in host.items()}
    benchmark.extra_info.update(
        kind=workload.kind,
        layers=len(workload.w_host),
        hand_us=med["hand"] * 1e6,
        decorated_us=med["decorated"] * 1e6,
        decorated_over_hand=med["decorated"] / med["hand"],
        decorated_over_hand_min=min(host["decorated"]) / min(host["hand"]),
        decorated_over_hand_e2e=statistics.median(e2e["decorated"])
        / statistics.median(e2e["hand"]),
        target_decorated_over_hand=1.05,
    )
    setup, floor = paired_floor(workload.hand, between=held)
    benchmark.pedantic(workload.step, setup=setup, rounds=_rounds(benchmark, 1000), warmup_rounds=5)
    record_floor(benchmark, floor)
    held.release()
    workload.check()
