"""Saved steps across devices, by hand: save ``make_v1``'s step on one device, load it on
another, and compare with the step run normally on the loading device.

    PYOPENCL_NO_CACHE=1 python cross_device.py save FILE   # on the saving device
    python cross_device.py check FILE                       # on the loading device

``PYOPENCL_CTX`` picks the device as usual (``PYOPENCL_NO_CACHE=1`` when saving keeps every
program's source, which another device rebuilds from). ``check`` calls the loaded step with 5
new inputs: bit-identical to the normal run on the device that saved the file, within
``rtol = atol = 1e-5`` on another (its programs rebuilt from the saved source). It prints one
JSON line (devices, programs rebuilt, the largest difference, load seconds) and exits 1 on a
mismatch. ``pocl_step.ncl`` beside this file was saved on PoCL with ``save``.
"""

from __future__ import annotations

import json
import sys
import time

import make_v1  # type: ignore[import-not-found]  # beside this file
import numpy as np

from netcl.core import device
from netcl.core.device import device_identity
from netcl.runtime.capture import _saved, capture_step, load_step

CALLS = 5


def save(path: str) -> dict[str, object]:
    queue = device.default_queue()
    step = capture_step(make_v1.make_step(queue))
    x = make_v1.make_input(queue)
    step(x), step(x)  # the warm-up, then the call that records
    return {"saved": path, "device": queue.device.name.strip(), "bytes": step.save(path)}


def check(path: str) -> dict[str, object]:
    queue = device.default_queue()
    saved_on = _saved.inspect(path)["device_identity"]
    t0 = time.perf_counter()
    loaded = load_step(path, queue)
    load_s = time.perf_counter() - t0
    normal = make_v1.make_step(queue)
    same = saved_on == device_identity(queue.device)
    worst, ok = 0.0, True
    for seed in range(CALLS):
        want = [a.get() for a in normal(make_v1.make_input(queue, 100 + seed))]
        got = [a.get() for a in loaded(make_v1.make_input(queue, 100 + seed))]
        for w, g in zip(want, got, strict=True):
            worst = max(worst, float(np.max(np.abs(w.astype(np.float64) - g))))
            ok &= w.tobytes() == g.tobytes() if same else bool(np.allclose(g, w, 1e-5, 1e-5))
    return {
        "file": path,
        "saved_on": saved_on,
        "loaded_on": device_identity(queue.device),
        "same_device": same,
        "calls": CALLS,
        "max_abs_diff": worst,
        "load_s": load_s,
        "match": ok,
    }


if __name__ == "__main__":
    action, file = sys.argv[1:3]
    found = save(file) if action == "save" else check(file)
    print(json.dumps(found))
    sys.exit(0 if found.get("match", True) else 1)
