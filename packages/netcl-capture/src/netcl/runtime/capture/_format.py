"""The saved format's manifest, declared once: typed records with each field's type and bounds
(an index names the table it points into). Saving writes them; loading, ``load_step`` and
``netcl capture inspect`` read them through one parser that refuses a file by its field
(``launches[3].local_size``), then :func:`_check` checks what types cannot say.

The words are netcl's own: a launch argument is a buffer, a scalar (a dtype of ``SCALARS``),
local memory or None; a command is a launch, a finish or a transfer named by its word in
``netcl.core.contract`` (write, read, copy, fill, marker, barrier); pyopencl's include folder in
build options is ``{pyopencl}``. Version 1 manifests are read into the same records.
"""

import json
import os
import re
import struct
import types
import zlib
from collections.abc import Callable
from typing import IO, Annotated, Any, Literal, NamedTuple, TypeAlias, Union, get_args, get_origin

import numpy as np
import pyopencl as cl

from netcl.core import contract

FORMAT_VERSION = 2  # what this release writes; it reads every version up to it
MAGIC, HEADER, HEADER_SIZE = b"NETCLCAP", struct.Struct("<8sIIQQI"), 64
MAX_MANIFEST, MAX_DEPTH = 64 << 20, 16  # no manifest we write comes near either
INCLUDE, PYOPENCL = "{pyopencl}", os.path.join(os.path.dirname(cl.__file__), "cl")
SCALARS = frozenset(np.dtype(c).str for c in "?bBhHiIlLqQefdFD")  # a scalar argument's dtypes
_STRING, _BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"'), re.compile(rb"[\[\]{}]")
_HEX, _MANY = re.compile("(?:[0-9a-f]{2})*"), (0, 1 << 24)
_TABLES = ("sections", "programs", "buffers", "launches", "params", "sizes")  # indices name them
_SHAPES: dict[int, tuple[Any, tuple[Any, ...]]] = {}


class CaptureFileError(ValueError):
    """A saved capture that cannot be written or loaded; the message names the file and what
    is wrong with it."""


