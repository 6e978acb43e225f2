"""Pin the pyopencl internals capture intercepts: an upgrade that moves an argument (above all
``wait_for``) fails here instead of recording wrongly."""

from __future__ import annotations

import inspect
import re

import pyopencl as cl
import pyopencl._cl as _cl
import pyopencl.invoker as invoker

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
    for name, wait_pos in _intercept.TRANSFERS.items():
        params = _params(getattr(_cl, name))
        assert params.index("wait_for") == wait_pos, (name, params)


def test_transfer_argument_names_used_by_capture() -> None:
    assert _params(_cl._enqueue_copy_buffer)[:6] == [
        "queue", "src", "dst", "byte_count", "src_offset", "dst_offset"]
    assert _params(_cl._enqueue_fill_buffer)[:5] == ["queue", "mem", "pattern", "offset", "size"]
    assert _params(_cl._enqueue_read_buffer)[:4] == ["queue", "mem", "hostbuf", "src_offset"]
    assert _params(_cl._enqueue_write_buffer)[:4] == ["queue", "mem", "hostbuf", "dst_offset"]


def test_enqueue_nd_range_kernel_signature() -> None:
    assert cl.enqueue_nd_range_kernel is _cl.enqueue_nd_range_kernel
    assert _params(_cl.enqueue_nd_range_kernel) == [
        "queue", "kernel", "global_work_size", "local_work_size", "global_work_offset",
        "wait_for", "g_times_l", "allow_empty_ndrange"]


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
    assert set(expected) == set(_intercept.ARG_SETTERS)
    for name, params in expected.items():
        assert _params(getattr(cl.Kernel, name)) == params, name
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
    """Kernel.__call__ runs pyopencl's generated invoker: positional (queue, global size,
    local size, *args), then wait_for among the keywords; it sets arguments through the
    ``_set_arg*_multi`` setters and enqueues through ``_cl.enqueue_nd_range_kernel``."""
    enqueue, _ = invoker.generate_enqueue_and_set_args(
        "k", 2, 2, None, work_around_arg_count_bug=None, warn_about_arg_count_bug=None,
        devs=[])
    assert list(inspect.signature(enqueue).parameters) == [
        "self", "queue", "global_size", "local_size", "arg0", "arg1", "global_offset",
        "g_times_l", "allow_empty_ndrange", "wait_for"]
    source = inspect.getsource(invoker)
    assert "self._set_arg{arg_kind}_multi(" in source
    assert "_cl.enqueue_nd_range_kernel(queue, self," in source
    assert list(inspect.signature(invoker.generate_enqueue_and_set_args).parameters) == [
        "function_name", "num_passed_args", "num_cl_args", "arg_types",
        "work_around_arg_count_bug", "warn_about_arg_count_bug", "devs"]


def test_installed_pyopencl_is_in_the_supported_range() -> None:
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    req = next(Requirement(r) for r in requires("netcl-capture") or []
               if r.startswith("pyopencl"))
    assert req.specifier.contains(version("pyopencl")), (str(req), version("pyopencl"))
    assert any(s.operator == "<" for s in req.specifier)  # an upper bound
