"""The processes bench_saved.py times, one mode each (``python saved_workload.py MODE ...``);
each prints one JSON line of what it measured.

* ``normal FILE``: a fresh process starting an 8-layer MLP step with a few pyopencl.array
  reductions the usual way (programs compiled, a warm-up run, the recording run), then saving it
  to FILE; seconds from the end of the imports to the device being ready, to the first result
  and to the first replay's.
* ``weights FILE BYTES``: a step reading a BYTES-byte weight buffer, saved to FILE; peak resident
  memory above the process's own before saving.
* ``load FILE``: load_step, one call checked; seconds, peak resident memory above the
  process's own before loading, and the bytes of device buffers it holds.
* ``by-hand FILE``: the weights' bytes read from FILE into host memory and copied to a device
  buffer, the plain way; seconds.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from capture_workloads import MLP_SRC

from netcl.core import device
from netcl.core.tensor import Tensor
from netcl.runtime.cache import cacher
from netcl.runtime.capture import _saved, capture_step, load_step

STRIDED_SRC = """
__kernel void strided(__global float *y, __global const float *w, __global const float *x,
                      const long stride) {
    int r = get_global_id(0);
    y[r] = w[r * stride] * x[r];
}
"""
BATCH, WIDTH, LAYERS = 16, 256, 8
ROWS = 4096  # weights mode: rows of the strided read


def _manifest(path: str) -> Any:
    file = _saved._File(path)  # the manifest, checked as a load checks it
    file.close()
    return file.manifest


def _rss(field: str) -> int:
    """VmRSS (resident now) or VmHWM (the peak since the last _reset_peak), in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def _reset_peak() -> int:
    """Start measuring the peak afresh (Linux: clear_refs 5); the resident bytes now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss("VmRSS:")


def _x(queue: cl.CommandQueue, n: int, seed: int = 0) -> Tensor:
    return Tensor.from_numpy(
        np.random.default_rng(seed).standard_normal(n).astype(np.float32).reshape(-1), queue
    )


def normal(path: str, t0: float) -> dict[str, float]:
    queue = device.default_queue()
    Tensor.empty((1,), np.float32, queue).to_numpy()
    ready = time.perf_counter() - t0  # the device's own start, before any program
    prg = cacher.get_program(queue.context, MLP_SRC, queue.device)
    matmul, bias_relu = cl.Kernel(prg, "matmul"), cl.Kernel(prg, "bias_relu")
    rng = np.random.default_rng(1)
    ws = [
        Tensor.from_numpy((rng.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32), queue)
        for _ in range(LAYERS)
    ]
    bs = [
        Tensor.from_numpy(rng.standard_normal(WIDTH).astype(np.float32), queue)
        for _ in range(LAYERS)
    ]

    @capture_step
    def step(x: Tensor) -> Tensor:
        h = x
        for w, b in zip(ws, bs, strict=True):
            z = Tensor.empty((BATCH, WIDTH), np.float32, queue)
            matmul(
                queue,
                (z.size,),
                None,
                z.buffer,
                h.buffer,
                w.buffer,
                np.int32(WIDTH),
                np.int32(WIDTH),
            )
            h = Tensor.empty((BATCH, WIDTH), np.float32, queue)
            bias_relu(queue, (h.size,), None, h.buffer, z.buffer, b.buffer, np.int32(WIDTH))
        # pyopencl.array's own kernels, one program each, as framework code has them
        a = cla.Array(queue, (BATCH, WIDTH), np.float32, data=h.buffer)
        s = cla.sum(a * a) + cla.max(a) + cla.min(a)
        out = Tensor.empty((1,), np.float32, queue)
        cla.Array(queue, (1,), np.float32, data=out.buffer)[:] = s.reshape(1)
        return out

    x = _x(queue, BATCH * WIDTH)
    x = Tensor(x.buffer, (BATCH, WIDTH), np.float32, queue)
    step(x).to_numpy()  # the warm-up: a normal run's result
    first = time.perf_counter() - t0
    step(x)  # recorded
    step(x).to_numpy()  # the first replay
    replay = time.perf_counter() - t0
    step.save(path)
    return {"device_ready_s": ready, "first_result_s": first, "first_replay_s": replay}


def weights(path: str, nbytes: int) -> dict[str, float]:
    queue = device.default_queue()
    prg = cl.Program(queue.context, STRIDED_SRC).build()
    kernel = cl.Kernel(prg, "strided")
    w = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, nbytes)
    for offset in range(0, nbytes, 16 << 20):  # w[i] = (i >> 12) % 251, 16 MiB at a time
        index = np.arange(offset // 4, min(offset + (16 << 20), nbytes) // 4)
        cl.enqueue_copy(queue, w, ((index >> 12) % 251).astype(np.float32), dst_offset=offset)
    y = Tensor.empty((ROWS,), np.float32, queue)
    stride = nbytes // 4 // ROWS

    @capture_step
    def step(x: Tensor) -> Tensor:
        kernel(queue, (ROWS,), None, y.buffer, w, x.buffer, np.int64(stride))
        return y

    step(_x(queue, ROWS)), step(_x(queue, ROWS))
    queue.finish()
    before = _reset_peak()
    t0 = time.perf_counter()
    step.save(path)
    return {
        "save_s": time.perf_counter() - t0,
        "peak_above_bytes": _rss("VmHWM:") - before,
        "stride": stride,
    }


def load(path: str) -> dict[str, float]:
    queue = device.default_queue()
    Tensor.empty((1,), np.float32, queue).to_numpy()  # the driver's own start-up is baseline
    before = _reset_peak()
    t0 = time.perf_counter()
    step = load_step(path, queue)
    seconds = time.perf_counter() - t0
    peak = _rss("VmHWM:") - before
    held = sum(b.size for b in _manifest(path).buffers if b.parent is None)
    stride = (held - ROWS * 8) // 4 // ROWS  # the weights: all but x and y
    x = _x(queue, ROWS, 5)
    got = step(x).to_numpy()
    want = (((np.arange(ROWS) * stride) >> 12) % 251).astype(np.float32) * x.to_numpy()
    assert np.array_equal(got, want), "the loaded step's result is wrong"
    cpu = bool(queue.device.type & cl.device_type.CPU)
    return {"load_s": seconds, "peak_above_bytes": peak, "device_bytes": held, "cpu": cpu}


def by_hand(path: str) -> dict[str, float]:
    queue = device.default_queue()
    Tensor.empty((1,), np.float32, queue).to_numpy()
    start, size, _ = max(_manifest(path).sections, key=lambda s: s.size)  # the weights
    t0 = time.perf_counter()
    host = np.empty(size, np.uint8)
    with open(path, "rb") as f:
        f.seek(start)
        f.readinto(host.data)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, size)
    cl.enqueue_copy(queue, buf, host)
    queue.finish()
    return {"by_hand_s": time.perf_counter() - t0, "bytes": size}


if __name__ == "__main__":
    t_imports = time.perf_counter()
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "normal":
        found = normal(args[0], t_imports)
    elif mode == "weights":
        found = weights(args[0], int(args[1]))
    elif mode == "load":
        found = load(args[0])
    else:
        found = by_hand(args[0])
    print(json.dumps(found))
