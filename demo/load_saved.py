"""Load a saved step in a process of its own and call it: ``python load_saved.py FILE IN OUT``.

``IN`` is an ``.npz`` of the calls' inputs (``c<call>_<argument>``, and ``kind``: ``tensor`` or
``array``, what to hand the step); ``OUT`` gets every call's outputs (``c<call>_<output>``) and
``first_result_s``, the seconds from the end of the imports to the first call's result on the
host. Nothing of the step's code is imported here: only netcl and the file.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pyopencl.array as cla

from netcl.core import device
from netcl.core.tensor import Tensor
from netcl.runtime.capture import load_step

t0 = time.perf_counter()  # the imports are done
path, inputs, out = sys.argv[1:4]
queue = device.default_queue()
Tensor.empty((1,), np.float32, queue).to_numpy()
ready = time.perf_counter() - t0  # the device's own start, before the file
step = load_step(path, queue)
data = np.load(inputs)
kind = str(data["kind"])
calls = sorted({int(k.split("_")[0][1:]) for k in data.files if k.startswith("c")})
found: dict[str, np.ndarray] = {}  # type: ignore[type-arg]
for c in calls:
    args = [
        data[k]
        for k in sorted(
            (k for k in data.files if k.startswith(f"c{c}_")), key=lambda k: int(k.split("_")[1])
        )
    ]
    on_device = [
        Tensor.from_numpy(a, queue) if kind == "tensor" else cla.to_device(queue, a) for a in args
    ]
    result = step(*on_device)
    items = result if isinstance(result, (tuple, list)) else (result,)
    for i, item in enumerate(items):
        found[f"c{c}_{i}"] = item.to_numpy() if isinstance(item, Tensor) else item.get()
    if c == 0:
        found["first_result_s"] = np.float64(time.perf_counter() - t0)
        found["device_ready_s"] = np.float64(ready)
np.savez(out, **found)
