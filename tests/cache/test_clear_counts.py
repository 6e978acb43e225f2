"""``ProgramCache.clear`` counts entries and dead writers' temporary files together (found by
the mutation run: no test cleared both kinds at once)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl

from netcl.runtime.cache import ProgramCache


def test_clear_counts_entries_and_dead_temporary_files(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    c = ProgramCache(cache_dir)
    c.get_program(ctx, add_src(0.0, "clear-1"), device)
    c.get_program(ctx, add_src(0.0, "clear-2"), device)
    left_over = cache_dir / "programs" / f".{'e' * 64}.abc123.tmp"  # no pid, an hour old
    left_over.write_bytes(b"x")
    os.utime(left_over, (1, 1))
    assert c.clear() == 3
    assert c.entries() == [] and not left_over.exists()


def test_clear_without_arguments_forgets_the_programs_in_memory_too(
    ctx: cl.Context, device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    """``clear()`` empties both tiers: the next lookup of a program used before compiles it
    again; ``clear(memory=False)`` keeps it in memory (a memory hit)."""
    src = add_src(0.0, "clear-both")
    c = ProgramCache(cache_dir)
    c.get_program(ctx, src, device)
    assert c.clear(memory=False) == 1
    c.get_program(ctx, src, device)
    assert (c.stats.memory_hits, c.stats.compiles) == (1, 1)
    assert c.clear() == 0  # the disk was empty already
    c.get_program(ctx, src, device)
    assert (c.stats.memory_hits, c.stats.compiles) == (1, 2)
