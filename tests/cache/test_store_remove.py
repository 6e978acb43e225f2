"""``DiskStore.remove`` on what can sit at a path (found by the mutation run: a missing path and
a temporary folder left by a writer were never removed), on real files and folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from netcl.runtime.cache._store import SUFFIX, TOUCH_S, DiskStore


def test_remove_says_whether_something_was_there(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    store.programs.mkdir(parents=True)
    entry = store.programs / f"{'a' * 64}{SUFFIX}"
    entry.write_bytes(b"x")
    assert store.remove(entry) is True and not entry.exists()
    assert store.remove(entry) is False  # already gone: another process was first


def test_remove_deletes_folders_at_entry_and_temporary_names(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    store.programs.mkdir(parents=True)
    at_entry = store.programs / f"{'b' * 64}{SUFFIX}"
    left_over = store.programs / f".{'c' * 64}.123.abc.tmp"  # a folder already moved aside
    for folder in (at_entry, left_over):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "f").write_bytes(b"x")
        assert store.remove(folder) is True
    assert sorted(store.programs.iterdir()) == []


def test_probe_writes_where_the_entries_go(tmp_path: Path) -> None:
    # the folder itself is writable, its programs/ folder is not (a link to /proc here, where
    # nobody, root included, can make a folder): the probe must try programs/
    from netcl.runtime.cache._store import probe

    (tmp_path / "programs").symlink_to("/proc")
    why = probe(tmp_path, write=True)
    assert why is not None and why.startswith(f"{tmp_path} is not writable (")
    assert probe(tmp_path, write=False) is None


def test_probe_of_a_missing_folder_tries_the_nearest_existing_one(tmp_path: Path) -> None:
    from netcl.runtime.cache._store import probe

    assert probe(tmp_path / "a" / "b", write=True) is None  # made in tmp_path
    # /sys exists and refuses new folders (root included): named, with the reason from /sys
    # itself (not permitted, or read-only in some containers), never "No such file" from below
    why = probe(Path("/sys/netcl-missing/sub"), write=True)
    assert why is not None and why.startswith("/sys/netcl-missing/sub cannot be created (")
    assert "No such file" not in why


def test_refusal_names_the_untrusted_subfolder(tmp_path: Path) -> None:
    # programs/ missing is fine; a group-writable locks/ or programs/ is named, with its path
    from netcl.runtime.cache._store import refusal

    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    assert refusal(root) is None
    (root / "locks").mkdir(mode=0o700)
    (root / "locks").chmod(0o770)
    why = refusal(root)
    assert why is not None and why.startswith(f"{root / 'locks'} is not trusted (")
    (root / "locks").chmod(0o700)
    (root / "programs").mkdir(mode=0o700)
    (root / "programs").chmod(0o770)
    why = refusal(root)
    assert why is not None and why.startswith(f"{root / 'programs'} is not trusted (")


def test_a_folder_that_cannot_be_removed_whole_stays_under_a_temporary_name_of_its_own(
    tmp_path: Path,
) -> None:
    """A folder at an entry's name (or at the totals' name) holding a file the file system
    will not let go (immutable: even root cannot unlink it): the name is freed at once, and
    what is left keeps the entry's key (or "stats") and this process's pid in its temporary
    name, so `netcl cache list` shows it as a running writer's and prune removes it later."""
    chattr = shutil.which("chattr")
    store = DiskStore(tmp_path)
    store.programs.mkdir(parents=True)
    key = "0123456789abcdef" * 4
    at_entry, at_totals = store.programs / f"{key}{SUFFIX}", store.stats_file
    stuck = [at_entry / "f", at_totals / "f"]
    for f in stuck:
        f.parent.mkdir()
        f.write_bytes(b"x")
        if chattr is None or subprocess.run([chattr, "+i", str(f)]).returncode != 0:
            pytest.skip("chattr +i is not available here (needs root and a file system with it)")
    try:
        assert store.remove(at_entry) is True and store.remove(at_totals) is True
        assert not at_entry.exists() and not at_totals.exists()
        (left,) = store.temp_files()
        assert left.path.name.startswith(f".{key}.{os.getpid()}.") and left.alive
        (aside,) = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
        assert aside.startswith(f".stats.{os.getpid()}.") and aside.endswith(".tmp")
    finally:
        for f in tmp_path.rglob("f"):
            subprocess.run([chattr, "-i", str(f)], check=True)


def test_touch_marks_an_old_entry_used_now_and_skips_a_recent_one(tmp_path: Path) -> None:
    """``touch`` moves an entry last used long ago to now (LRU order), leaves one used within
    ``TOUCH_S`` alone, and shrugs at an entry another process removed meanwhile."""
    store = DiskStore(tmp_path)
    store.programs.mkdir(parents=True)
    entry = store.programs / f"{'a' * 64}{SUFFIX}"
    entry.write_bytes(b"x")
    os.utime(entry, (1_000_000_000,) * 2)
    store.touch("a" * 64, 1_000_000_000.0)
    assert abs(entry.stat().st_mtime - time.time()) < 60
    recent = time.time() - TOUCH_S / 2
    os.utime(entry, (1_000_000_000,) * 2)
    store.touch("a" * 64, recent)  # the caller's mtime says: used just now
    assert entry.stat().st_mtime == 1_000_000_000
    store.touch("b" * 64, 1_000_000_000.0)  # gone meanwhile: no error
    assert not (store.programs / f"{'b' * 64}{SUFFIX}").exists()
