"""The saved format as a contract: files speak netcl's words (no pyopencl private name, no path of
the saving machine), every field of a hostile manifest is refused at load by name, and files of
earlier versions keep loading (the kept version-1 file, made by ``data/make_v1.py``)."""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import importlib.util
import json
import os
import re
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


@pytest.mark.parametrize("glued", [False, True], ids=["-I folder", "-Ifolder"])
def test_absolute_paths_in_build_options_are_refused_at_save(
    glued: bool, queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """An include folder of this machine, apart from its option or glued to it (the loader
    refuses the same options: test_each_hostile_field_is_refused_by_name)."""
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "one.h").write_text("#define ONE 1.0f\n")
    option = "-I" if glued else "-I "
    prg = cl.Program(
        queue.context,
        '#include "one.h"\n__kernel void one(__global float *y) { y[get_global_id(0)] = ONE; }',
    ).build(f"{option}{tmp_path / 'inc'}")
    y = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    with KernelCapture() as cap:
        prg.one(queue, (16,), None, y)
    with pytest.raises(
        CaptureFileError,
        match=rf"build options name '{tmp_path / 'inc'}', an absolute path, which another "
        "machine need not have: build with the headers inlined in the source, or their folder "
        "relative$",
    ) as refused:
        cap.save(tmp_path / "cap.ncl")
    assert str(refused.value).startswith(f"save({str(tmp_path / 'cap.ncl')!r}): ")  # the file
    assert not list(tmp_path.glob("*.ncl*"))


def test_a_version_1_argument_of_another_kind_is_refused_by_name(
    queue: cl.CommandQueue, tmp_path: Path
) -> None:
    """Version 1 held buffers, scalars, local memory and None: any other value an argument
    holds (a file no release wrote) is refused naming the argument."""

    def image_argument(m: dict[str, Any]) -> None:
        args = m["shapes"][2]["args"]
        args[0] = [0, args[0][1], {"tuple": [{"tuple": [0, {"image": 3}]}]}]

    path = tmp_path / "image.ncl"
    path.write_bytes(_rewrite(V1.read_bytes(), image_argument))
    with pytest.raises(CaptureFileError) as info:
        load_step(path, queue)
    assert str(info.value) == f"{path}: manifest: malformed (ValueError: argument 0 is a image)"


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
        if value is _DROP:
            del m[last]
        else:
            m[last] = value

    return edit


def _first(rows: list[dict[str, Any]], **fields: Any) -> int:
    """The index of the first row with these fields (a file's own layout, whatever the device
    made of it: indices are read from the file, never assumed)."""
    return next(i for i, r in enumerate(rows) if all(r.get(k) == v for k, v in fields.items()))


def _sub(m: dict[str, Any]) -> int:
    """The first sub-buffer whose parent is the file's constant (a region the step made)."""
    return next(
        i
        for i, b in enumerate(m["buffers"])
        if b.get("parent") == _first(m["buffers"], role="constant")
    )


