"""The demo's arguments are validated up front: a bad value ends in one line on stderr naming
the option and the value, exit status 2, no traceback, before any OpenCL work."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    # demo.py imports its sibling kernels.py by that plain name: load it, then put sys.path and
    # sys.modules back so no other test sees the demo's "kernels".
    saved = sys.modules.pop("kernels", None)
    sys.path.insert(0, str(ROOT / "demo"))
    try:
        spec = importlib.util.spec_from_file_location("_netcl_demo", ROOT / "demo/demo.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "demo"))
        sys.modules.pop("kernels", None)
        if saved is not None:
            sys.modules["kernels"] = saved
    return module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "argument --steps: expected an integer >= 1, got 0"),
        (["--steps", "-3"], "argument --steps: expected an integer >= 1, got -3"),
        (["--steps", "many"], "argument --steps: expected an integer >= 1, got 'many'"),
        (["--prometheus-port", "0"], "argument --prometheus-port: expected a port 1..65535, got 0"),
        (["--prometheus-port", "65536"], "expected a port 1..65535, got 65536"),
        (["--prometheus-port", "http"], "expected a port 1..65535, got 'http'"),
        (["--linger", "-1"], "argument --linger: expected seconds >= 0, got -1"),
        (["--linger", "nan"], "argument --linger: expected seconds >= 0, got nan"),
        (["--linger", "inf"], "argument --linger: expected seconds >= 0, got inf"),
    ],
)
def test_bad_value_is_one_line(
    demo: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        demo.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert message in err, err


def test_good_values(demo: ModuleType) -> None:
    args = demo.parse_args(["--steps", "1", "--linger", "0", "--no-console"])
    assert (args.steps, args.linger, args.prometheus_port, args.no_console) == (1, 0.0, None, True)
    assert demo.parse_args([]).steps == 100


def test_port_in_use_is_one_line(demo: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            demo.parse_args(["--prometheus-port", str(port)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"argument --prometheus-port: cannot serve on 127.0.0.1:{port}: " in err, err
    # the port is free again: accepted
    assert demo.parse_args(["--prometheus-port", str(port)]).prometheus_port == port


def test_command_line_error_has_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "demo/demo.py"), "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "demo.py: error: argument --steps: expected an integer >= 1, got 0 (see --help)\n"
    )
    assert proc.stdout == ""
