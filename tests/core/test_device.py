"""Device choice errors as a user meets them (the real ``netcl`` command, user code in a fresh
process) and the profiling queue."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

from netcl.core import device

_NETCL = Path(sys.executable).with_name("netcl")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYOPENCL_CTX"))}
    env.pop("NETCL_PROFILE", None)
    env.update(extra)
    return env


def _netcl(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    assert _NETCL.exists(), f"the netcl console script is not installed beside {sys.executable}"
    return subprocess.run(
        [str(_NETCL), *args], capture_output=True, text=True, timeout=120, env=_env(**env)
    )


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(**env),
    )


def _only_pocl() -> bool:
    return {p.name for p in cl.get_platforms()} == {"Portable Computing Language"}


@pytest.mark.parametrize("value", ["nosuch", "0:99"])
def test_netcl_info_with_a_pyopencl_ctx_that_matches_nothing(value: str) -> None:
    proc = _netcl("info", PYOPENCL_CTX=value)
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr + proc.stdout
    (line,) = proc.stderr.splitlines()  # one line
    assert line.startswith(f"netcl info: PYOPENCL_CTX={value!r} matches no OpenCL device")
    dev = device.pick_device()
    assert f"[0] {dev.platform.name.strip()}: [0:0] " in line  # what exists, in its numbering
    assert "set PYOPENCL_CTX to a platform or platform:device index" in line
    # everything else is still listed
    assert "OpenCL platforms:" in proc.stdout and dev.name in proc.stdout
    assert "default device: none" in proc.stdout and "cache dir: " in proc.stdout


def test_netcl_info_with_no_device() -> None:
    if not _only_pocl():
        pytest.skip("POCL_DEVICES hides devices only where PoCL is the only platform")
    proc = _netcl("info", POCL_DEVICES="nosuchdevice")  # PoCL's platform with no device
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr + proc.stdout
    (line,) = proc.stderr.splitlines()
    assert line.startswith("netcl info: no OpenCL device found (PYOPENCL_CTX is not set)")
    assert "Portable Computing Language: no devices" in line
    assert "pip install 'pyopencl[pocl]'" in line


def test_every_device_of_a_platform_is_listed_when_none_matches() -> None:
    """A PYOPENCL_CTX that matches no device lists each device of each platform by the index
    that would choose it (here PoCL showing two CPU devices): ``[platform:device] name``, comma
    separated."""
    if not _only_pocl():
        pytest.skip("POCL_DEVICES shapes the device list only where PoCL is the only platform")
    proc = _netcl("info", POCL_DEVICES="pthread pthread", PYOPENCL_CTX="0:7")
    assert proc.returncode == 1, proc
    (line,) = proc.stderr.splitlines()
    name = next(part for part in line.split("[0:0] ")[1:]).split(",")[0]
    assert f"Portable Computing Language: [0:0] {name}, [0:1] {name}; " in line, line


def test_user_code_gets_the_netcl_error() -> None:
    proc = _python(
        """
        from netcl.core.device import NoDeviceError, default_context, default_queue, pick_device
        for call in (default_queue, default_context, pick_device):
            try:
                call()
            except NoDeviceError as exc:
                assert isinstance(exc, RuntimeError)
                print(call.__name__, exc)
            else:
                raise SystemExit(f"{call.__name__} did not raise")
        """,
        PYOPENCL_CTX="nosuch",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [
        "default_queue",
        "default_context",
        "pick_device",
    ]
    assert all("PYOPENCL_CTX='nosuch' matches no OpenCL device" in line for line in lines)


def test_no_device_without_pyopencl_ctx_is_the_same_error() -> None:
    if not _only_pocl():
        pytest.skip("POCL_DEVICES hides devices only where PoCL is the only platform")
    proc = _python(
        """
        from netcl.core.device import NoDeviceError, default_queue
        try:
            default_queue()
        except NoDeviceError as exc:
            print(exc)
        """,
        POCL_DEVICES="nosuchdevice",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no OpenCL device found (PYOPENCL_CTX is not set)")


# -- the profiling queue ---------------------------------------------------------------------
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE


def test_default_queue_with_profiling(ctx: cl.Context, queue: cl.CommandQueue) -> None:
    prof = device.default_queue(ctx, profiling=True)
    assert prof.properties & _PROFILING
    assert not queue.properties & _PROFILING  # the plain default queue is unchanged
    assert device.default_queue(ctx, profiling=True) is prof  # one per context and setting
    assert device.default_queue(ctx, profiling=False) is queue is device.default_queue(ctx)
    assert not prof.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    prg = cl.Program(
        ctx, "__kernel void twice(__global float *x) { int i = get_global_id(0); x[i] = 2 * x[i]; }"
    ).build()
    host = np.arange(4096, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    event = prg.twice(prof, host.shape, None, buf)
    event.wait()
    assert 0 < event.profile.queued <= event.profile.submit <= event.profile.start
    assert event.profile.start <= event.profile.end
    out = np.empty_like(host)
    cl.enqueue_copy(prof, out, buf)
    np.testing.assert_array_equal(out, 2 * host)


def test_netcl_profile_turns_profiling_on(
    ctx: cl.Context, queue: cl.CommandQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    for on in ("1", "true", "YES", " on "):
        monkeypatch.setenv("NETCL_PROFILE", on)
        assert device.default_queue(ctx) is device.default_queue(ctx, profiling=True)
        assert device.default_queue(ctx, profiling=False) is queue  # the argument wins
    for off in ("0", "", "false", "off"):
        monkeypatch.setenv("NETCL_PROFILE", off)
        assert device.default_queue(ctx) is queue
    monkeypatch.setenv("NETCL_PROFILE", "sometimes")
    with pytest.raises(ValueError, match=r"NETCL_PROFILE='sometimes': expected 1 .* or 0"):
        device.default_queue(ctx)
