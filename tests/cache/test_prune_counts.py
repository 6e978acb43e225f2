"""``prune`` checks every entry against its own name and returns exactly its three counts (found
by the mutation run: a valid entry copied under another key's name, and entries after a valid
one, were never tried)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.runtime.cache import ProgramCache
from netcl.runtime.cache._store import SUFFIX


def test_a_valid_entry_under_another_keys_name_is_damaged_wherever_it_sorts(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "prune-1"), device)
    c.get_program(ctx, add_src(0.0, "prune-2"), device)
    first, second = c.entries()
    moved = cache_dir / "programs" / f"{'c' * 64}{SUFFIX}"
    shutil.copyfile(first.path, moved)  # intact, but for another key: must never be served
    for age, path in enumerate((first.path, second.path, moved)):  # the copy sorts last
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    assert c.prune(1 << 30) == {"damaged": 1, "temp": 0, "evicted": 0}
    assert not moved.exists()
    assert sorted(e.key for e in c.entries()) == sorted((first.key, second.key))


def test_prune_of_a_folder_the_cache_refuses_removes_nothing(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    """A folder others can write is never used: prune touches nothing there and says so with
    three zero counts."""
    folder = tmp_path / "shared"
    (folder / "programs").mkdir(parents=True)
    left_over = folder / "programs" / f".{'e' * 64}.abc123.tmp"  # a writer's, an hour old
    left_over.write_bytes(b"x")
    os.utime(left_over, (1, 1))
    os.chmod(folder, 0o777)
    assert ProgramCache(folder).prune(0) == {"damaged": 0, "temp": 0, "evicted": 0}
    assert left_over.exists()
    assert any("is not used" in str(w.message) for w in recwarn)
