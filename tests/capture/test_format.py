"""The saved format as a contract: files of earlier versions keep loading (the kept version-1
file, made by ``data/make_v1.py``), bit-identical to the step run normally on the same device."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyopencl as cl

from netcl.core.device import device_identity
from netcl.runtime.capture import _saved, load_step

from .data import make_v1

V1 = Path(__file__).with_name("data") / "v1_step.ncl"


def _same_device(path: Path, queue: cl.CommandQueue) -> bool:
    file = _saved._File(path)
    file.close()
    return file.manifest.device.identity == device_identity(queue.device)


def test_the_kept_version_1_file_loads_and_replays(queue: cl.CommandQueue,
                                                    tmp_path: Path) -> None:  # fmt: skip
    path = tmp_path / "v1.ncl"
    shutil.copy(V1, path)  # a copy: loading never writes, but the kept file stays as committed
    loaded = load_step(path, queue)
    normal = make_v1.make_step(queue)
    exact = _same_device(path, queue)
    for seed in range(3):
        want = [a.get() for a in normal(make_v1.make_input(queue, seed))]
        got = [a.get() for a in loaded(make_v1.make_input(queue, seed))]
        for w, g in zip(want, got, strict=True):
            if exact:  # the file's own binaries: bit-identical
                assert w.tobytes() == g.tobytes(), f"call {seed}"
            else:  # rebuilt from the saved source by another compiler
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert loaded.stats.replays == 3