# The records. Annotated with (least, most): a number's bounds, or a text's or list's length;
# with a table's name: an index into it. A field that may be None may be missing.
Bytes: TypeAlias = Annotated[int, (0, 1 << 56)]
Size: TypeAlias = Annotated[int, (1, 1 << 56)]
Name: TypeAlias = Annotated[str, (1, 1 << 10)]
Text: TypeAlias = Annotated[str, (0, 1 << 16)]
Dims: TypeAlias = Annotated[list[Bytes], (1, 3)]
Names: TypeAlias = Annotated[list[Name], (0, 1 << 12)]
Section = NamedTuple(
    "Section", [("start", Bytes), ("size", Bytes), ("crc", Annotated[int, (0, (1 << 32) - 1)])]
)
Program = NamedTuple(
    "Program",
    [
        ("binary", Annotated[int, "sections"] | None),
        ("options", Text),
        ("source", Annotated[int, "sections"] | None),
        ("kernels", Names),
    ],
)
Scalar = NamedTuple("Scalar", [("dtype", Name), ("hex", Annotated[str, (2, 32)])])
# a kernel argument: one of a buffer, a scalar, local memory (its bytes), or None (none of them)
Arg = NamedTuple(
    "Arg",
    [
        ("index", Annotated[int, (0, 1 << 12)]),
        ("buffer", Annotated[int, "buffers"] | None),
        ("scalar", Scalar | None),
        ("local", Size | None),
    ],
)
Launch = NamedTuple(
    "Launch",
    [
        ("program", Annotated[int, "programs"]),
        ("kernel", Name),
        ("global_size", Dims),
        ("local_size", Dims | None),
        ("offset", Dims | None),
        ("allow_empty", bool),
        ("args", Annotated[list[Arg], (0, 1 << 12)]),
    ],
)
# a launch, a finish, or a transfer over buffers (one; a copy's source then destination) at
# offsets: count bytes, or a host array (a section), or a fill's pattern (hex)
Command = NamedTuple(
    "Command",
    [
        ("op", Literal["launch", "finish", "write", "read", "copy", "fill", "marker", "barrier"]),
        ("launch", Annotated[int, "launches"] | None),
        ("buffers", Annotated[list[Annotated[int, "buffers"]], (0, 2)] | None),
        ("offsets", Annotated[list[Bytes], (0, 2)] | None),
        ("count", Bytes | None),
        ("host", Annotated[int, "sections"] | None),
        ("pattern", Annotated[str, (2, 256)] | None),
    ],
)
Buffer = NamedTuple(
    "Buffer",
    [
        ("size", Size),
        ("flags", Bytes),
        ("role", Literal["input", "output", "constant", "scratch"]),
        ("data", Annotated[int, "sections"] | None),
        ("parent", Annotated[int, (0, 1 << 31)] | None),
        ("origin", Bytes),
    ],
)
# a step's argument or output: a Tensor or Array (its fields), a value, the argument `index`,
# a Tensor or Array on the file's `buffer` or on argument `slot`'s buffer
Value = NamedTuple(
    "Value",
    [
        ("kind", Literal["Tensor", "Array", "value", "arg", "fixed", "slot"]),
        ("type", Literal["Tensor", "Array", "int", "float", "bool", "str", "NoneType"] | None),
        ("shape", Annotated[list[Bytes], (0, 32)] | None),
        ("dtype", Name | None),
        ("strides", Annotated[list[int], (0, 32)] | None),
        ("offset", Bytes | None),
        ("value", int | float | bool | Text | None),
        ("index", Annotated[int, "params"] | None),
        ("buffer", Annotated[int, "buffers"] | None),
        ("slot", Annotated[int, "sizes"] | None),
    ],
)
Step = NamedTuple(
    "Step",
    [
        ("name", Text),
        ("labels", Names),
        ("params", Annotated[list[Value], (0, 1 << 12)]),
        ("keywords", Names | None),
        ("sizes", Annotated[list[Bytes], (0, 1 << 12)]),
        ("aliasing", Annotated[list[Annotated[int, "sizes"]], (0, 1 << 12)] | None),
        ("result", Literal["none", "single", "tuple", "list"]),
        ("outputs", Annotated[list[Value], (0, 1 << 12)]),
        (
            "inputs",
            Annotated[
                list[tuple[Annotated[int, "sizes"], Annotated[int, "buffers"]]], (0, 1 << 12)
            ],
        ),
    ],
)
Device = NamedTuple("Device", [("identity", Text), ("name", Text)])
Manifest = NamedTuple(
    "Manifest",
    [
        ("format", Literal["netcl-capture"]),
        ("version", int),
        ("kind", Literal["capture", "step"]),
        ("created_ns", int),
        ("device", Device),
        ("sections", Annotated[list[Section], _MANY]),
        ("programs", Annotated[list[Program], _MANY]),
        ("buffers", Annotated[list[Buffer], _MANY]),
        ("launches", Annotated[list[Launch], _MANY]),
        ("commands", Annotated[list[Command], _MANY]),
        ("step", Step | None),
    ],
)


class _Error(Exception):
    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field}: {what}")


