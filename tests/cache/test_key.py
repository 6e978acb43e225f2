"""Key sensitivity: source, options, included header content, device identity, format version."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.runtime.cache import ProgramCache, _entry


def _fresh(cache_dir: Path) -> ProgramCache:
    return ProgramCache(cache_dir)


def test_source_and_options_change_the_key(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    _fresh(cache_dir).get_program(ctx, add_src(1.0, "k"), device)
    c = _fresh(cache_dir)
    check_add(c.get_program(ctx, add_src(2.0, "k"), device), 2.0)  # other source: a miss
    assert c.stats.misses == 1
    c = _fresh(cache_dir)
    c.get_program(ctx, add_src(1.0, "k"), device, "-cl-mad-enable")  # other options: a miss
    assert c.stats.misses == 1
    c = _fresh(cache_dir)
    c.get_program(ctx, add_src(1.0, "k"), device)  # the original: a disk hit
    assert c.stats.disk_hits == 1
    assert len(c.entries()) == 3


def test_include_content_changes_the_key(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    tmp_path: Path,
    check_add: Callable[..., None],
) -> None:
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "offset.h").write_text('#include "sub/value.h"\n#define OFFSET VALUE\n')
    (inc / "sub" / "value.h").write_text("#define VALUE 5.0f\n")
    src = (
        "#include <offset.h>\n"
        "__kernel void add(__global const float *a, __global const float *b,"
        " __global float *c) { int i = get_global_id(0); c[i] = a[i] + b[i] + OFFSET; }\n"
    )
    opts = f"-I {inc}"
    check_add(_fresh(cache_dir).get_program(ctx, src, device, opts), 5.0)
    c = _fresh(cache_dir)
    check_add(c.get_program(ctx, src, device, opts), 5.0)
    assert c.stats.disk_hits == 1
    # a header two levels down changes: a miss, and the new value is compiled in
    (inc / "sub" / "value.h").write_text("#define VALUE 7.0f\n")
    c = _fresh(cache_dir)
    check_add(c.get_program(ctx, src, device, opts), 7.0)
    assert c.stats.misses == 1 and c.stats.disk_hits == 0


def test_device_identity_changes_the_key(
    ctx: cl.Context,
    device: cl.Device,
    cache_dir: Path,
    add_src: Callable[..., str],
) -> None:
    src = add_src(0.0, "ident")
    _fresh(cache_dir).get_program(ctx, src, device)
    from netcl.core import device as core_device

    def driver_2(d: cl.Device) -> str:
        return core_device.device_identity(d) + " | driver 2"

    c = ProgramCache(cache_dir, device_identity=driver_2)  # injected, not patched
    c.get_program(ctx, src, device)
    assert c.stats.misses == 1  # a driver update makes old binaries stale
    assert len(c.entries()) == 2


def test_key_recipe() -> None:
    k = _entry.compute_key(b"src", "", "dev")
    assert len(k) == 64 and k == _entry.compute_key(b"src", "", "dev")
    assert k != _entry.compute_key(b"src", "", "dev2")
    assert k != _entry.compute_key(b"src ", "", "dev")
    # framing: moving bytes between parts changes the key
    assert _entry.compute_key(b"ab", "c", "d") != _entry.compute_key(b"a", "bc", "d")
    assert _entry.include_dirs('-I a -Ib "-I" "c d" /I e -DX /If -I=g') == [
        "a",
        "b",
        "c d",
        "e",
        "f",
        "g",
    ]


def test_the_key_recipe_is_stable(tmp_path: Path) -> None:
    """The key is pinned to its recipe (tagged, length-framed parts): a release that changed
    it without a new format version would miss every entry a fleet has cached, on disk and in
    Redis. A header that is found adds its name and content, one that is not its name."""
    (tmp_path / "found.h").write_bytes(b"#define N 4\n")
    src = b'#include "found.h"\n#include <absent.h>\n__kernel void k() {}\n'
    opts = f"-I {tmp_path}"
    h = hashlib.sha256()
    parts = [
        (b"fmt", str(_entry.FORMAT_VERSION).encode()),
        (b"dev", b"dev"),
        (b"opt", opts.encode()),
        (b"src", src),
        (b"inc", b"found.h"),
        (b"dat", b"#define N 4\n"),
        (b"inc", b"absent.h"),
        (b"miss", b""),
    ]
    for tag, data in parts:
        h.update(tag + struct.pack("<Q", len(data)) + data)
    assert _entry.compute_key(src, opts, "dev") == h.hexdigest()


def test_format_version_is_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    k = _entry.compute_key(b"src", "", "dev")
    monkeypatch.setattr(_entry, "FORMAT_VERSION", _entry.FORMAT_VERSION + 1)
    assert _entry.compute_key(b"src", "", "dev") != k


def test_pyopencl_header_third_party_kernel(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    device: cl.Device,
    cache_dir: Path,
) -> None:
    """A real third-party header: pyopencl's complex arithmetic, found through -I."""
    import numpy as np

    inc = cl._find_pyopencl_include_path().strip('"')
    src = """
    #include <pyopencl-complex.h>
    __kernel void cmul(__global const cfloat_t *a, __global const cfloat_t *b,
                       __global cfloat_t *c) {
        const int i = get_global_id(0);
        c[i] = cfloat_mul(a[i], b[i]);
    }
    """
    opts = ["-I", inc]
    c = _fresh(cache_dir)
    prg = c.get_program(ctx, src, device, opts)
    c2 = _fresh(cache_dir)
    prg2 = c2.get_program(ctx, src, device, opts)
    assert c2.stats.disk_hits == 1
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(32) + 1j * rng.standard_normal(32)).astype(np.complex64)
    b = (rng.standard_normal(32) + 1j * rng.standard_normal(32)).astype(np.complex64)
    mf = cl.mem_flags
    for p in (prg, prg2):
        da = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
        db = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
        dc = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
        cl.Kernel(p, "cmul")(queue, (32,), None, da, db, dc)
        out = np.empty_like(a)
        cl.enqueue_copy(queue, out, dc)
        np.testing.assert_allclose(out, a * b, rtol=1e-5)
    # the header's content is part of the key
    found = _entry._includes(src.encode(), [inc])
    assert [n for n, _ in found] == [b"pyopencl-complex.h"]
    assert found[0][1] is not None and b"cfloat_t" in found[0][1]
