"""Pin the pyopencl internals netcl relies on (the table in ``netcl.core.contract``): an upgrade
that moves an argument (above all ``wait_for``) fails here instead of recording wrongly, and a
pyopencl that lacks an entry point, or lies outside the supported versions, fails at import."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap

import pyopencl as cl
import pyopencl._cl as _cl
import pyopencl.invoker as invoker
import pytest

from netcl.core import contract as _contract
from netcl.runtime.capture import _intercept


def _params(fn: object) -> list[str]:
    """Parameter names from nanobind's signature line (``name(a: T, b: T = 0, /) -> R``)."""
    first = (getattr(fn, "__doc__", None) or "").splitlines()[0]
    inner = first[first.index("(") + 1 : first.rindex(")")]
    names = []
    depth = 0
    token = ""
    for ch in inner + ",":
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            name = re.split(r"[:=]", token.strip())[0].strip()
            if name and name not in ("/", "*"):
                names.append(name)
            token = ""
        else:
            token += ch
    return names


def test_transfer_primitives_keep_wait_for_where_capture_expects_it() -> None:
    transfers = [e for e in _contract.ENTRY_POINTS if e.kind in ("transfer", "order")]
    assert len(transfers) == 14
    for entry in transfers:
        params = _params(getattr(_cl, entry.name))
        assert params.index("wait_for") == entry.wait_for, (entry.name, params)
        # the parameters capture binds arguments to, by name and position
        assert params[: len(entry.params)] == list(entry.params), (entry.name, params)
        for operand in entry.operands:
            for name in (operand.mem, operand.offset, operand.count, operand.host):
                assert not name or name in params, (entry.name, name)


def test_transfer_argument_names_used_by_capture() -> None:
    assert _params(_cl._enqueue_copy_buffer)[:6] == [
        "queue",
        "src",
        "dst",
        "byte_count",
        "src_offset",
        "dst_offset",
    ]
    assert _params(_cl._enqueue_fill_buffer)[:5] == ["queue", "mem", "pattern", "offset", "size"]
    assert _params(_cl._enqueue_read_buffer)[:4] == ["queue", "mem", "hostbuf", "src_offset"]
    assert _params(_cl._enqueue_write_buffer)[:4] == ["queue", "mem", "hostbuf", "dst_offset"]
    copy = next(e for e in _contract.ENTRY_POINTS if e.name == "_enqueue_copy_buffer")
    assert copy.params == ("queue", "src", "dst", "byte_count", "src_offset", "dst_offset")


def test_enqueue_nd_range_kernel_signature() -> None:
    assert cl.enqueue_nd_range_kernel is _cl.enqueue_nd_range_kernel
    assert _params(_cl.enqueue_nd_range_kernel) == [
        "queue",
        "kernel",
        "global_work_size",
        "local_work_size",
        "global_work_offset",
        "wait_for",
        "g_times_l",
        "allow_empty_ndrange",
    ]
    launch = next(e for e in _contract.ENTRY_POINTS if e.kind == "launch")
    assert list(launch.params) == _params(_cl.enqueue_nd_range_kernel)
    assert launch.params.index("wait_for") == launch.wait_for
    # the hook takes the same parameters with pyopencl's defaults
    hook = _intercept.HOOKS[(_cl, "enqueue_nd_range_kernel")]
    assert hook is _intercept.HOOKS[(cl, "enqueue_nd_range_kernel")]
    sig = inspect.signature(hook, follow_wrapped=False)
    assert list(sig.parameters) == list(launch.params)
    defaults = {
        k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty
    }
    first = (_cl.enqueue_nd_range_kernel.__doc__ or "").splitlines()[0]
    assert defaults == {
        "global_work_offset": None,
        "wait_for": None,
        "g_times_l": False,
        "allow_empty_ndrange": False,
    }
    for name, value in defaults.items():
        assert f"{name}: " in first and f"= {value}" in first.split(f"{name}:")[1].split(",")[0]


def test_argument_setters_signatures() -> None:
    expected = {
        "set_arg": ["self", "arg_index", "arg"],
        "_set_arg_multi": ["self", "arg"],
        "_set_arg_buf_multi": ["self", "arg"],
        "_set_arg_buf_pack_multi": ["self", "arg"],
        "_set_arg_null": ["self", "arg"],
        "_set_arg_buf": ["self", "arg0", "arg1"],
        "_set_arg_svm": ["self", "arg0", "arg1"],
    }
    setters = {e.name: e for e in _contract.ENTRY_POINTS if e.kind.startswith("setter")}
    assert set(expected) == set(setters)
    for name, params in expected.items():
        assert _params(getattr(cl.Kernel, name)) == params, name
        assert list(setters[name].params) == params[1:], name
    assert _params(cl.CommandQueue.finish) == ["self"]


def test_host_wait_signatures() -> None:
    """The recorded host-side waits: ``Event.wait(self)`` and ``wait_for_events(events)`` (one
    object under ``cl.`` and ``_cl.``), which pyopencl.array's ``finish()`` calls."""
    import pyopencl.array as cla

    assert cl.wait_for_events is _cl.wait_for_events
    assert _params(_cl.wait_for_events) == ["arg"]
    assert _params(cl.Event.wait) == ["self"]
    assert "wait" not in cl.UserEvent.__dict__ and "wait" not in cl.NannyEvent.__dict__
    assert "cl.wait_for_events(self.events)" in inspect.getsource(cla.Array.finish)


