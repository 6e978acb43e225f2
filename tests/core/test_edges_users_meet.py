"""Edges a user meets: a table exactly as wide as the terminal (and one column over), a
Fortran-ordered array written into a tensor, a pool whose free-held hook's owner is gone, a
checked pool on an out-of-order queue (and every block checked at once, naming who overran), and
an unsupported pyopencl named by its version text."""

from __future__ import annotations

import gc

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool
from netcl.core.table import table
from netcl.core.tensor import Tensor

ROW = ["aaaa", "b" * 20, "cccc"]  # 4 + 2 + 20 + 2 + 4 = 32 columns


def test_a_table_as_wide_as_the_terminal_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "32")
    assert table([ROW]) == ["aaaa  " + "b" * 20 + "  cccc"]


def test_a_table_one_column_too_wide_loses_it_in_its_widest_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "31")
    assert table([ROW]) == ["aaaa  " + "b" * 18 + "…  cccc"]


def test_a_fortran_ordered_array_is_written_by_its_values(queue: cl.CommandQueue) -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor.empty((3, 4), np.float32, queue)
    t.write(np.asfortranarray(values))
    np.testing.assert_array_equal(t.to_numpy(), values)


class _Views:
    def __init__(self) -> None:
        self.calls = 0

    def forget(self) -> None:
        self.calls += 1


def test_free_held_outlives_the_owner_of_a_hook(queue: cl.CommandQueue) -> None:
    pool = BufferPool(queue)
    views, gone = _Views(), _Views()
    pool.on_free_held(views.forget)
    pool.on_free_held(gone.forget)
    del gone
    gc.collect()
    for _ in range(2):  # the dead hook is dropped once, and never called
        pool.free_held()
    assert views.calls == 2


def test_a_checked_pool_on_an_out_of_order_queue_guards_its_blocks(ctx: cl.Context) -> None:
    ooo = cl.CommandQueue(ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    pool = BufferPool(ooo, check_memory=True)
    t = pool.allocate((256,), np.float32)
    t.write(np.ones(256, np.float32))
    np.testing.assert_array_equal(t.to_numpy(), np.ones(256, np.float32))
    pool.release(t)  # guards intact: no error
    assert pool.stats.bytes_in_use == 0


def test_an_unsupported_pyopencl_is_named_by_its_own_version_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from netcl.core import contract

    monkeypatch.setattr(cl, "VERSION", (1999, 1))
    monkeypatch.setattr(cl, "VERSION_TEXT", "1999.1rc2")
    with pytest.raises(ImportError, match=r"^netcl: pyopencl 1999\.1rc2 is outside the supported"):
        contract._check_version()


def test_checking_every_block_names_who_overran_which_tensor(queue: cl.CommandQueue) -> None:
    from netcl.core import device
    from netcl.core.memory import MemoryCheckError

    src = "__kernel void inc(__global const float *a, __global float *o) "
    src += "{ int i = get_global_id(0); o[i] = a[i] + 1; }"
    inc = cl.Kernel(cl.Program(queue.context, src).build(), "inc")
    pool = BufferPool(queue, check_memory=True)
    x, y = pool.allocate((2048,), np.float32), pool.allocate((1000,), np.float32)
    inc(queue, (1500,), None, x.buffer, y.buffer)  # 500 floats past y's end: in its guard
    checker = device.checker()
    assert checker is not None
    with pytest.raises(
        MemoryCheckError,
        match=r"^the step 'train' wrote 2000 bytes past the end "
        r"of Tensor\(shape=\(1000,\), dtype=float32, nbytes=4000\)",
    ):
        checker.check_all("the step 'train'")
    for t in (y, x):  # reported once: the release that follows passes
        pool.release(t)
    assert pool.stats.bytes_in_use == 0
