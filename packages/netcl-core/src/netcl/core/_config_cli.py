"""``netcl config``: every setting of the installed netcl packages, its value and its source."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from importlib.metadata import entry_points
from typing import Any

from netcl.core import _settings, _table

__all__ = ["register_config"]


def register_config(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the built-in ``config`` subcommand."""
    p = sub.add_parser(
        "config", help="every netcl setting: value and source (environment or default)",
        description="Every NETCL_* setting of the installed netcl packages, with its value and "
        "where it came from. Exit codes: 0 all valid, 1 a set value is invalid, 2 usage.",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_config)


def _declared() -> list[tuple[str, _settings.Setting]]:
    """(package, setting) for core and for each package whose ``netcl.cli`` entry-point module
    declares ``SETTINGS``."""
    found = [("netcl-core", s) for s in _settings.SETTINGS]
    for ep in sorted(entry_points(group="netcl.cli"), key=lambda e: e.name):
        try:
            module = importlib.import_module(ep.module)
        except Exception as exc:  # a broken plugin is reported, the rest still listed
            sys.stderr.write(f"netcl config: the {ep.name!r} settings failed to load: {exc}\n")
            continue
        dist = ep.dist.name if ep.dist is not None else ep.name
        found += [(dist, s) for s in getattr(module, "SETTINGS", ())]
    return found


def _config(args: argparse.Namespace) -> int:
    docs: list[dict[str, Any]] = [
        {"package": pkg, **_settings.describe(s)} for pkg, s in _declared()
    ]
    bad = [d for d in docs if d["error"]]
    if args.json:
        sys.stdout.write(json.dumps({"settings": docs}, indent=2) + "\n")
    else:
        rows = [(d["name"], d["value"], d["source"] + (" (INVALID)" if d["error"] else ""),
                 d["package"]) for d in docs]  # fmt: skip
        sys.stdout.write("\n".join(_table.table(rows, ("SETTING", "VALUE", "SOURCE", "PACKAGE")))
                         + "\n")  # fmt: skip
    for d in bad:
        sys.stderr.write(f"netcl config: {d['error']}\n")
    return 1 if bad else 0