def test_generated_invoker_layout() -> None:
    """Kernel.__call__ runs pyopencl's generated invoker, which sets arguments through the
    ``_set_arg*_multi`` setters and enqueues through ``_cl.enqueue_nd_range_kernel`` (the hooks
    a ``knl(...)`` is recorded by); the invoker generator's parameters are the memo's key."""
    source = inspect.getsource(invoker)
    assert "self._set_arg{arg_kind}_multi(" in source
    assert "_cl.enqueue_nd_range_kernel(queue, self," in source
    assert list(inspect.signature(invoker.generate_enqueue_and_set_args).parameters) == [
        "function_name",
        "num_passed_args",
        "num_cl_args",
        "arg_types",
        "work_around_arg_count_bug",
        "warn_about_arg_count_bug",
        "devs",
    ]


def test_installed_pyopencl_is_in_the_supported_range() -> None:
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    req = next(Requirement(r) for r in requires("netcl-capture") or [] if r.startswith("pyopencl"))
    assert req.specifier.contains(version("pyopencl")), (str(req), version("pyopencl"))
    assert any(s.operator == "<" for s in req.specifier)  # an upper bound


def _import_capture_after(patch: str) -> subprocess.CompletedProcess[str]:
    """Import netcl.runtime.capture in a fresh interpreter whose pyopencl ``patch`` changed."""
    code = textwrap.dedent(
        f"""
        import pyopencl, pyopencl._cl, pyopencl.invoker
        {patch}
        try:
            import netcl.runtime.capture
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            print("imported")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        ("pyopencl._cl", "_enqueue_copy_buffer"),
        ("pyopencl.invoker", "generate_enqueue_and_set_args"),
        ("pyopencl", "wait_for_events"),
        ("pyopencl._cl._Program", "_build"),
    ],
)
def test_a_missing_entry_point_fails_the_import_naming_it(owner: str, name: str) -> None:
    res = _import_capture_after(f"del {owner}.{name}")
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert out.startswith("ImportError:"), out
    assert f"{owner}.{name}" in out and _contract.SUPPORTED in out, out


def test_a_missing_method_fails_the_import_naming_it() -> None:
    res = _import_capture_after(
        "orig = pyopencl.Kernel.__dict__['_set_arg_buf_multi']; "
        "delattr(pyopencl.Kernel, '_set_arg_buf_multi')"
    )
    out = res.stdout.strip()
    assert "ImportError:" in out and "pyopencl.Kernel._set_arg_buf_multi" in out, (out, res.stderr)


@pytest.mark.parametrize("version", [(2025, 3, 1), (2027, 1)])
def test_a_pyopencl_outside_the_supported_range_fails_the_import(
    version: tuple[int, ...],
) -> None:
    text = ".".join(map(str, version))
    res = _import_capture_after(f"pyopencl.VERSION = {version!r}; pyopencl.VERSION_TEXT = {text!r}")
    out = res.stdout.strip()
    assert out.startswith("ImportError:"), (out, res.stderr)
    assert f"pyopencl {text} is outside the supported versions" in out, out
    assert _contract.SUPPORTED in out


@pytest.mark.parametrize("distribution", ["netcl-core", "netcl-capture"])
def test_the_supported_range_is_the_package_pin(distribution: str) -> None:
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    pin = next(
        Requirement(r)
        for r in requires(distribution) or []
        if r.startswith("pyopencl") and "extra ==" not in r
    )
    assert pin.specifier == Requirement(_contract.SUPPORTED).specifier, (pin, _contract.SUPPORTED)


def test_the_program_internals_the_cache_builds_with(ctx: cl.Context) -> None:
    dev = ctx.devices[0]
    built = cl.Program(ctx, "__kernel void k(__global int *x) { x[0] = 7; }").build()
    binary = built.get_info(cl.program_info.BINARIES)[0]
    raw = _contract.raw_program(cl.Program(ctx, [dev], [binary]))  # as a cache hit makes it
    assert isinstance(raw, _contract.RawProgram)
    assert _params(_contract.build_raw)[:3] == ["self", "options", "devices"]
    _contract.build_raw(raw, b"", [dev])  # the raw clBuildProgram, as the cache calls it
    assert raw.get_build_info(dev, cl.program_build_info.STATUS) == 0  # CL_BUILD_SUCCESS


def test_the_pool_reads_beneath_capture_hooks() -> None:
    # the pool's primitives are pyopencl's own, whatever capture installs later
    assert _contract.read_buffer is _cl._enqueue_read_buffer
    assert _contract.fill_buffer is _cl._enqueue_fill_buffer
    assert _contract.barrier is _cl._enqueue_barrier_with_wait_list


def test_a_missing_internal_is_refused_naming_it_and_the_supported_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pyopencl without something netcl relies on fails at import with one message naming
    the pyopencl version, the missing name and the supported versions."""
    with pytest.raises(ImportError) as info:
        _contract._owner("pyopencl.NoSuchOwner")
    assert str(info.value) == (
        f"netcl: pyopencl {cl.VERSION_TEXT} has no pyopencl.NoSuchOwner, which netcl relies on; "
        f"supported versions: {_contract.SUPPORTED}"
    )
    monkeypatch.delattr(cl, "VERSION_TEXT")
    assert str(_contract._unsupported("pyopencl.Kernel.x")) == (
        "netcl: pyopencl of unknown version has no pyopencl.Kernel.x, which netcl relies on; "
        "supported versions: pyopencl>=2026.1,<2027"
    )
