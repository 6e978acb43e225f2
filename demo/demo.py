"""The netcl main job: device info and a Tensor/BufferPool round trip (grows with the packages)."""

from __future__ import annotations

import numpy as np

from netcl.core import cli, device
from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor


def main() -> int:
    cli.main(["info"])
    queue = device.default_queue()
    pool = BufferPool(queue)
    host = np.arange(1 << 16, dtype=np.float32)
    t = pool.allocate(host.shape, host.dtype)
    t.write(host)
    doubled = (t.as_array() * 2).get()
    assert np.array_equal(doubled, host * 2), "device result differs from numpy"
    pool.release(t)
    again = pool.allocate(host.shape, host.dtype)
    print(f"round trip ok: {Tensor.__name__}{again.shape} {again.dtype}, pool {pool.stats}")
    pool.release(again)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