def _hostile(m: dict[str, Any]) -> dict[str, tuple[str, Any, str]]:
    """Case -> (field, value, what the refusal says: after the field's own name where it
    starts with ": "), from the manifest ``m`` of the file they edit. Each case makes one check
    of the loader refuse the file, at the edge where one exists (one byte over, an index one
    past its table, a value 0, a buffer its own parent)."""
    buffers, sections, launches, commands = (
        m[k] for k in ("buffers", "sections", "launches", "commands")
    )
    n_buffers, n_programs, n_sections = len(buffers), len(m["programs"]), len(sections)
    scale, block = _first(launches, kernel="scale"), _first(launches, kernel="block_sum")
    sub, const = _sub(m), _first(buffers, role="constant")
    write, copy, fill = (_first(commands, op=op) for op in ("write", "copy", "fill"))
    marker, launch = _first(commands, op="marker"), _first(commands, op="launch")
    order = sorted(range(n_sections), key=lambda i: sections[i]["start"])
    first, last = sections[order[0]], sections[order[-1]]
    dst, count = commands[copy]["buffers"][1], commands[copy]["count"]
    past = buffers[dst]["size"] - count + 1  # a copy's offset in its destination: one byte over
    region = buffers[const]["size"] - buffers[sub]["size"] + 1  # a region's: one byte over
    index = "expected from 0 to {} (an index of {}"
    return {
        # _parse: types, words, bounds of numbers, lengths and indices
        "empty global size": ("launches.0.global_size", [], ": [], expected a length from 1 to 3"),
        "4-dim offset": ("launches.0.offset", [0, 0, 0, 0], ": [0, 0, 0, 0], expected a length"),
        "negative size": ("launches.0.global_size", [-1], "global_size[0]: -1, expected from 0"),
        "a program past the table": (
            f"launches.{scale}.program",
            n_programs,
            f": {n_programs}, {index.format(n_programs - 1, 'programs')}",
        ),
        "a buffer past the table": (
            f"launches.{scale}.args.1.buffer",
            n_buffers,
            f": {n_buffers}, {index.format(n_buffers - 1, 'buffers')}",
        ),
        "a section past the table": (
            "programs.0.source",
            n_sections,
            f": {n_sections}, {index.format(n_sections - 1, 'sections')}",
        ),
        "a launch past the table": (
            f"commands.{launch}.launch",
            len(launches),
            f": {len(launches)}, {index.format(len(launches) - 1, 'launches')}",
        ),
        "an input past the table": (
            "step.inputs.0",
            [0, n_buffers],
            f"step.inputs[0][1]: {n_buffers}, {index.format(n_buffers - 1, 'buffers')}",
        ),
        "an output past the table": (
            "step.outputs.0.buffer",
            n_buffers,
            f": {n_buffers}, {index.format(n_buffers - 1, 'buffers')}",
        ),
        "local memory of 0 bytes": (f"launches.{block}.args.2.local", 0, ": 0, expected from 1"),
        "a buffer of 0 bytes": ("buffers.0.size", 0, ": 0, expected from 1"),
        "a word of none": ("buffers.0.role", "weights", ': "weights", expected one of input, '),
        "a missing field": ("buffers.0.size", _DROP, ": missing"),
        "an unknown op": ("commands.0.op", "exec", ': "exec", expected one of launch, finish'),
        "a bool for a number": ("sections.0.size", True, ": true, expected int"),
        "a kind of none": ("kind", "model", ': "model", expected one of capture, step'),
        "another version": ("version", 3, ": 3, the header says 2"),
        "nested deep": (
            "step.labels",
            [[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]],
            "manifest: nested 19 deep, at most 16",
        ),
        # _check: sections disjoint and inside the data
        "sections overlapping by one byte": (
            f"sections.{order[1]}.start",
            first["start"] + first["size"] - 1,
            f"sections[{order[1]}]: bytes ",
        ),
        "a section one byte past the data": (
            f"sections.{order[-1]}.size",
            last["size"] + 1,
            f"sections[{order[-1]}]: bytes ",
        ),
        # buffers
        "flags of no OpenCL flag": ("buffers.0.flags", 1 << 40, ": 1099511627776 has bits 0x1"),
        "a buffer its own parent": (
            f"buffers.{sub}.parent",
            sub,
            f": {sub}, expected a buffer before buffer {sub}",
        ),
        "a parent after its region": (
            f"buffers.{const}.parent",
            n_buffers - 1,
            f": {n_buffers - 1}, expected a buffer before buffer {const}",
        ),
        "a region one byte past its parent": (
            f"buffers.{sub}.origin",
            region,
            f"buffers[{sub}].parent: buffer {const} ({buffers[const]['size']} bytes) does not "
            f"hold bytes {region}..{region + buffers[sub]['size']}",
        ),
        "contents of another size": (
            f"buffers.{const}.size",
            buffers[const]["size"] + 1,
            f"buffers[{const}].data: section {buffers[const]['data']} is not "
            f"{buffers[const]['size'] + 1} bytes",
        ),
        # programs' build options: no absolute path, however it is glued to its option
        "an absolute include folder": (
            "programs.0.options",
            "-I /etc",
            ": name '/etc', an absolute path, which another machine",
        ),
        "a folder glued to -I": (
            "programs.0.options",
            "-I/etc",
            ": name '/etc', an absolute path, which another machine",
        ),
        "a path glued to a define": ("programs.0.options", "-DX=/etc/pw", ": name '/etc/pw'"),
        "a drive's folder": ("programs.0.options", "-IC:\\inc", ": name 'C:\\\\inc'"),
        "a home folder": ("programs.0.options", "-I~/inc", ": name '~/inc'"),
        # launches
        "a kernel its program lacks": (f"launches.{block}.kernel", "x", ": 'x' is not a kernel"),
        "a size 0": (f"launches.{scale}.global_size", [0], ": [0]: a size 0 without allow_empty"),
        "a local size of 2 dimensions": (
            f"launches.{block}.local_size",
            [64, 1],
            ": [64, 1] for a 1-dimensional launch",
        ),
        "an offset of 2 dimensions": (
            f"launches.{scale}.offset",
            [0, 0],
            ": [0, 0] for a 1-dimensional launch",
        ),
        "a local size not dividing": (f"launches.{block}.local_size", [3], ": [3] does not divide"),
        "a local size 0": (f"launches.{block}.local_size", [0], ": [0] does not divide"),
        "a buffer and a scalar": (
            f"launches.{scale}.args.2.buffer",
            0,
            f"launches[{scale}].args[2]: more than one of buffer, scalar, local",
        ),
        "a scalar of no dtype": (
            f"launches.{scale}.args.2.scalar.dtype",
            "|V4",  # 4 bytes, as its hex: refused for its dtype alone
            f"launches[{scale}].args[2].scalar: ",
        ),
        "an object scalar": (
            f"launches.{scale}.args.2.scalar.dtype",
            "|O",
            f"launches[{scale}].args[2].scalar: ",
        ),
        "a scalar of 2 bytes": (
            f"launches.{scale}.args.2.scalar.hex",
            "0000",
            f"launches[{scale}].args[2].scalar: ",
        ),
        "a scalar not in hex": (
            f"launches.{scale}.args.2.scalar.hex",
            "zzzzzzzz",
            f"launches[{scale}].args[2].scalar: ",
        ),
        "an argument the kernel lacks": (
            f"launches.{scale}.args.2.index",
            5,
            f"launches[{scale}].args: kernel 'scale' has 3 arguments",
        ),
        # commands: each field as its op has it, operands inside their buffers
        "a launch without its launch": (f"commands.{launch}.launch", _DROP, ": missing, which a"),
        "a write with a launch": (f"commands.{write}.launch", 0, ": 0, which a write does not"),
        "a write without its host array": (f"commands.{write}.host", _DROP, ": missing, which"),
        "a copy with a host array": (f"commands.{copy}.host", 0, ": 0, which a copy does not"),
        "a copy without its count": (f"commands.{copy}.count", _DROP, ": missing, which a copy"),
        "a write with a count": (f"commands.{write}.count", 4, ": 4, which a write does not"),
        "a fill without its pattern": (f"commands.{fill}.pattern", _DROP, ": missing, which a"),
        "a copy with a pattern": (f"commands.{copy}.pattern", "00", ': "00", which a copy does'),
        "a pattern not in hex": (f"commands.{fill}.pattern", "zz", ': "zz", expected hex'),
        "a marker of a buffer": (f"commands.{marker}.buffers", [0], ": [0], expected 0 for a"),
        "a copy of one buffer": (f"commands.{copy}.buffers", [0], ": [0], expected 2 for a copy"),
        "a copy of one offset": (f"commands.{copy}.offsets", [0], ": [0], expected 2 for a copy"),
        "a copy one byte past its buffer": (
            f"commands.{copy}.offsets",
            [0, past],
            f"commands[{copy}].offsets[1]: {past} + {count} bytes lie outside buffer {dst} "
            f"({buffers[dst]['size']} bytes)",
        ),
        # the step's lengths
        "more labels than params": ("step.labels", ["x", "y"], ": 2 labels for 1 params"),
        "more keywords than params": ("step.keywords", ["x", "y"], ": 2 keywords for 1 params"),
        "a size too many": ("step.sizes", [1024, 1024], ": 2 sizes for 1 Tensors and Arrays"),
        "aliasing of another length": ("step.aliasing", [0, 0], ": 2 for 1 Tensors and Arrays"),
    }


