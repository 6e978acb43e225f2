from __future__ import annotations

import subprocess
import sys

import pytest

from netcl.core import cli, device


def test_info_lists_device_packages_and_cache(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    dev = device.pick_device()
    assert "netcl-core 0.1.0" in out
    assert f"default device: {dev.name}" in out
    assert device.device_identity(dev) in out
    assert "cache dir: " in out


def test_console_script() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "netcl.core.cli", "info"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "OpenCL platforms:" in proc.stdout


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["nope"])
    assert exc.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_device_identity_is_stable_and_complete() -> None:
    dev = device.pick_device()
    ident = device.device_identity(dev)
    assert ident == device.device_identity(dev)
    for part in (dev.platform.name, dev.name, dev.driver_version):
        assert part.strip() in ident


def test_version_lists_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"netcl-core {version('netcl-core')}" in lines
    assert all(line.startswith("netcl-") for line in lines)


def test_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["info", "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--bogus" in err


def test_cache_command_without_netcl_cache_names_the_package(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when only netcl-core is installed: no `netcl.cli` entry points."""
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["cache", "--dir", "/tmp/x", "stats", "--json"]) == 2
    err = capsys.readouterr().err
    # the distributions are not on PyPI: the hint names the clone and git URL forms that work
    assert "pip install netcl-cache" not in err, err
    assert "python3 -m pip install ./packages/netcl-cache" in err
    assert "netcl-cache @ git+https://" in err and "#subdirectory=packages/netcl-cache" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert cli.main(["info"]) == 0  # the rest still works


def test_a_missing_package_is_named_also_after_a_leading_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command is the first word that is not an option: ``netcl --json cache stats``
    without netcl-cache still names the package to install (not an argparse error)."""
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["--json", "cache", "stats"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("netcl cache: not installed; it comes with the netcl-cache "), err
    assert len(err.strip().splitlines()) == 1


def test_a_broken_plugin_does_not_break_info(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        name = "cache"

        def load(self) -> None:
            raise ImportError("no module named netcl.runtime.cache")

    monkeypatch.setattr(cli, "entry_points", lambda group: [Broken()])
    assert cli.main(["info"]) == 0
    assert "the 'cache' command failed to load" in capsys.readouterr().err


def test_info_prints_every_platform_and_device_in_its_exact_form(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`netcl info` lists pyopencl, each platform and each device with its kind, in the format
    users read and scripts parse."""
    import pyopencl as cl

    from netcl.core import paths

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    expected = [f"pyopencl {cl.VERSION_TEXT}", "OpenCL platforms:"]
    for i, plat in enumerate(cl.get_platforms()):
        expected.append(f"  [{i}] {plat.name} ({plat.version})")
        for j, dev in enumerate(device._devices_of(plat)):
            kind = cl.device_type.to_string(dev.type)
            expected.append(f"      [{i}:{j}] {dev.name} [{kind}] driver {dev.driver_version}")
    dev = device.pick_device()
    expected += [
        f"default device: {dev.name} ({dev.platform.name})",
        f"device identity: {device.device_identity(dev)}",
        f"cache dir: {paths.default_cache_dir()}",
    ]
    lines = out.splitlines()
    start = lines.index(expected[0])
    assert lines[:start] == ["netcl packages:", *(f"  {d}" for d in cli._netcl_distributions())]
    assert lines[start:] == expected
    assert "[None]" not in out  # each device's kind, as pyopencl names it: "ALL | CPU" on PoCL


def test_main_without_arguments_reads_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console script calls main() with no argv: the command comes from sys.argv after the
    program name."""
    monkeypatch.setattr(sys, "argv", ["netcl", "info"])
    assert cli.main() == 0
    assert "default device: " in capsys.readouterr().out
