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
