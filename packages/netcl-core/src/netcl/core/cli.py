"""The ``netcl`` command. Subcommands come from the ``netcl.cli`` entry-point group, so the
command shows only what is installed: each entry point is ``register(subparsers) -> None``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import distributions, entry_points

import pyopencl as cl

from netcl.core import device, paths

__all__ = ["main", "register_info"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``netcl`` console command."""
    parser = argparse.ArgumentParser(prog="netcl", description="netcl runtime tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register_info(sub)  # built in: works even from a source tree with no entry points installed
    for ep in sorted(entry_points(group="netcl.cli"), key=lambda e: e.name):
        if ep.name != "info":
            ep.load()(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def register_info(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("info", help="OpenCL platforms and devices, netcl packages, cache location")
    p.set_defaults(func=_info)


def _info(_: argparse.Namespace) -> int:
    out = sys.stdout
    out.write("netcl packages:\n")
    for name, ver in sorted(_netcl_distributions().items()):
        out.write(f"  {name} {ver}\n")
    out.write(f"pyopencl {cl.VERSION_TEXT}\n")
    out.write("OpenCL platforms:\n")
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        platforms = []
        out.write(f"  none ({exc})\n")
    for i, plat in enumerate(platforms):
        out.write(f"  [{i}] {plat.name} ({plat.version})\n")
        for j, dev in enumerate(device._devices_of(plat)):
            kind = cl.device_type.to_string(dev.type)
            out.write(f"      [{i}:{j}] {dev.name} [{kind}] driver {dev.driver_version}\n")
    try:
        chosen = device.pick_device()
        out.write(f"default device: {chosen.name} ({chosen.platform.name})\n")
        out.write(f"device identity: {device.device_identity(chosen)}\n")
    except device.NoDeviceError as exc:
        out.write(f"default device: none: {exc}\n")
    out.write(f"cache dir: {paths.default_cache_dir()}\n")
    return 0


def _netcl_distributions() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("netcl-"):
            found[name] = dist.version
    return found


if __name__ == "__main__":
    raise SystemExit(main())