def _parse(hint: Any, value: Any, field: str, tables: dict[str, int]) -> Any:
    """``value`` (JSON data) as ``hint`` declares it, or :class:`_Error` naming the
    field; ``tables``: the length of each table read so far."""
    if (shape := _SHAPES.get(id(hint))) is None:  # the schema's hints live as long as it does
        shape = _SHAPES[id(hint)] = get_origin(hint), get_args(hint)
    origin, args = shape
    if origin is Annotated:
        found = _parse(args[0], value, field, tables)
        n, bounds = found if type(found) is int else len(found), args[1]
        least, most = (0, tables[bounds] - 1) if isinstance(bounds, str) else bounds
        if not least <= n <= most:
            raise _Error(
                field,
                f"{_short(found)}, expected {'a length ' * (found is not n)}from"
                f" {least} to {most}{f' (an index of {bounds})' * (type(bounds) is str)}",
            )
        return found
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:  # (every union of the schema has None)
            return None
        refused = []
        for arm in args:
            try:
                return _parse(arm, value, field, tables)
            except _Error as exc:
                refused.append(exc)
        raise refused[0]
    if origin is Literal and not (isinstance(value, str) and value in args):
        raise _Error(field, f"{_short(value)}, expected one of {', '.join(args)}")
    if origin in (list, tuple):
        if type(value) is not list or (origin is tuple and len(value) != len(args)):
            raise _Error(field, f"{_short(value)}, expected a list")
        return [
            _parse(args[0] if origin is list else args[i], v, f"{field}[{i}]", tables)
            for i, v in enumerate(value)
        ]
    if isinstance(hint, type) and issubclass(hint, tuple):  # a record (v1 sections: lists)
        fields = hint.__annotations__
        value = dict(zip(fields, value, strict=False)) if type(value) is list else value
        if not isinstance(value, dict):
            raise _Error(field, f"{_short(value)}, expected an object")
        found = {}
        for k, t in fields.items():
            found[k] = _parse(t, value.get(k), f"{field}.{k}" if field else k, tables)
            if k in _TABLES and field in ("", "step"):
                tables[k] = len(found[k])
        return hint(**found)
    if origin is None and type(value) is not hint and not (hint is float and type(value) is int):
        raise _Error(field, f"{_short(value)}, expected {hint.__name__}")
    return value


def _short(value: Any) -> str:
    return json.dumps(value)[:40] if value is not None else "missing"


def dump(value: Any) -> Any:
    """Records as JSON data (a field that is None left out: missing reads as None)."""
    if isinstance(value, tuple) and type(value) is not tuple:  # a record
        return {
            k: dump(v)
            for k, v in zip(type(value).__annotations__, value, strict=True)
            if v is not None
        }
    return [dump(v) for v in value] if isinstance(value, (list, tuple)) else value


def read(f: IO[bytes], path: str, size: int) -> Manifest:
    """The checked manifest of the open file ``f`` (``size`` bytes) at ``path``."""
    head = f.read(HEADER.size)
    magic, version, flags, offset, length, crc = HEADER.unpack(head.ljust(HEADER.size, b"\0"))
    for bad, what in (
        (len(head) < HEADER.size, f"{len(head)} bytes, shorter than the header"),
        (magic != MAGIC, f"it starts with {magic!r}, expected {MAGIC!r}"),
        (
            not 1 <= version <= FORMAT_VERSION or flags,
            f"format version {version} (flags "
            f"{flags}); this netcl-capture reads versions 1 to {FORMAT_VERSION}: load it with the "
            "netcl-capture that saved it, or a later one",
        ),
        (
            length > MAX_MANIFEST,
            f"its manifest claims {length} bytes, more than the "
            f"{MAX_MANIFEST} a saved capture can have: the header is damaged",
        ),
        (
            offset < HEADER_SIZE or offset + length > size,
            f"truncated: the manifest lies at "
            f"bytes {offset}..{offset + length} of a {size}-byte file",
        ),
    ):
        if bad:
            raise CaptureFileError(f"{path}: {'not a saved capture: ' * (magic != MAGIC)}{what}")
    f.seek(offset)
    data = f.read(length)
    try:
        if zlib.crc32(data) != crc:
            raise _Error("manifest", "its checksum does not match: the file is damaged")
        depth = deepest = 0  # counted first: deep nesting would exhaust the JSON parser
        for m in _BRACKET.finditer(_STRING.sub(b"", data)):
            deepest = max(deepest, depth := depth + (1 if m.group() in b"[{" else -1))
        if deepest > MAX_DEPTH:
            raise _Error("manifest", f"nested {deepest} deep, at most {MAX_DEPTH}")
        try:
            raw = _from_v1(json.loads(data)) if version == 1 else json.loads(data)
        except (
            ValueError,
            LookupError,
            TypeError,
            AttributeError,
            StopIteration,
            ArithmeticError,
        ) as exc:
            raise _Error("manifest", f"malformed ({type(exc).__name__}: {exc})") from None
        manifest: Manifest = _parse(Manifest, raw, "", {})
        if manifest.version != version:
            raise _Error("version", f"{manifest.version}, the header says {version}")
        _check(manifest, offset)
    except _Error as exc:
        raise CaptureFileError(f"{path}: {exc}") from None
    return manifest


