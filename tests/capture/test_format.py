"""The saved format as a contract: files speak netcl's words (no pyopencl private name, no path of
the saving machine), every field of a hostile manifest is refused at load by name, and files of
earlier versions keep loading (the kept version-1 file, made by ``data/make_v1.py``)."""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import json
import os
import shutil
import site
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from netcl.core import contract
from netcl.core.device import device_identity
from netcl.runtime.capture import (
    CaptureFileError,
    KernelCapture,
    _format,
    _saved,
    capture_step,
    load_capture,
    load_step,
)

from .data import make_v1

DATA = Path(__file__).with_name("data")
V1 = DATA / "v1_step.ncl"
PRIVATE = [e.name for e in contract.ENTRY_POINTS if e.name.startswith("_")]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, queue: cl.CommandQueue) -> Path:
    """A step saved in this release's format: ``make_v1``'s step, which uses every part of it."""
    step = capture_step(make_v1.make_step(queue))
    x = make_v1.make_input(queue)
    step(x), step(x)
    path = tmp_path_factory.mktemp("format") / "step.ncl"
    step.save(path)
    return path


def _same_device(path: Path, queue: cl.CommandQueue) -> bool:
    return _saved.inspect(path)["device_identity"] == device_identity(queue.device)


def _check_loaded(path: Path, queue: cl.CommandQueue, calls: int = 3) -> None:
    """``path`` loaded gives what the step gives run normally: bit-identical from the file's own
    binaries, to float tolerance where another device rebuilt them from the saved source."""
    loaded = load_step(path, queue)
    normal = make_v1.make_step(queue)
    exact = _same_device(path, queue)
    for seed in range(calls):
        want = [a.get() for a in normal(make_v1.make_input(queue, seed))]
        got = [a.get() for a in loaded(make_v1.make_input(queue, seed))]
        for w, g in zip(want, got, strict=True):
            if exact:
                assert w.tobytes() == g.tobytes(), f"call {seed}"
            else:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert loaded.stats.replays == calls


@pytest.mark.parametrize("elsewhere", [False, True], ids=["as saved", "another device"])
@pytest.mark.parametrize(("name", "version"), [("v1_step.ncl", 1), ("pocl_step.ncl", 2)])
def test_the_kept_files_load_and_replay(
    name: str, version: int, elsewhere: bool, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """The kept version-1 file and a step saved on PoCL (``data/cross_device.py``; on another
    device, e.g. a GPU, this is the cross-device check): as saved, and as if saved on another
    device (rebuilt from source, pyopencl's include folder found on this machine)."""
    path = tmp_path / name
    shutil.copy(DATA / name, path)  # a copy: the kept file stays as committed
    if elsewhere:
        path.write_bytes(_rewrite(path.read_bytes(), _set("device.identity", "Another device")))
    assert _saved.inspect(path)["format_version"] == version
    _check_loaded(path, queue)


def test_files_hold_no_pyopencl_name_and_no_path_of_this_machine(
    saved: Path, queue: cl.CommandQueue, kernels: Any, tmp_path: Path
) -> None:
    """A step and a KernelCapture using pyopencl.array, Kernel.__call__, preset arguments,
    local memory, sub-buffers and every transfer kind. Program binaries are the driver's own
    bytes, loaded only by the device that wrote them (PoCL's embed its kernel cache's path):
    everything else is checked."""
    step_body = make_v1.make_step(queue)
    x = make_v1.make_input(queue)
    with KernelCapture() as cap:
        step_body(x)
    cap.save(tmp_path / "cap.ncl")
    paths = {
        os.path.expanduser("~"),
        sys.prefix,
        *site.getsitepackages(),
        os.path.dirname(cl.__file__),
    }
    for path in (saved, tmp_path / "cap.ncl"):
        data = bytearray(path.read_bytes())
        m = _format.read(open(path, "rb"), str(path), len(data))  # noqa: SIM115
        for p in m.programs:  # the driver's binaries blanked, the rest as written
            if p.binary is not None:
                s = m.sections[p.binary]
                data[s.start : s.start + s.size] = bytes(s.size)
        found = [n for n in [*PRIVATE, *paths] if n.encode() in data]
        assert not found, f"{path.name} holds {found}"
        ops = {c.op for c in m.commands}
        assert ops >= {"launch", "write", "read", "copy", "fill", "marker", "barrier"}, ops
        assert {"-I {pyopencl}"} <= {p.options for p in m.programs}
        assert any(a.local for launch in m.launches for a in launch.args)
        assert any(b.parent is not None for b in m.buffers)
    again = load_capture(tmp_path / "cap.ncl", queue)
    assert len(again.launches) == len(cap.launches)


def test_absolute_paths_in_build_options_are_refused_at_save(
    queue: cl.CommandQueue, tmp_path: Path
) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "one.h").write_text("#define ONE 1.0f\n")
    prg = cl.Program(
        queue.context,
        '#include "one.h"\n__kernel void one(__global float *y) { y[get_global_id(0)] = ONE; }',
    ).build(f"-I {tmp_path / 'inc'}")
    y = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    with KernelCapture() as cap:
        prg.one(queue, (16,), None, y)
    with pytest.raises(
        CaptureFileError,
        match=rf"build options name '{tmp_path / 'inc'}', a "
        "path of this machine.*build with the headers inlined",
    ) as refused:
        cap.save(tmp_path / "cap.ncl")
    assert str(refused.value).startswith(f"save({str(tmp_path / 'cap.ncl')!r}): ")  # the file
    assert not list(tmp_path.glob("*.ncl*"))


