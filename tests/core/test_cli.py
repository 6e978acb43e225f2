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
