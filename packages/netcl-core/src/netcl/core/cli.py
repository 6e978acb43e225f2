"""The ``netcl`` command: ``info`` and ``config`` here, other subcommands from the ``netcl.cli``
entry-point group, so the command shows only what is installed: each entry point is
``register(subparsers) -> None``, and its module may declare ``SETTINGS`` for ``netcl config``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from importlib.metadata import distributions, entry_points
from typing import Any, NoReturn, Protocol

from netcl.core import settings, table

__all__ = ["Subcommands", "main", "register_config", "register_info"]

#: Subcommands that other netcl distributions provide: named in a hint when not installed.
_PROVIDERS = {"cache": "netcl-cache", "capture": "netcl-capture"}
#: Where the distributions come from (they are not on PyPI).
_REPO_URL = "https://github.com/OWNER/netcl-runtime"


class Subcommands(Protocol):
    """What a ``netcl.cli`` entry point's ``register`` is given: the ``netcl`` command's
    subcommands (argparse's subparsers action, a class argparse keeps private)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """A new subcommand ``name``, with argparse's keywords (``help``, ``description`` ...)."""


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr, exit code 2. Each parser is its arguments' default
    ``parser``, so the deepest subcommand's is the one the arguments carry (a subcommand's
    values override its parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.set_defaults(parser=self)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class _Version(argparse.Action):
    """``--version``: the installed netcl distributions, one a line."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        sys.stdout.write("".join(f"{d}\n" for d in _netcl_distributions()) or "netcl: none\n")
        sys.stdout.flush()
        parser.exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``netcl`` console command. Exit codes: 0 done, 1 refused or failed,
    2 usage. A closed stdout (``netcl info | head -1``) ends the command quietly."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        from netcl.core import device  # pyopencl: inside the try, for a Ctrl-C while it loads

        try:
            code = _main(args)
        except device.NoDeviceError as exc:  # any subcommand that needs a device: one line
            sys.stdout.flush()
            command = next((a for a in args if not a.startswith("-")), None)
            sys.stderr.write(f"{'netcl ' + command if command else 'netcl'}: {exc}\n")
            code = 1
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at exit
    except BrokenPipeError:
        # the reader went away: point stdout at /dev/null so the interpreter's final flush is
        # quiet (AttributeError: a stdout without a descriptor)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        # one line, no traceback; a reader that went away must not turn it into another error
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        with contextlib.suppress(OSError, ValueError):
            # on a terminal, start a fresh line after the ^C the terminal echoed
            tty = getattr(sys.stderr, "isatty", lambda: False)()
            sys.stderr.write(("\n" if tty else "") + "netcl: interrupted\n")
            sys.stderr.flush()
        return 130
    return code


def _main(argv: list[str]) -> int:
    parser = _Parser(prog="netcl", description="netcl runtime tools")
    parser.add_argument("--version", action=_Version, nargs=0, help="installed netcl distributions")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register_info(sub)  # built in: works even from a source tree with no entry points installed
    register_config(sub)
    for ep in sorted(entry_points(group="netcl.cli"), key=lambda e: e.name):
        if ep.name not in ("info", "config"):
            try:
                ep.load()(sub)
            except Exception as exc:  # one broken plugin must not take `netcl info` down
                sys.stderr.write(f"netcl: the {ep.name!r} command failed to load: {exc}\n")
    missing = {n: d for n, d in _PROVIDERS.items() if n not in sub.choices}
    for name, dist in missing.items():
        sub.add_parser(name, help=f"(not installed: the {dist} distribution)")
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in missing:  # the distributions are not on PyPI: a clone or pip's git URL form
        dist = missing[command]
        sys.stderr.write(
            f"netcl {command}: not installed; it comes with the {dist} distribution, which is "
            f"not on PyPI: from a clone of the repository, python3 -m pip install "
            f'./packages/{dist}; or python3 -m pip install "{dist} @ git+{_REPO_URL}'
            f'#subdirectory=packages/{dist}"\n'
        )
        return 2
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand that was given them: "netcl cache stats: error: ..."
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args) or 0)


def register_info(sub: Subcommands) -> None:
    """Add the built-in ``info`` subcommand."""
    p = sub.add_parser("info", help="OpenCL platforms and devices, netcl packages, cache location")
    p.set_defaults(func=_info)


def _info(_: argparse.Namespace) -> int:
    """Everything that can be listed, then the default device (without one: NoDeviceError, which
    main() reports on stderr in one line, exit code 1)."""
    import pyopencl as cl

    from netcl.core import device, paths

    out = sys.stdout
    out.write("netcl packages:\n" + "".join(f"  {d}\n" for d in _netcl_distributions()))
    out.write(f"pyopencl {cl.VERSION_TEXT}\nOpenCL platforms:\n")
    platforms = []
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        out.write(f"  none ({exc})\n")
    for i, plat in enumerate(platforms):
        out.write(f"  [{i}] {plat.name} ({plat.version})\n")
        for j, dev in enumerate(device._devices_of(plat)):
            kind = cl.device_type.to_string(dev.type)
            out.write(f"      [{i}:{j}] {dev.name} [{kind}] driver {dev.driver_version}\n")
    try:
        chosen = device.pick_device()
    except device.NoDeviceError:  # main() prints it after the rest
        out.write(f"default device: none\ncache dir: {paths.default_cache_dir()}\n")
        raise
    out.write(f"default device: {chosen.name} ({chosen.platform.name})\n")
    out.write(f"device identity: {device.device_identity(chosen)}\n")
    out.write(f"cache dir: {paths.default_cache_dir()}\n")
    return 0


def register_config(sub: Subcommands) -> None:
    """Add the built-in ``config`` subcommand."""
    p = sub.add_parser(
        "config",
        help="every netcl setting: value and source (environment or default)",
        description="Every NETCL_* setting of the installed netcl packages, with its value and "
        "where it came from. Exit codes: 0 all valid, 1 a set value is invalid, 2 usage.",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_config)


def _config(args: argparse.Namespace) -> int:
    # core's settings, and those of each package whose netcl.cli entry-point module declares any
    declared = [("netcl-core", s) for s in settings.SETTINGS]
    for ep in sorted(entry_points(group="netcl.cli"), key=lambda e: e.name):
        try:
            module = importlib.import_module(ep.module)
        except Exception as exc:  # a broken plugin is reported, the rest still listed
            sys.stderr.write(f"netcl config: the {ep.name!r} settings failed to load: {exc}\n")
            continue
        dist = ep.dist.name if ep.dist is not None else ep.name
        declared += [(dist, s) for s in getattr(module, "SETTINGS", ())]
    docs = [{"package": pkg, **settings.describe(s)} for pkg, s in declared]
    if args.json:
        sys.stdout.write(json.dumps({"settings": docs}, indent=2) + "\n")
    else:
        rows = []
        for d in docs:
            source = d["source"] + (" (INVALID)" if d["error"] else "")
            rows.append((d["name"], d["value"], source, d["package"]))
        lines = table.table(rows, ("SETTING", "VALUE", "SOURCE", "PACKAGE"))
        sys.stdout.write("\n".join(lines) + "\n")
    bad = [d["error"] for d in docs if d["error"]]
    for error in bad:
        sys.stderr.write(f"netcl config: {error}\n")
    return 1 if bad else 0


def _netcl_distributions() -> list[str]:
    """``name version`` of each installed netcl distribution, sorted."""
    names = {d.metadata["Name"] or "": d.version for d in distributions()}
    return sorted(f"{n} {v}" for n, v in names.items() if n.lower().startswith("netcl-"))


if __name__ == "__main__":
    raise SystemExit(main())