def test_a_version_1_argument_set_to_none_loads_as_a_null_argument(
    queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """Version 1 kept ``set_arg(i, None)`` (a NULL buffer) as an index with no value: it loads
    as an argument with no buffer, scalar or local size (what ``None`` sets now)."""

    def null_first_argument(m: dict[str, Any]) -> None:
        args = m["shapes"][2]["args"]  # the kernel "scale": y, x, a
        args[0] = [0, args[0][1], {"tuple": [{"tuple": [0, None]}]}]

    path = tmp_path / "null.ncl"
    path.write_bytes(_rewrite(V1.read_bytes(), null_first_argument))
    load_step(path, queue)  # not called: the kernel writes through its first argument
    scale = [
        launch for launch in load_capture(path, queue).launches if launch.kernel_name == "scale"
    ]
    assert scale and all(launch.args[0] is None for launch in scale), scale


@pytest.mark.parametrize("path", ["saved", "v1"])
def test_files_load_with_pyopencl_s_setters_renamed(
    path: str, saved: Path, queue: cl.CommandQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a pyopencl release renaming its private argument setters does to a file: nothing
    (a file names no setter; its arguments are values, set through the public ``set_arg``).
    Transfers are not renamed here: pyopencl's own ``enqueue_copy`` calls them by name."""
    file = saved if path == "saved" else V1
    normal = [a.get() for a in make_v1.make_step(queue)(make_v1.make_input(queue, 5))]
    with monkeypatch.context() as m:
        for e, owner, obj in contract.BOUND:
            if e.name.startswith("_") and e.kind.startswith("setter"):
                m.delattr(owner, e.name)
                m.setattr(owner, f"{e.name}_renamed", obj, raising=False)
        loaded = load_step(file, queue)
        got = [a.get() for a in loaded(make_v1.make_input(queue, 5))]
    for w, g in zip(normal, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# -- hostile manifests --------------------------------------------------------------------------
def _rewrite(data: bytes, edit: Callable[[dict[str, Any]], Any]) -> bytes:
    """``data`` with its manifest edited in place by ``edit`` and every checksum valid."""
    _, version, _, offset, length, _ = _format.HEADER.unpack(data[: _format.HEADER.size])
    manifest = json.loads(data[offset : offset + length])
    edit(manifest)
    text = json.dumps(manifest).encode()
    head = _format.HEADER.pack(_format.MAGIC, version, 0, offset, len(text), zlib.crc32(text))
    return head + data[len(head) : offset] + text


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit that sets the field at ``path`` (``launches.0.global_size``) to ``value``."""
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]

    def edit(m: dict[str, Any]) -> None:
        for k in parents:
            m = m[k]
        m[last] = value(m[last]) if callable(value) else value

    return edit


def _deep(m: dict[str, Any]) -> None:
    m["step"]["labels"] = json.loads("[" * 200 + "]" * 200)


HOSTILE = {  # edit -> what the refusal says
    "launches.0.global_size": ([], r"launches\[0\]\.global_size: \[\], expected a length from 1"),
    "launches.1.global_size": ([0], r"launches\[1\]\.global_size: \[0\]: a size 0 without"),
    "launches.2.global_size": ([-256], r"launches\[2\]\.global_size\[0\]: -256, expected from 0"),
    "launches.0.local_size": ([3], r"launches\[0\]\.local_size: \[3\] does not divide \[256\]"),
    "launches.3.local_size": ([64, 1], r"launches\[3\]\.local_size: \[64, 1\] for a 1-dim"),
    "launches.3.offset": ([0, 0, 0, 0], r"launches\[3\]\.offset: \[0, 0, 0, 0\], expected a len"),
    "launches.2.offset": ([0, 0], r"launches\[2\]\.offset: \[0, 0\] for a 1-dimensional launch"),
    "launches.3.kernel": ("scale", r"the OpenCL driver refused it: clSetKernelArg failed"),
    "launches.2.program": (
        7,
        r"launches\[2\]\.program: 7, expected from 0 to 1 \(an index of "
        "programs",
    ),
    "launches.2.args.2.index": (
        5,
        r"launches\[2\]\.args: kernel 'scale' has 3 arguments.*"
        r"\[0, 1, 5\]",
    ),
    "launches.2.args.2.scalar.dtype": ("|O", r"launches\[2\]\.args\[2\]\.scalar: .*not the hex"),
    "launches.2.args.2.scalar.hex": ("0000", r"launches\[2\]\.args\[2\]\.scalar: .*not the hex"),
    "launches.2.args.1.buffer": (
        99,
        r"launches\[2\]\.args\[1\]\.buffer: 99, expected from 0 to"
        r" 7 \(an index of buffers\)",
    ),
    "launches.3.args.2.buffer": (1, r"launches\[3\]\.args\[2\]: more than one of buffer, scal"),
    "launches.3.args.2.local": (-1, r"launches\[3\]\.args\[2\]\.local: -1, expected from 1"),
    "programs.1.kernels": (["scale"], r"launches\[3\]\.kernel: 'block_sum' is not a kernel of "),
    "programs.0.binary": (70, r"programs\[0\]\.binary: 70, expected from 0 to 6 \(an index of "),
    "buffers.4.parent": (5, r"buffers\[4\]\.parent: buffer 5 does not hold bytes 0\.\.1024 "),
    "buffers.5.origin": (1 << 20, r"buffers\[5\]\.parent: buffer 3 does not hold bytes"),
    "buffers.6.size": (2048, r"buffers\[6\]\.data: section \d is not 2048 bytes"),
    "buffers.0.role": ("weights", r"buffers\[0\]\.role: \"weights\", expected one of input, "),
    "buffers.0.size": (None, r"buffers\[0\]\.size: missing"),
    "sections.1.start": (70, r"sections\[1\]: bytes 70\.\.795 overlap another section or lie "),
    "commands.0.launch": (4, r"commands\[0\]\.launch: 4, expected from 0 to 3 \(an index of "),
    "commands.0.op": ("exec", r"commands\[0\]\.op: \"exec\", expected one of launch, finish"),
    "commands.3.host": (None, r"commands\[3\]: .*not a write"),
    "commands.4.offsets": (
        [0, 512],
        r"commands\[4\]\.offsets\[1\]: 512 \+ 1024 bytes lie "
        r"outside buffer 6 \(1040 bytes\)",
    ),
    "commands.7.pattern": ("zz", r"commands\[7\]: .*not a fill"),
    "step.inputs.0": ([0, 9], r"step\.inputs\[0\]\[1\]: 9, expected from 0 to 7 \(an index of "),
    "step.outputs.0.buffer": (9, r"step\.outputs\[0\]\.buffer: 9, expected from 0 to 7"),
    "step.labels": (["x", "y"], r"step: its labels, params, keywords, aliasing and sizes "),
    "step": (_deep, r"manifest: nested 202 deep, at most 16"),
    "version": (3, r"version: 3, the header says 2"),
    "kind": ("model", r"kind: \"model\", expected one of capture, step"),
}


@pytest.mark.parametrize("field", list(HOSTILE))
def test_each_hostile_field_is_refused_by_name(
    field: str, saved: Path, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    value, match = HOSTILE[field]
    path = tmp_path / "hostile.ncl"
    edit = value if callable(value) else _set(field, value)
    path.write_bytes(_rewrite(saved.read_bytes(), edit))
    with pytest.raises(CaptureFileError, match=match) as info:
        load_step(path, queue)
    assert str(info.value).startswith(f"{path}: "), info.value


WHOLE = [  # edit, value -> the whole refusal after the file's name
    ("device", 5, "device: 5, expected an object"),
    ("device.name", 5, "device.name: 5, expected str"),
    ("launches.0.allow_empty", 1, "launches[0].allow_empty: 1, expected bool"),
    ("launches.0.global_size", "256", 'launches[0].global_size: "256", expected a list'),
    ("step.inputs.0", [0], "step.inputs[0]: [0], expected a list"),
    ("kind", "model", 'kind: "model", expected one of capture, step'),
    (
        "buffers.0.role",
        "w" * 60,
        f'buffers[0].role: "{"w" * 39}, expected one of input, output, constant, scratch',
    ),
    (
        "launches.2.program",
        7,
        "launches[2].program: 7, expected from 0 to 1 (an index of programs)",
    ),
    (
        "step.outputs.0.buffer",
        9,
        "step.outputs[0].buffer: 9, expected from 0 to 7 (an index of buffers)",
    ),
    ("version", 3, "version: 3, the header says 2"),
    (
        "step.labels",
        json.loads("[" * 14 + "]" * 14),
        f"step.labels[0]: {'[' * 13}{']' * 13}, expected str",
    ),
    ("step.labels", json.loads("[" * 15 + "]" * 15), "manifest: nested 17 deep, at most 16"),
]


@pytest.mark.parametrize(
    ("field", "value", "message"), WHOLE, ids=[f"{f}={json.dumps(v)[:12]}" for f, v, _ in WHOLE]
)
def test_a_refused_field_gives_its_whole_message(
    field: str, value: Any, message: str, saved: Path, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """The whole message a user reads for each kind of bad field: its path, its value as JSON
    (cut to 40 characters), and what was expected (a type, an object, a list, one of the
    words, an index of a table and its range). A manifest nested 16 deep (the most) is parsed
    and refused by its field; 17 deep is refused before parsing."""
    path = tmp_path / "hostile.ncl"
    path.write_bytes(_rewrite(saved.read_bytes(), _set(field, value)))
    with pytest.raises(CaptureFileError) as info:
        load_step(path, queue)
    assert str(info.value) == f"{path}: {message}"


def test_a_list_of_a_bad_length_names_the_lengths_allowed(
    saved: Path, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """A list too short or too long (a launch's sizes: 1 to 3 dimensions) is refused naming
    the list and the lengths allowed, and no table (it once said "(an index of (1, 3))")."""
    for value in ([], [64, 1, 1, 1]):
        path = tmp_path / "hostile.ncl"
        path.write_bytes(_rewrite(saved.read_bytes(), _set("launches.0.global_size", value)))
        with pytest.raises(CaptureFileError) as info:
            load_step(path, queue)
        assert str(info.value) == (
            f"{path}: launches[0].global_size: {value}, expected a length from 1 to 3"
        ), info.value


def test_a_manifest_that_is_not_json_is_refused_with_the_parser_error(
    saved: Path, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """A manifest with a valid checksum that JSON cannot parse is refused naming the file, the
    manifest and the parser's own error."""
    data = saved.read_bytes()
    _, version, _, offset, _, _ = _format.HEADER.unpack(data[: _format.HEADER.size])
    text = b'{"version": 2,'
    head = _format.HEADER.pack(_format.MAGIC, version, 0, offset, len(text), zlib.crc32(text))
    path = tmp_path / "garbled.ncl"
    path.write_bytes(head + data[len(head) : offset] + text)
    with pytest.raises(CaptureFileError) as info:
        load_step(path, queue)
    assert str(info.value) == (
        f"{path}: manifest: malformed (JSONDecodeError: Expecting "
        "property name enclosed in double quotes: line 1 column 15 "
        "(char 14))"
    )


def test_a_later_version_is_refused_by_name(
    saved: Path, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    data = saved.read_bytes()
    path = tmp_path / "later.ncl"
    path.write_bytes(data[:8] + (3).to_bytes(4, "little") + data[12:])
    with pytest.raises(
        CaptureFileError,
        match=r"format version 3 \(flags 0\); this netcl-"
        "capture reads versions 1 to 2: load it with the netcl-capture that "
        "saved it, or a later one",
    ):
        load_step(path, queue)


# -- any edit of a manifest: a CaptureFileError or a file that loads ----------------------------
def _places(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in JSON data, as the keys leading to it."""
    inner = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    return [at, *(p for k, v in inner for p in _places(v, (*at, k)))]


_ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats()
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=6,
)


def _mutate(data: st.DataObject, m: dict[str, Any]) -> None:
    """One edit at a place of ``m``: another number, index, name or value; the value nested in
    lists; a list made longer (a copy of an item) or shorter; a key dropped."""
    *parents, last = data.draw(st.sampled_from(_places(m)[1:]))
    for k in parents:
        m = m[k]
    old = m[last]
    how = data.draw(st.sampled_from(["number", "near", "any", "nest", "longer", "shorter", "drop"]))
    if how == "number":
        m[last] = data.draw(st.integers(-(1 << 64), 1 << 64))
    elif how == "near" and isinstance(old, int) and not isinstance(old, bool):
        m[last] = old + data.draw(st.integers(-3, 3))
    elif how == "nest":
        m[last] = _nest(old, data.draw(st.integers(1, 40)))
    elif how == "longer" and isinstance(old, list) and old:
        old.insert(
            data.draw(st.integers(0, len(old))), copy.deepcopy(data.draw(st.sampled_from(old)))
        )
    elif how == "shorter" and isinstance(old, list) and old:
        del old[data.draw(st.integers(0, len(old) - 1))]
    elif how == "drop" and isinstance(m, dict):
        del m[last]
    else:
        m[last] = data.draw(_ANY)


def _nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


class _Files(dict[str, bytes]):
    def __repr__(self) -> str:  # what a failing example prints: not a megabyte of bytes
        return f"files({', '.join(self)})"


@pytest.fixture(scope="module")
def files(saved: Path) -> _Files:
    return _Files(saved=saved.read_bytes(), v1=V1.read_bytes())


@settings(
    max_examples=int(os.environ.get("NETCL_FORMAT_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(st.data())
def test_edited_manifests_load_or_give_a_capture_file_error(
    files: _Files, queue: cl.CommandQueue, tmp_path: Path, data: st.DataObject
) -> None:
    which = data.draw(st.sampled_from(sorted(files)))
    edits = data.draw(st.integers(1, 3))

    def edit(m: dict[str, Any]) -> None:
        for _ in range(edits):
            _mutate(data, m)

    path = tmp_path / f"edited-{os.getpid()}.ncl"
    path.write_bytes(_rewrite(files[which], edit))
    message = ""  # anything but a CaptureFileError fails the test
    try:
        load_step(path, queue)
    except CaptureFileError as exc:
        message = str(exc)
    assert not message or message.startswith(f"{path}: "), message
    field = message.removeprefix(f"{path}: ").split(":")[0].split("[")[0]
    event(f"refused: {field}" if message else "loaded")  # --hypothesis-show-statistics


def _natively_built(lib: ctypes.CDLL, ctx: cl.Context, source: str) -> cl.Program:
    """A program a native library built (``clBuildProgram`` with no options), as pyopencl sees
    it: the driver reports its options as empty."""
    lib.clCreateProgramWithSource.restype = ctypes.c_void_p
    lib.clCreateProgramWithSource.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.clBuildProgram.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    err = ctypes.c_int(0)
    text = (ctypes.c_char_p * 1)(source.encode())
    handle = lib.clCreateProgramWithSource(ctx.int_ptr, 1, text, None, ctypes.byref(err))
    assert err.value == 0, err.value
    assert lib.clBuildProgram(handle, 0, None, None, None, None) == 0
    return cl.Program(cl._cl._Program.from_int_ptr(handle, retain=False))


def test_a_program_built_without_options_is_saved_with_its_source_binary_and_options(
    queue: cl.CommandQueue, tmp_path: Path, opencl_loader: ctypes.CDLL
) -> None:
    """A saved program keeps the driver's build options as they are (here none: nothing
    invented), its source and its binary for this device, and loads back."""
    prg = _natively_built(
        opencl_loader,
        queue.context,
        "__kernel void one(__global float *y) { y[get_global_id(0)] = 1.0f; }",
    )
    y = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    with KernelCapture() as cap:
        prg.one(queue, (16,), None, y)
    path = tmp_path / "cap.ncl"
    cap.save(path)
    m = _format.read(open(path, "rb"), str(path), path.stat().st_size)  # noqa: SIM115
    (p,) = m.programs
    assert (p.options, p.kernels) == ("", ["one"]), p
    assert p.binary is not None and m.sections[p.binary].size > 0
    assert p.source is not None
    data = path.read_bytes()
    s = m.sections[p.source]
    assert data[s.start : s.start + s.size].decode() == prg.get_info(cl.program_info.SOURCE)
    assert load_capture(path, queue).num_launches == 1


def test_a_program_made_from_a_binary_is_saved_without_a_source(
    queue: cl.CommandQueue, kernels: Any, tmp_path: Path
) -> None:
    """A program pyopencl made from a device binary has no source: the file holds its binary
    and no source section, and loads back on the device that wrote it."""
    dev = queue.device
    binary = dict(zip(kernels.program.devices, kernels.program.binaries, strict=True))[dev]
    prg = cl.Program(queue.context, [dev], [binary]).build()
    y = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    x = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    with KernelCapture() as cap:
        prg.add(queue, (16,), None, y, x, x)
    path = tmp_path / "cap.ncl"
    cap.save(path)
    m = _format.read(open(path, "rb"), str(path), path.stat().st_size)  # noqa: SIM115
    (p,) = m.programs
    assert p.source is None and p.binary is not None and p.kernels == ["add"], p
    assert load_capture(path, queue).num_launches == 1