def _check(m: Manifest, end: int) -> None:
    """What types cannot say: sections disjoint and inside the data, sub-buffers inside their
    parent, launch shapes, one value per argument, transfers' operands, the step's lengths."""
    last = HEADER_SIZE
    for i, s in sorted(enumerate(m.sections), key=lambda x: x[1].start):
        if s.start < last or s.start + s.size > end:
            raise _Error(
                f"sections[{i}]",
                f"bytes {s.start}..{s.start + s.size} overlap "
                f"another section or lie outside the data ({HEADER_SIZE}..{end})",
            )
        last = s.start + s.size
    for i, b in enumerate(m.buffers):
        if b.parent is not None and (b.parent >= i or b.origin + b.size > m.buffers[b.parent].size):
            raise _Error(
                f"buffers[{i}].parent",
                f"buffer {b.parent} does not hold bytes "
                f"{b.origin}..{b.origin + b.size} before buffer {i}",
            )
        if b.data is not None and m.sections[b.data].size != b.size:
            raise _Error(f"buffers[{i}].data", f"section {b.data} is not {b.size} bytes")
    for i, launch in enumerate(m.launches):
        _check_launch(m, launch, f"launches[{i}]")
    for i, c in enumerate(m.commands):
        entry, _ = contract.SAVED.get(c.op, (None, None))
        ops = entry.operands if entry else ()
        if [
            c.op == "launch",
            len(c.buffers or ()),
            len(c.offsets or ()),
            c.host is not None,
            c.count is not None,
            c.pattern is not None,
        ] != [
            c.launch is not None,
            len(ops),
            len(ops),
            bool(ops and ops[0].host),
            bool(ops and ops[-1].count),
            c.op == "fill",
        ] or not _HEX.fullmatch(c.pattern or ""):
            raise _Error(f"commands[{i}]", f"{_short(dump(c))}: not a {c.op}")
        count = m.sections[c.host].size if c.host is not None else c.count or 0
        for j, (k, offset) in enumerate(zip(c.buffers or (), c.offsets or (), strict=True)):
            if offset + count > m.buffers[k].size:
                raise _Error(
                    f"commands[{i}].offsets[{j}]",
                    f"{offset} + {count} bytes lie outside buffer {k} ({m.buffers[k].size} bytes)",
                )
    if (step := m.step) and (
        len(step.labels) != len(step.params)
        or len(step.keywords or ()) > len(step.params)
        or len(step.aliasing or step.sizes) != len(step.sizes)
        or len(step.sizes) != sum(p.kind in ("Tensor", "Array") for p in step.params)
    ):
        raise _Error("step", "its labels, params, keywords, aliasing and sizes disagree")


def _check_launch(m: Manifest, launch: Launch, at: str) -> None:
    gsize, lsize = launch.global_size, launch.local_size
    if launch.kernel not in m.programs[launch.program].kernels:
        raise _Error(f"{at}.kernel", f"{launch.kernel!r} is not a kernel of its program")
    if not (all(gsize) or launch.allow_empty):
        raise _Error(f"{at}.global_size", f"{gsize}: a size 0 without allow_empty")
    for name, dims in (("local_size", lsize), ("offset", launch.offset)):
        if dims is not None and len(dims) != len(gsize):
            raise _Error(f"{at}.{name}", f"{dims} for a {len(gsize)}-dimensional launch")
    if lsize is not None and any(not ls or g % ls for g, ls in zip(gsize, lsize, strict=True)):
        raise _Error(f"{at}.local_size", f"{lsize} does not divide {gsize}")
    for j, a in enumerate(launch.args):
        if sum(v is not None for v in (a.buffer, a.scalar, a.local)) > 1:
            raise _Error(f"{at}.args[{j}]", "more than one of buffer, scalar, local")
        if a.scalar and (
            a.scalar.dtype not in SCALARS
            or not _HEX.fullmatch(a.scalar.hex)
            or len(a.scalar.hex) != 2 * np.dtype(a.scalar.dtype).itemsize
        ):
            raise _Error(
                f"{at}.args[{j}].scalar",
                f"{_short(dump(a.scalar))}: not the "
                f"hex of one value of a dtype of {', '.join(sorted(SCALARS))}",
            )


