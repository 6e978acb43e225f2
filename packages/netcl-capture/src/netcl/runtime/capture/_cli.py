"""``netcl capture inspect FILE``: what a saved capture or step holds, as a table or, with
``--json``, one JSON document (exit codes: 0 done, 1 the file cannot be read, 2 usage)."""

from __future__ import annotations

import argparse
import json
import sys

from netcl.core import cli, table
from netcl.runtime.capture._saved import CaptureFileError, inspect

__all__ = ["register"]

_human = table.human


def register(sub: cli.Subcommands) -> None:
    """Add the ``capture`` subcommand to the ``netcl`` command."""
    p = sub.add_parser(
        "capture",
        help="saved captures and steps: inspect",
        description="Exit codes: 0 done, 1 the file cannot be read, 2 usage.",
    )
    csub = p.add_subparsers(dest="capture_command", metavar="ACTION", required=True)
    a = csub.add_parser(
        "inspect",
        help="what a saved capture or step holds",
        description="device, programs, kernels, buffers by role, sizes",
    )
    a.add_argument("file", metavar="FILE")
    a.add_argument(
        "--json",
        action="store_true",
        help="print exactly one JSON document on stdout (messages go to stderr)",
    )
    a.set_defaults(func=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    try:
        doc = inspect(args.file)
    except CaptureFileError as exc:
        sys.stderr.write(f"netcl capture inspect: {exc}\n")
        if args.json:
            sys.stdout.write(
                json.dumps({"file": args.file, "error": str(exc), "exit_code": 1}) + "\n"
            )
        return 1
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return 0
    what = f"a step ({doc['name']})" if doc["kind"] == "step" else "a KernelCapture"
    rows: list[tuple[str, object]] = [
        ("file", f"{doc['file']} ({_human(doc['bytes'])}, format {doc['format_version']})"),
        ("holds", what),
        ("device", doc["device"]),
        ("commands", f"{doc['commands']} ({table.plural(doc['launches'], 'launch', 'launches')})"),
    ]
    lines = [*table.pairs(rows), "", "programs:"]
    lines += table.table(
        [
            (i, _human(p["binary_bytes"]), "yes" if p["source"] else "no", ", ".join(p["kernels"]))
            for i, p in enumerate(doc["programs"])
        ],
        ["#", "binary", "source", "kernels"],
        right=(0, 1),
    )
    lines += ["", "buffers:"]
    lines += table.table(
        [(role, b["count"], _human(b["bytes"])) for role, b in sorted(doc["buffers"].items())],
        ["role", "count", "bytes"],
        right=(1, 2),
    )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
