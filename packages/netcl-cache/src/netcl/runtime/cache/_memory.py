"""The in-process tier: built programs keyed on the caller's own objects, bounded, holding
contexts weakly, with one builder per key."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pyopencl as cl

__all__ = ["MemoryEntry", "MemoryTier"]


class MemoryEntry:
    """One built program, its cache key, and ``used``: hit since the clock hand last passed."""

    __slots__ = ("key", "program", "used")

    def __init__(self, program: cl.Program, key: str) -> None:
        self.program = program
        self.key = key
        self.used = False


def _purge_dead(tier_ref: weakref.ref[MemoryTier]) -> None:
    # a context the tier keyed on was collected: its entries go (keys of dead weakrefs never
    # match a lookup again; this frees the programs)
    tier = tier_ref()
    if tier is not None:
        tier.drop_dead_contexts()


class MemoryTier:
    """``entries`` maps (weakref to ctx, device, source, options) to a :class:`MemoryEntry`:
    a hit hashes the caller's own objects (a str caches its hash), no sha256; a weakref without
    callback is shared (~0.1 µs per lookup). The bound evicts by CLOCK (second chance), an LRU
    approximation whose hit only sets ``used`` (move_to_end would rehash)."""

    __slots__ = ("__weakref__", "_dead_pending", "_lock", "_watched", "entries", "key_locks",
                 "max_programs")  # fmt: skip

    def __init__(self, max_programs: int) -> None:
        self.entries: OrderedDict[tuple[Any, ...], MemoryEntry] = OrderedDict()
        self.max_programs = max_programs
        self.key_locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._watched: weakref.WeakSet[cl.Context] = weakref.WeakSet()
        self._dead_pending = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def builder(self, mkey: tuple[Any, ...]) -> Iterator[None]:
        """Held while this thread builds ``mkey``: threads wanting the same program wait, then
        find it in ``entries``; the lock goes after the build, also after a failed one."""
        with self._lock:
            key_lock = self.key_locks.setdefault(mkey, threading.Lock())
        try:
            with key_lock:
                yield
        finally:
            with self._lock:
                if self.key_locks.get(mkey) is key_lock:  # not a newer one of a later caller
                    del self.key_locks[mkey]

    def remember(self, mkey: tuple[Any, ...], ctx: cl.Context, entry: MemoryEntry) -> None:
        with self._lock:
            if self._dead_pending:
                self._purge_locked()
            entries = self.entries
            entries[mkey] = entry
            while len(entries) > self.max_programs:
                k, old = entries.popitem(last=False)
                if old.used and k != mkey:  # a second chance
                    old.used = False
                    entries[k] = old
            if ctx not in self._watched:
                self._watched.add(ctx)
                weakref.finalize(ctx, _purge_dead, weakref.ref(self))

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()

    def drop_dead_contexts(self) -> None:
        # runs from the garbage collector, possibly in this very thread while it holds the lock
        # (inside remember): never block, leave the purge to the next insertion then
        if not self._lock.acquire(blocking=False):
            self._dead_pending = True
            return
        try:
            self._purge_locked()
        finally:
            self._lock.release()

    def _purge_locked(self) -> None:
        self._dead_pending = False
        for k in [k for k in self.entries if k[0]() is None]:
            del self.entries[k]
