"""Counters of a ProgramCache."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["CacheStats"]


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a cache's counters (this process, this instance).

    ``misses`` counts lookups that found no usable disk entry and compiled (``compiles`` also
    counts builds done while the disk tier is off); ``recoveries`` counts damaged entries that
    were compiled again and overwritten; ``corrupt`` counts damaged entries seen (a recovery
    done by another process meanwhile is a ``disk_hit``). ``remote_*`` count the remote tier:
    hits, values published, failed Redis calls, values refused (bad signature, truncated, other
    device), lookups that waited for another machine's compile and waits that timed out.
    """

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compiles: int = 0
    recoveries: int = 0
    corrupt: int = 0
    write_errors: int = 0
    lock_timeouts: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    remote_hits: int = 0
    remote_writes: int = 0
    remote_errors: int = 0
    remote_rejected: int = 0
    remote_waits: int = 0
    remote_lock_timeouts: int = 0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits + self.remote_hits

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
