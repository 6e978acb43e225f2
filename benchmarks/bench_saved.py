"""Saved steps: how soon a fresh process has its first result, loading a saved step against
starting the same step the usual way (compile, run, record), with empty program caches; and a
1 GiB weight file's load rate against reading the same bytes and copying them by hand, with the
resident memory each needs. Every figure is measured in fresh processes (saved_workload.py),
alternating in the same rounds; medians go into ``extra_info``.

    hatch run bench:python -m pytest benchmarks/bench_saved.py -q -s
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
LOADER = HERE.parent / "demo" / "load_saved.py"
ROUNDS = 3
# pyopencl's binary cache, NVIDIA's and PoCL's kernel caches
_NO_CACHES = {"PYOPENCL_NO_CACHE": "1", "CUDA_CACHE_DISABLE": "1", "POCL_KERNEL_CACHE": "0"}


def _child(tmp: Path, *args: str) -> dict[str, Any]:
    """One fresh process with empty program caches (netcl's, pyopencl's, the driver's)."""
    cache = tmp / f"cache-{len(list(tmp.glob('cache-*')))}"
    env = {**os.environ, "NETCL_CACHE_DIR": str(cache), **_NO_CACHES}
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_first_result_loaded_vs_normal_start(benchmark: Any, tmp_path: Path) -> None:
    path = tmp_path / "mlp.ncl"
    x = np.random.default_rng(3).standard_normal((16, 256)).astype(np.float32)
    np.savez(tmp_path / "in.npz", kind=np.array("tensor"), c0_0=x)
    normal: list[dict[str, Any]] = []
    loaded: list[float] = []
    loaded_ready: list[float] = []

    def one_round() -> None:  # the normal start saves the file the loaded start reads
        normal.append(_child(tmp_path, "saved_workload.py", "normal", str(path)))
        done = subprocess.run(
            [
                sys.executable,
                str(LOADER),
                str(path),
                str(tmp_path / "in.npz"),
                str(tmp_path / "out.npz"),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **_NO_CACHES},
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        found = np.load(tmp_path / "out.npz")
        loaded.append(float(found["first_result_s"]))
        loaded_ready.append(float(found["device_ready_s"]))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    first = statistics.median(n["first_result_s"] for n in normal)
    replay = statistics.median(n["first_replay_s"] for n in normal)
    load = statistics.median(loaded)
    # the same without the device's own start (context, queue, first transfer): what netcl,
    # the compiler and the loader decide
    ready = statistics.median(n["device_ready_s"] for n in normal)
    load_ready = statistics.median(loaded_ready)
    benchmark.extra_info.update(
        normal_first_result_s=first,
        normal_first_replay_s=replay,
        loaded_first_result_s=load,
        loaded_vs_normal_replay=load / replay,
        loaded_vs_normal_result=load / first,
        normal_device_ready_s=ready,
        loaded_device_ready_s=load_ready,
        after_device_ready=(load - load_ready) / (replay - ready),
    )
    print(
        f"\nfirst result: loaded {load * 1e3:.1f} ms; normal start {first * 1e3:.1f} ms "
        f"(first replay {replay * 1e3:.1f} ms): {load / replay:.3f}x of the normal start; "
        f"after the device's own start ({ready * 1e3:.0f} / {load_ready * 1e3:.0f} ms): "
        f"{(load - load_ready) / (replay - ready):.3f}x"
    )


def test_weights_load_rate_and_memory(benchmark: Any, tmp_path: Path) -> None:
    nbytes = int(os.environ.get("NETCL_BENCH_WEIGHT_BYTES", 1 << 30))
    path = tmp_path / "weights.ncl"
    saved = _child(tmp_path, "saved_workload.py", "weights", str(path), str(nbytes))
    loads: list[dict[str, Any]] = []
    by_hand: list[float] = []

    def one_round() -> None:
        by_hand.append(_child(tmp_path, "saved_workload.py", "by-hand", str(path))["by_hand_s"])
        loads.append(_child(tmp_path, "saved_workload.py", "load", str(path)))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    load = statistics.median(r["load_s"] for r in loads)
    hand = statistics.median(by_hand)
    # on a CPU device the device buffers are host memory too: what loading adds beyond them
    peak = max(r["peak_above_bytes"] - (r["device_bytes"] if r["cpu"] else 0) for r in loads)
    benchmark.extra_info.update(
        weight_bytes=nbytes,
        load_s=load,
        by_hand_s=hand,
        rate_vs_by_hand=hand / load,
        save_s=saved["save_s"],
        save_peak_above_mib=saved["peak_above_bytes"] / 2**20,
        load_peak_above_mib=peak / 2**20,
    )
    print(
        f"\n{nbytes / 2**30:.2f} GiB: load {load:.3f} s, by hand {hand:.3f} s (rate "
        f"{hand / load:.2f}x by hand's); peak memory above the process's own: saving "
        f"{saved['peak_above_bytes'] / 2**20:.0f} MiB, loading {peak / 2**20:.0f} MiB "
        "(device buffers excluded on a CPU device)"
    )
    assert hand / load >= 0.5 and peak <= 128 << 20


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-s"]))