def _from_v1(m: dict[str, Any]) -> dict[str, Any]:
    """A version-1 manifest in version 2's words: arguments by their value (not pyopencl's
    setter), transfers by their word, pyopencl's include folder symbolic."""
    words = {e.name: (word, e) for word, (e, _) in contract.SAVED.items()}
    launches = [
        {
            **s,
            "global_size": s["global"],
            "local_size": s["local"],
            "args": [_v1_arg(*a) for a in s["args"]],
        }
        for s in m["shapes"]
    ]
    commands = [
        {"op": c[0], "launch": c[1]}
        if c[0] == "launch"
        else {"op": c[0]}
        if c[0] != "transfer"
        else transfer(
            words[c[1]][1],
            dict(zip(words[c[1]][1].params, c[2], strict=False), **c[3]),
            lambda v: v["buffer"],
            lambda v: v["array"],
            lambda v: v["hex"],
        )
        for c in m["commands"]
    ]
    programs = [
        {**p, "options": re.sub(r"\S*[/\\]pyopencl[/\\]cl(?=\s|$)", INCLUDE, p["options"])}
        for p in m["programs"]
    ]
    return {**m, "launches": launches, "commands": commands, "programs": programs}


def _v1_arg(index: Any, _setter: Any, payload: dict[str, Any]) -> dict[str, Any]:
    items = payload["tuple"]  # (index, value), ((index, value),), ((index, code, value),)
    parts = items[0]["tuple"] if isinstance(items[0], dict) else items
    value: Any = parts[-1] if len(parts) > 1 else None
    if len(parts) == 3 and not isinstance(value, dict):  # a struct code and a number
        dtype = np.dtype(bytes.fromhex(parts[1]["bytes"]).decode())
        value = {"scalar": dtype.str, "hex": np.array(value, dtype).tobytes().hex()}
    kind, found = next(iter(value.items())) if value is not None else ("index", index)
    if kind not in ("buffer", "scalar", "local", "index"):
        raise ValueError(f"argument {index} is a {kind}")
    return {
        "index": index,
        kind: {"dtype": found, "hex": value["hex"]} if kind == "scalar" else found,
    }


def transfer(
    entry: contract.EntryPoint,
    bound: dict[str, Any],
    buffer: Callable[[Any], int],
    host: Callable[[Any], int],
    pattern: Callable[[Any], str],
) -> dict[str, Any]:
    """A transfer as a command, from its arguments by pyopencl's parameter names: ``buffer``,
    ``host`` and ``pattern`` make a memory object, a host array and a fill's pattern a buffer
    index, a section and hex."""
    ops = entry.operands
    found: dict[str, Any] = {
        "op": entry.word,
        "buffers": [buffer(bound[o.mem]) for o in ops],
        "offsets": [int(bound.get(o.offset) or 0) for o in ops],
    }
    if ops and ops[-1].count:
        found["count"] = int(bound[ops[-1].count])
    if ops and ops[0].host:
        found["host"] = host(bound[ops[0].host])
    if "pattern" in bound:
        found["pattern"] = pattern(bound["pattern"])
    return found


def symbolic(options: str, where: str) -> str:
    """Build options with pyopencl's include folder as ``{pyopencl}``; any other absolute path
    is refused (another machine does not have it)."""
    found = options.replace(PYOPENCL, INCLUDE)
    if path := re.search(r"(?:^|\s|-I|=)([/\\~]\S*|[A-Za-z]:\\\S*)", found):
        raise CaptureFileError(
            f"{where}: a program's build options name {path[1]!r}, a path of "
            "this machine, which another machine does not have: build with "
            "the headers inlined in the source, or their folder relative"
        )
    return found
