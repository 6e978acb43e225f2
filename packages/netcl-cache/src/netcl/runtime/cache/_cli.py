"""``netcl cache stats | list | clear | zero | prune``: the disk tier from the shell (ccache -s).
The contract for scripts (one JSON document with ``--json``, exit codes 0/1/2) is the guide's."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netcl.core import cli, paths, table
from netcl.core.table import human, plural
from netcl.runtime.cache._config import DEFAULT_MAX_BYTES, DISABLE, MAX_BYTES, SETTINGS, parse_size
from netcl.runtime.cache._entry import EntryError
from netcl.runtime.cache._remote import remote_info
from netcl.runtime.cache._store import COUNTERS, DiskStore, probe, refusal

__all__ = ["SETTINGS", "register"]  # SETTINGS: what `netcl config` lists for this package

_Doc = dict[str, Any]
_Action = Callable[[argparse.Namespace, Path], tuple[_Doc, str]]


class _CliError(Exception):
    """A user-facing failure: one line on stderr, exit ``code`` (1 refused/failed, 2 usage)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except ValueError as exc:  # argparse names the option itself: parse_size's text without it
        raise argparse.ArgumentTypeError(str(exc).removeprefix("size: ")) from None


def register(sub: cli.Subcommands) -> None:
    """Add the ``cache`` subcommand to the ``netcl`` command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: an option given before the action is not reset by the action's parser
    common.add_argument(
        "--dir",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="cache folder (default: NETCL_CACHE_DIR or ~/.cache/netcl)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print exactly one JSON document on stdout (messages go to stderr)",
    )
    p = sub.add_parser(
        "cache",
        parents=[common],
        help="the OpenCL program cache: stats, list, clear, zero, prune",
        description="Exit codes: 0 done, 1 refused or failed, 2 usage.",
    )
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    for name, action in _ACTIONS.items():
        # an action's docstring is its help (argparse folds its lines)
        a = csub.add_parser(name, parents=[common], help=action.__doc__, description=action.__doc__)
        a.set_defaults(func=lambda args, n=name, f=action: _run(n, f, args))
        if name == "prune":
            a.add_argument(
                "--max-bytes",
                type=_size,
                metavar="SIZE",
                help="cap to prune to, e.g. 500M (default: the cache's cap)",
            )


def _run(name: str, action: _Action, args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    d = getattr(args, "dir", None)
    root = Path(d).expanduser() if d else paths.default_cache_dir()
    code = 0
    try:
        doc, text = action(args, root)
    except _CliError as exc:
        sys.stderr.write(f"netcl cache {name}: {exc}\n")
        doc, code = {"cache_dir": str(root), "error": str(exc), "exit_code": exc.code}, exc.code
        if not as_json:
            return code
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n" if as_json else text)
    return code


def _open(root: Path, *, write: bool = False) -> tuple[DiskStore, _Doc]:
    """The store at ``root`` (a folder not there yet reads as empty) and the start of the
    action's document. Refuses (exit 1, "unusable: <reason>") what the cache itself could not
    use: a folder it would not trust or could not create, and for ``write`` one it could not
    write in. Never creates anything."""
    try:
        why = refusal(root) or probe(root, write=write)
        exists = root.exists()
    except OSError as exc:
        why = f"{root}: {exc.strerror or exc}"
    if why is not None:
        raise _CliError(1, f"unusable: {why}")
    return DiskStore(root), {"cache_dir": str(root), "exists": exists}


def _setting(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except ValueError as exc:  # a bad NETCL_CACHE_* value: a usage error for actions needing it
        raise _CliError(2, str(exc)) from None


def _changing(root: Path, change: Callable[[], Any]) -> Any:
    try:
        return change()
    except OSError as exc:
        raise _CliError(1, f"cannot change {root}: {exc.strerror or exc}") from None


def _stats(args: argparse.Namespace, root: Path) -> tuple[_Doc, str]:
    """size, entries, temporary files and hit/miss totals"""
    cap = int(_setting(lambda: MAX_BYTES.value(DEFAULT_MAX_BYTES)))
    enabled = not _setting(lambda: DISABLE.value(False))
    store, doc = _open(root, write=enabled)
    files, temps, totals = store.entries(), store.temp_files(), store.totals()
    doc.update({k: totals.get(k, 0) for k in COUNTERS})
    entry_bytes, temp_bytes = sum(f.size for f in files), sum(t.size for t in temps)
    doc.update(
        enabled=enabled,
        entries=sum(f.regular for f in files),
        other_files=sum(not f.regular for f in files),
        entry_bytes=entry_bytes,
        temp_files=len(temps),
        temp_bytes=temp_bytes,
        live_temp_files=sum(t.alive for t in temps),
        bytes=entry_bytes + temp_bytes,
        max_bytes=cap,
        hits=doc["memory_hits"] + doc["disk_hits"] + doc["remote_hits"],
        remote=remote_info(),  # NETCL_CACHE_REMOTE, password redacted, PINGed now
    )
    doc["lookups"] = doc["hits"] + doc["misses"]
    state = "" if doc["exists"] else " (not created yet)"
    state += "" if doc["enabled"] else " (disabled by NETCL_CACHE_DISABLE)"
    other, cap, used, hits, lookups = (
        doc[k] for k in ("other_files", "max_bytes", "bytes", "hits", "lookups")
    )
    r = doc["remote"]
    remote = "not configured (NETCL_CACHE_REMOTE)"
    if r["configured"] and not r["usable"]:
        remote = f"{r['url']}  not used (see the cache_remote_* warning)"
    elif r["configured"] and not r["reachable"]:
        remote = f"{r['url']}  unreachable ({r['error']})"
    elif r["configured"]:  # only a usable tier says whether it is signed
        remote = f"{r['url']}  reachable" + ("" if r["signed"] else ", UNSIGNED")
    share = f" ({100 * hits / lookups:.1f} % of {lookups} lookups)" if lookups else ""
    rows: list[tuple[str, object]] = [
        ("cache dir", f"{doc['cache_dir']}{state}"),
        ("entries", f"{doc['entries']}" + (f" (+{other} not regular files)" if other else "")),
        ("cache size", f"{human(used)} of {human(cap)} ({100 * used / cap if cap else 0:.1f} %)"),
        (
            "temporary files",
            f"{doc['temp_files']} ({human(doc['temp_bytes'])}, "
            f"{doc['live_temp_files']} of running writers)",
        ),
        ("hits", f"{hits}{share}"),
        *[(f"  {name}", doc[name]) for name in COUNTERS if not name.startswith("bytes_")],
        ("bytes read/written", f"{human(doc['bytes_read'])} / {human(doc['bytes_written'])}"),
        ("remote", remote),
    ]
    return doc, "\n".join(table.pairs(rows)) + "\n"


def _list(args: argparse.Namespace, root: Path) -> tuple[_Doc, str]:
    """one line per entry (least recently used first) and temporary file"""
    store, doc = _open(root)
    doc["entries"] = []
    for f in store.entries():
        row: _Doc = {
            "key": f.key,
            "kind": f.kind,
            "bytes": f.size,
            "last_used": f.mtime,
            "status": "ok",
            "device": None,
            "options": None,
        }
        try:
            if (meta := store.meta(f)) is None:
                continue  # removed meanwhile
            row.update(device=meta.get("device"), options=meta.get("options"))
        except (OSError, EntryError) as exc:
            row["status"] = f"damaged ({exc})"
        doc["entries"].append(row)
    doc["temp_files"] = [
        {
            "name": t.path.name,
            "bytes": t.size,
            "mtime": t.mtime,
            "pid": t.pid,
            "writer_running": t.alive,
        }
        for t in store.temp_files()
    ]
    entries = [
        (
            r["key"][:16],
            human(r["bytes"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_used"])),
            *((r["device"], r["options"] or "-") if r["status"] == "ok" else (r["status"], "")),
        )
        for r in doc["entries"]
    ]
    temps = [
        (t["name"], human(t["bytes"]), t["pid"], "running" if t["writer_running"] else "gone")
        for t in doc["temp_files"]
    ]
    out: list[str] = []
    if entries:
        out = table.table(entries, ("KEY", "SIZE", "LAST USED", "DEVICE", "OPTIONS"), right=(1,))
    if temps:
        out += ([""] if out else []) + table.table(
            temps, ("TEMPORARY FILE", "SIZE", "WRITER", "STATE"), right=(1, 2)
        )
    out.append(
        f"{plural(len(entries), 'entry', 'entries')}, {plural(len(temps), 'temporary file')}"
    )
    if not doc["exists"]:
        out.append(f"cache dir: {doc['cache_dir']} (not created yet)")
    return doc, "\n".join(out) + "\n"


def _clear(args: argparse.Namespace, root: Path) -> tuple[_Doc, str]:
    """delete every entry and the hit/miss totals (a running writer's temporary file stays)"""
    store, doc = _open(root)
    doc["removed"] = _changing(root, store.clear)
    _changing(root, lambda: store.remove(store.stats_file))
    doc["kept_temp_files"] = kept = len(store.temp_files())
    note = f" (kept {plural(kept, 'temporary file')} of running writers)" if kept else ""
    return doc, f"removed {plural(doc['removed'], 'file')} from {root}{note}\n"


def _zero(args: argparse.Namespace, root: Path) -> tuple[_Doc, str]:
    """reset the hit/miss statistics to zero (entries stay)"""
    store, doc = _open(root)
    doc["zeroed"] = _changing(root, lambda: store.remove(store.stats_file))
    doc["entries"] = len(store.entries())
    if not doc["exists"]:
        return doc, f"nothing to zero: {root} (not created yet)\n"
    return doc, f"statistics zeroed in {root} ({plural(doc['entries'], 'entry', 'entries')} kept)\n"


def _prune(args: argparse.Namespace, root: Path) -> tuple[_Doc, str]:
    """delete damaged entries and temporary files of writers that are gone, then evict least
    recently used entries down to the size cap"""
    if (cap := args.max_bytes) is None:
        cap = int(_setting(lambda: MAX_BYTES.value(DEFAULT_MAX_BYTES)))
    store, doc = _open(root)
    doc["max_bytes"] = cap
    doc.update(_changing(root, lambda: store.prune(cap)))
    return doc, (
        f"removed {plural(doc['damaged'], 'damaged entry', 'damaged entries')}, "
        f"{plural(doc['temp'], 'temporary file')} of writers that are gone, "
        f"evicted {plural(doc['evicted'], 'entry', 'entries')}\n"
    )


#: Each action: (args, folder) -> (the JSON document, the text for a terminal).
_ACTIONS: dict[str, _Action] = {
    "stats": _stats,
    "list": _list,
    "clear": _clear,
    "zero": _zero,
    "prune": _prune,
}
