"""The public API: cacher and ProgramCache, tiers, hits across instances and processes."""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
import textwrap
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.runtime.cache import ProgramBuildError, ProgramCache, _program_cache, cacher


def test_spec_examples_verbatim(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    device: cl.Device,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    # keep ~/.cache clean; the patched state goes back after the test
    monkeypatch.setattr(cacher, "_dir_arg", tmp_path / "global")
    monkeypatch.setattr(cacher, "_store_opened", False)
    monkeypatch.setattr(cacher, "_store", None)
    fresh: OrderedDict[object, object] = OrderedDict()
    monkeypatch.setattr(cacher._tier, "entries", fresh)
    monkeypatch.setattr(cacher, "_memory", fresh)
    src_code = add_src(1.0, "spec")
    device = ctx.devices[0]
    # Using the global singleton:
    prg = cacher.get_program(ctx, src_code, device)
    # Or create your own instance with a custom cache directory:
    my_cache = ProgramCache(cache_dir=str(tmp_path / "my_kernels"))
    prg2 = my_cache.get_program(ctx, src_code, device)
    assert isinstance(prg, cl.Program)
    assert isinstance(prg2, cl.Program)
    check_add(prg, 1.0)
    check_add(prg2, 1.0)
    assert len(my_cache.entries()) == 1
    assert (tmp_path / "my_kernels" / "programs").is_dir()


def test_public_names() -> None:
    import netcl.runtime.cache as mod

    assert mod.__all__ == ["ProgramBuildError", "ProgramCache", "cacher"]
    assert isinstance(mod.cacher, ProgramCache)
    assert mod.ProgramBuildError is ProgramCache.BuildError


def test_tiers_memory_disk_compile(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    src = add_src(2.0, "tiers")
    c1 = ProgramCache(cache_dir)
    p1 = c1.get_program(ctx, src, device)
    assert c1.stats.compiles == 1 and c1.stats.misses == 1
    assert c1.get_program(ctx, src, device) is p1
    assert c1.stats.memory_hits == 1
    c2 = ProgramCache(cache_dir)  # fresh instance: a disk hit, no compile
    p2 = c2.get_program(ctx, src, device)
    assert c2.stats.disk_hits == 1 and c2.stats.compiles == 0
    assert c2.stats.bytes_read == c1.stats.bytes_written > 0
    check_add(p2, 2.0)


def test_memory_hit_does_not_hash(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    add_src: Callable[..., str],
) -> None:
    c = ProgramCache(cache_dir)
    src = add_src(0.0, "nohash")
    c.get_program(ctx, src, device)
    calls = []
    monkeypatch.setattr(_program_cache, "compute_key", lambda *a: calls.append(a))
    # an equal string that is a different object still hits
    same = "".join([src[:10], src[10:]])
    assert same is not src
    c.get_program(ctx, same, device)
    c.get_program(ctx, src, device)
    assert calls == []
    assert c.stats.memory_hits == 2


def test_options_as_list_and_device_default(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    c = ProgramCache(cache_dir)
    src = "#ifndef OFFSET\n#error need OFFSET\n#endif\n" + add_src(0.0, "opts").split("\n", 2)[2]
    p = c.get_program(ctx, src, options=["-DOFFSET=3.0f", "-cl-fast-relaxed-math"])
    check_add(p, 3.0)
    assert c.get_program(ctx, src, options=["-DOFFSET=3.0f", "-cl-fast-relaxed-math"]) is p
    # the same options as one string are the same key on disk
    c2 = ProgramCache(cache_dir)
    c2.get_program(ctx, src, ctx.devices[0], "-DOFFSET=3.0f -cl-fast-relaxed-math")
    assert c2.stats.disk_hits == 1


def test_options_naming_a_path_that_is_not_utf8(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    """An -I folder whose name is not UTF-8 (os.fsdecode gives it as surrogates) reaches the
    compiler as its bytes: the program builds, and loads from the disk in another instance."""
    folder = os.fsencode(tmp_path) + b"/inc-\xff"
    os.mkdir(folder)
    with open(folder + b"/offset.h", "wb") as f:
        f.write(b"#define OFFSET 6.0f\n")
    src = "#include <offset.h>\n" + add_src(0.0, "non-utf8").split("\n", 2)[2]
    opts = "-I " + os.fsdecode(folder)
    assert "\udcff" in opts
    check_add(ProgramCache(cache_dir).get_program(ctx, src, device, opts), 6.0)
    again = ProgramCache(cache_dir)
    check_add(again.get_program(ctx, src, device, opts), 6.0)
    assert again.stats.disk_hits == 1


def test_bad_arguments(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
) -> None:
    c = ProgramCache(cache_dir)
    with pytest.raises(TypeError, match=r"ctx must be a pyopencl\.Context"):
        c.get_program("ctx", add_src(), device)  # type: ignore[arg-type]
    with pytest.raises(TypeError) as info:
        c.get_program(ctx, b"__kernel void f() {}", device)  # type: ignore[arg-type]
    assert str(info.value) == "get_program: src_code must be a str of OpenCL C, got bytes"
    with pytest.raises(ValueError, match="src_code is empty"):
        c.get_program(ctx, "  \n", device)
    with pytest.raises(UnicodeEncodeError, match="surrogates not allowed"):  # no text to build
        c.get_program(ctx, "// caf\udce9\n" + add_src(), device)
    with pytest.raises(TypeError, match=r"device must be a pyopencl\.Device"):
        c.get_program(ctx, add_src(), "cpu")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options must be a str or a sequence of str"):
        c.get_program(ctx, add_src(), device, [1, 2])  # type: ignore[list-item]
    # unhashable arguments name themselves too (options as a list is retried as a tuple)
    with pytest.raises(TypeError, match="src_code must be a str"):
        c.get_program(ctx, ["x"], device, ["-DX=1"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"device must be a pyopencl\.Device"):
        c.get_program(ctx, add_src(), [device])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options must be a str or a sequence of str"):
        c.get_program(ctx, add_src(), device, [["-DX=1"]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="max_bytes must be an int >= 0, got -1"):
        ProgramCache(cache_dir, max_bytes=-1)
    with pytest.raises(ValueError, match="lock_timeout"):
        ProgramCache(cache_dir, lock_timeout=-1.0)
    assert c.stats.compiles == 0
    assert not cache_dir.exists()  # nothing was written for bad input


def test_the_devices_of_a_context_are_asked_once_and_held_weakly(
    device: cl.Device, cache_dir: Path, add_src: Callable[..., str]
) -> None:
    """A lookup checks its device against the registry's list of the context's devices
    (ctx.devices is a driver query), asked on first use and gone with the context."""
    registry = _program_cache._Registry()
    own = cl.Context(devices=[device])
    src = add_src(0.0, "devices-of")
    ProgramCache(cache_dir, registry=registry).get_program(own, src, device)
    assert registry.contexts[own] == [device]
    registry.contexts[own] = []  # the list held is the one checked: not asked again
    with pytest.raises(ValueError, match=r"is not in ctx, whose devices are \[\]"):
        ProgramCache(cache_dir, registry=registry).get_program(own, src, device)
    del own
    gc.collect()
    assert len(registry.contexts) == 0


def test_disable_env(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    device: cl.Device,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    monkeypatch.setenv("NETCL_CACHE_DISABLE", "1")
    c = ProgramCache(cache_dir)
    p = c.get_program(ctx, add_src(0.0, "disabled"), device)
    check_add(p, 0.0)
    assert not cache_dir.exists()
    assert c.stats.compiles == 1 and c.stats.disk_hits == 0


def _run_py(code: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_touches_no_disk_and_hits_across_processes(
    tmp_path: Path,
    add_src: Callable[..., str],
) -> None:
    root = tmp_path / "env-dir"
    code = f"""
        import os, sys
        from netcl.runtime.cache import cacher
        from netcl.core import device
        existed = os.path.exists({str(root)!r})
        ctx = device.default_context()
        src = {add_src(4.0, "xproc")!r}
        cacher.get_program(ctx, src, ctx.devices[0])
        s = cacher.stats
        print(existed, s.compiles, s.disk_hits)
    """
    first = _run_py(code, {"NETCL_CACHE_DIR": str(root)})
    second = _run_py(code, {"NETCL_CACHE_DIR": str(root)})
    assert first.split() == ["False", "1", "0"]  # importing made no folder
    assert second.split() == ["True", "0", "1"]  # a new process loads the binary
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / "programs").st_mode) == 0o700


def test_a_build_error_without_options_names_the_device_code_and_log() -> None:
    """A build failure's message: the device, the options only where some were given, the
    OpenCL error code and the driver's log (or ``(empty)``)."""
    plain = ProgramBuildError(device_name="cpu-x", options="", log="1 error\n", code=-11)
    assert str(plain) == "OpenCL build failed on device 'cpu-x' (error -11); build log:\n1 error"
    opts = ProgramBuildError(device_name="cpu-x", options="-DN=4", log=" ", code=None)
    assert str(opts) == (
        "OpenCL build failed on device 'cpu-x' with options '-DN=4' (error "
        "None); build log:\n(empty)"
    )