def _named(field: str) -> str:
    """A field's name in messages: ``launches[3].args[2]`` for ``launches.3.args.2``."""
    return re.sub(r"\.(\d+)", r"[\1]", field)


_DROP = object()  # a _set value: the field is removed


@pytest.fixture(scope="module")
def hostile(saved: Path) -> dict[str, tuple[str, Any, str]]:
    return _hostile(_manifest_of(saved.read_bytes()))


def _manifest_of(data: bytes) -> dict[str, Any]:
    _, _, _, offset, length, _ = _format.HEADER.unpack(data[: _format.HEADER.size])
    return json.loads(data[offset : offset + length])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "case", list(_hostile(_manifest_of((DATA / "pocl_step.ncl").read_bytes())))
)
def test_each_hostile_field_is_refused_by_name(
    case: str,
    hostile: dict[str, tuple[str, Any, str]],
    saved: Path,
    queue: cl.CommandQueue,
    tmp_path: Path,
) -> None:
    """Each check of the loader, on a file of this device's own making (its indices read from
    the file): the refusal names the file, then the field."""
    field, value, what = hostile[case]
    path = tmp_path / "hostile.ncl"
    path.write_bytes(_rewrite(saved.read_bytes(), _set(field, value)))
    with pytest.raises(CaptureFileError) as info:
        load_step(path, queue)
    message = str(info.value)
    if what.startswith(": "):
        what = _named(field) + what
    assert message.startswith(f"{path}: "), message
    assert what in message, message


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
        "launches[2].program: 7, expected from 0 to LAST_PROGRAM (an index of programs)",
    ),
    (
        "step.outputs.0.buffer",
        99,
        "step.outputs[0].buffer: 99, expected from 0 to LAST_BUFFER (an index of buffers)",
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
    words, an index of a table and its range: the file's last buffer and program, as this
    device's capture made them). A manifest nested 16 deep (the most) is parsed and refused by its
    field; 17 deep is refused before parsing."""
    path = tmp_path / "hostile.ncl"
    path.write_bytes(_rewrite(saved.read_bytes(), _set(field, value)))
    with pytest.raises(CaptureFileError) as info:
        load_step(path, queue)
    m = _manifest_of(saved.read_bytes())
    for table in ("buffer", "program"):
        message = message.replace(f"LAST_{table.upper()}", str(len(m[f"{table}s"]) - 1))
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


_PATHS = st.sampled_from(["-I", "-I ", "-DX=", "-isystem", "-I'"]).flatmap(
    lambda option: st.sampled_from(["/etc", "~/x", "C:\\x", "\\\\host\\x"]).map(
        lambda path: option + path
    )
)


_EDITS = [
    "number",
    "near",
    "zero",
    "self",
    "edge",
    "glued",
    "any",
    "nest",
    "longer",
    "shorter",
    "drop",
]


def _mutate(data: st.DataObject, root: dict[str, Any]) -> None:
    """One edit at a place of ``root``: another number, index, name or value; 0; the index of
    its own row (a buffer its own parent); a number at the edge of another row's bytes, one
    byte either side (a section overlapping the one before by a byte, a region one byte past
    its parent, an offset one byte past its buffer); the value nested in lists; a list made
    longer (a copy of an item) or shorter; a key dropped; a program's options naming an
    absolute path, glued to its option or not."""
    *parents, last = data.draw(st.sampled_from(_places(root)[1:]))
    m: Any = root
    for k in parents:
        m = m[k]
    old = m[last]
    row = parents[1] if len(parents) > 1 and isinstance(parents[1], int) else None
    how = data.draw(st.sampled_from(_EDITS))
    if how == "number":
        m[last] = data.draw(st.integers(-(1 << 64), 1 << 64))
    elif how == "near" and isinstance(old, int) and not isinstance(old, bool):
        m[last] = old + data.draw(st.integers(-3, 3))
    elif how == "zero":
        m[last] = 0
    elif how == "self" and row is not None:
        m[last] = row
    elif how == "edge" and row is not None:
        m[last] = _edge(data, root, parents, last) + data.draw(st.integers(-1, 1))
    elif how == "glued" and isinstance(root.get("programs"), list) and root["programs"]:
        program = data.draw(st.sampled_from(root["programs"]))  # (an earlier edit's: anything)
        if isinstance(program, dict):
            program["options"] = data.draw(_PATHS)
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
    event(f"edit: {how}")


def _edge(data: st.DataObject, root: dict[str, Any], parents: list[Any], last: Any) -> int:
    """Where the bytes of another row end, as seen from the field edited: a section's start
    (another's end), a region's origin (its parent's size less its own), a transfer's offset
    (its buffer's size less its count). Earlier edits may have left anything: 0 then."""
    table = root[parents[0]]
    row = table[parents[1]]
    if not isinstance(row, dict):
        return 0
    buffers = root.get("buffers")
    if parents[-1] == "offsets" and isinstance(buffers, list) and isinstance(last, int):
        k = (row.get("buffers") or [None])[last:][:1]
        buffer = buffers[k[0]] if k and _int(k[0]) < len(buffers) else {}
        return _int(buffer.get("size")) - _int(row.get("count")) if isinstance(buffer, dict) else 0
    other = data.draw(st.sampled_from(table))
    if not isinstance(other, dict):
        return 0
    end = _int(other.get("size"))
    if last == "origin":  # a region of ``other``: its size less the region's
        return end - _int(row.get("size"))
    return end + _int(other.get("start"))


def _int(value: Any) -> int:
    return value if type(value) is int else 0


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


def test_the_published_schema_is_generated_from_every_record_and_field() -> None:
    """The guide's schema (docs/_hooks/manifest_schema.py, run by the docs build) holds every
    record the loader parses with and every field of each, with its table where it is an index
    (a record or field added to ``_format`` reaches the docs without being written again)."""
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("schema", root / "docs/_hooks/manifest_schema.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = hook.schema(Path(_format.__file__).read_text(encoding="utf-8"))
    for record in (_format.Manifest, _format.Step, _format.Command, _format.Buffer, _format.Arg):
        section = text.split(f"**`{record.__name__}`**", 1)[1].split("**`", 1)[0]
        for field in record._fields:
            assert f"| `{field}` |" in section, (record.__name__, field)
    assert "| `launch` | index of `launches` | may be |" in text
    assert "<!-- manifest-schema -->" in (root / "docs/guides/capture.md").read_text()
