"""``netcl cache stats | list | clear | prune``: the disk tier from the shell, like ccache -s."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from netcl.runtime.cache._entry import EntryError, read_meta
from netcl.runtime.cache._program_cache import ProgramCache, parse_size
from netcl.runtime.cache._remote import remote_info
from netcl.runtime.cache._store import DiskStore, check_trusted

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``cache`` subcommand to the ``netcl`` command."""
    p = sub.add_parser("cache", help="the OpenCL program cache: stats, list, clear, prune")
    p.add_argument("--dir", help="cache folder (default: NETCL_CACHE_DIR or ~/.cache/netcl)")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    s = csub.add_parser("stats", help="size, entries and hit/miss totals")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_stats)
    ls = csub.add_parser("list", help="one line per entry, least recently used first")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=_list)
    c = csub.add_parser("clear", help="delete every entry (and the hit/miss totals)")
    c.set_defaults(func=_clear)
    pr = csub.add_parser("prune", help="delete damaged entries and left-over temporary files, "
                         "then evict least recently used entries down to the size cap")
    pr.add_argument("--max-bytes", help="cap to prune to, e.g. 500M (default: the cache's cap)")
    pr.set_defaults(func=_prune)


def _cache(args: argparse.Namespace) -> ProgramCache:
    return ProgramCache(args.dir)


def _usable(cache: ProgramCache) -> DiskStore | None:
    root = cache.cache_dir
    if not root.is_dir():
        sys.stdout.write(f"cache dir: {root} (not created yet)\n")
        return None
    why = check_trusted(root)
    if why is not None:
        sys.stderr.write(f"netcl cache: {root} is not trusted ({why}); not touching it\n")
        return None
    return DiskStore(root)


def _stats(args: argparse.Namespace) -> int:
    cache = _cache(args)
    store = _usable(cache)
    files = store.entries() if store is not None else []
    total = sum(f.size for f in files)
    counters = store.load_counters() if store is not None else {}
    hits = sum(counters.get(k, 0) for k in ("memory_hits", "disk_hits", "remote_hits"))
    lookups = hits + counters.get("misses", 0)
    info: dict[str, Any] = {
        "cache_dir": str(cache.cache_dir),
        "enabled": cache.enabled,
        "entries": len(files),
        "bytes": total,
        "max_bytes": cache.max_bytes,
        "temp_files": len(store.temp_files()) if store is not None else 0,
        **counters,
        "remote": remote_info(),  # NETCL_CACHE_REMOTE, password redacted, PINGed now
    }
    if args.json:
        sys.stdout.write(json.dumps(info, indent=2, sort_keys=True) + "\n")
        return 0
    w = sys.stdout.write
    w(f"cache dir          {info['cache_dir']}{'' if cache.enabled else ' (disabled)'}\n")
    w(f"entries            {len(files)}\n")
    pct = 100.0 * total / cache.max_bytes if cache.max_bytes else 0.0
    w(f"cache size         {_human(total)} of {_human(cache.max_bytes)} ({pct:.1f} %)\n")
    w(f"hits               {hits}"
      + (f" ({100.0 * hits / lookups:.1f} % of {lookups} lookups)" if lookups else "") + "\n")
    for name in ("memory_hits", "disk_hits", "misses", "compiles", "recoveries", "corrupt",
                 "write_errors", "lock_timeouts", "evictions"):
        w(f"  {name:<17}{counters.get(name, 0)}\n")
    w(f"bytes read/written {_human(counters.get('bytes_read', 0))} / "
      f"{_human(counters.get('bytes_written', 0))}\n")
    _remote_lines(info["remote"], counters)
    return 0


def _remote_lines(remote: dict[str, Any], counters: dict[str, int]) -> None:
    w = sys.stdout.write
    if not remote["configured"]:
        w("remote             not configured (NETCL_CACHE_REMOTE)\n")
        return
    if not remote["usable"]:
        state = "not used (see the cache_remote_* warning)"
    elif remote["reachable"]:
        state = "reachable" + ("" if remote["signed"] else ", UNSIGNED")
    else:
        state = f"unreachable ({remote['error']})"
    w(f"remote             {remote['url']}  {state}\n")
    for name in ("remote_hits", "remote_writes", "remote_errors", "remote_rejected",
                 "remote_waits", "remote_lock_timeouts"):
        w(f"  {name:<21}{counters.get(name, 0)}\n")


def _list(args: argparse.Namespace) -> int:
    store = _usable(_cache(args))
    rows: list[dict[str, Any]] = []
    for f in store.entries() if store is not None else []:
        row: dict[str, Any] = {"key": f.key, "bytes": f.size, "last_used": f.mtime}
        try:
            with open(f.path, "rb") as fh:
                key, meta = read_meta(fh.read())
            if key != f.key:
                raise EntryError("foreign", f"holds key {key}")
            row.update(status="ok", device=meta.get("device"), options=meta.get("options"))
        except (OSError, EntryError) as exc:
            row.update(status=f"damaged ({exc})")
        rows.append(row)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    for r in rows:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_used"]))
        extra = (
            f"{r['device']}  {r['options'] or '-'}" if r["status"] == "ok" else r["status"]
        )
        sys.stdout.write(f"{r['key'][:16]}  {_human(r['bytes']):>9}  {used}  {extra}\n")
    sys.stdout.write(f"{len(rows)} entries\n")
    return 0


def _clear(args: argparse.Namespace) -> int:
    cache = _cache(args)
    store = _usable(cache)
    if store is None:
        return 0
    n = cache.clear(memory=True, disk=True)
    store.reset_counters()
    sys.stdout.write(f"removed {n} files from {cache.cache_dir}\n")
    return 0


def _prune(args: argparse.Namespace) -> int:
    cache = _cache(args)
    if _usable(cache) is None:
        return 0
    cap = parse_size(args.max_bytes, "--max-bytes") if args.max_bytes else None
    out = cache.prune(cap)
    sys.stdout.write(
        f"removed {out['damaged']} damaged entries, {out['temp']} stale temporary files, "
        f"evicted {out['evicted']} entries\n"
    )
    return 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
