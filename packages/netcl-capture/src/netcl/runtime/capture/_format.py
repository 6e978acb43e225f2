"""The saved format's manifest, declared once: typed records with each field's type and bounds
(an index names the table it points into). Saving writes them; loading, ``load_step`` and
``netcl capture inspect`` read them through one parser that refuses a file by its field
(``launches[3].local_size``), then :func:`_check` checks what types cannot say, each refusal
naming its field too (``commands[4].buffers: [6], expected 2 for a copy``). The guide publishes
these records as the manifest's schema, generated from this module's source by the docs build
(``docs/_hooks/manifest_schema.py``).

The words are netcl's own, defined here once for the saving, loading and step modules: a
buffer's role (``Role``), a step value's kind (``Kind``), a launch argument (a buffer, a scalar
of a dtype of ``SCALARS``, local memory or None), a command (a launch, a finish or a transfer
named by its word in ``netcl.core.contract``: write, read, copy, fill, marker, barrier);
pyopencl's include folder in build options is ``{pyopencl}``. Version 1 manifests are read into
the same records.

Why a parser of our own and not msgspec (``Struct`` with ``Meta`` bounds, which decodes JSON into
classes in C, names the failing path and generates a JSON Schema). Measured on a real manifest
(a step of 2,000 launches, 480 kB of JSON, on the 2-core PoCL machine, 2026-12-07): msgspec
decodes it into equivalent structs in 2.6 ms; ``json.loads`` (5 ms), this parser and ``_check``
take 69 ms (112 ms before this module's rewrite), of a 129 ms ``load_step`` (175 ms before).
msgspec would be the faster choice for steps of many thousands of launches; it is not used
because it cannot say "an index into that table", the records' most common bound (those checks
would move into ``_check``, written by hand field by field), its messages (``Expected `int` >=
0 - at `$.launches[0].global_size[0]```) would be rewritten into ours, and netcl-capture would
gain a compiled runtime dependency for every user, where a typical step's manifest (tens of
launches) parses in under a millisecond. The parser is about 60 lines; the schema is published
from the same records either way.
"""

import json
import os
import re
import struct
import types
import zlib
from collections.abc import Callable
from itertools import accumulate
from operator import itemgetter
from typing import IO, Annotated, Any, Literal, NamedTuple, TypeAlias, Union, get_args, get_origin

import numpy as np
import pyopencl as cl

from netcl.core import contract

FORMAT_VERSION = 2  # what this release writes; it reads every version up to it
MAGIC, HEADER, HEADER_SIZE = b"NETCLCAP", struct.Struct("<8sIIQQI"), 64
MAX_MANIFEST, MAX_DEPTH = 64 << 20, 16  # no manifest we write comes near either
INCLUDE, PYOPENCL = "{pyopencl}", os.path.join(os.path.dirname(cl.__file__), "cl")
SCALARS = frozenset(np.dtype(c).str for c in "?bBhHiIlLqQefdFD")  # a scalar argument's dtypes
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = [1 if c in b"[{" else -1 for c in range(256)]  # a bracket's step in depth
_HEX, _MANY = re.compile("(?:[0-9a-f]{2})*"), (0, 1 << 24)  # _MANY: a table's rows
_TABLES = ("sections", "programs", "buffers", "launches", "params", "sizes")  # indices name them
_SHAPES: dict[int, tuple[Any, tuple[Any, ...], bool]] = {}
# what the JSON parser and the version-1 rewrite raise for a malformed manifest
_MALFORMED = (ValueError, LookupError, TypeError, AttributeError, StopIteration, ArithmeticError)


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

# The vocabulary: a buffer's role, a step value's kind, a plain value's type
Role: TypeAlias = Literal["input", "output", "constant", "scratch"]
INPUT, OUTPUT, CONSTANT, SCRATCH = get_args(Role)
Kind: TypeAlias = Literal["Tensor", "Array", "value", "arg", "fixed", "slot"]
TENSOR, ARRAY, VALUE, ARG, FIXED, SLOT = get_args(Kind)
VALUE_TYPES: dict[str, type] = {t.__name__: t for t in (int, float, bool, str, type(None))}
_PLAIN = frozenset(VALUE_TYPES.values())  # what JSON's scalars parse as (None: a union's arm)
Op: TypeAlias = Literal["launch", "finish", "write", "read", "copy", "fill", "marker", "barrier"]
# the flags a file's buffer may have (what pyopencl's other flags say concerns the host's memory)
FLAGS = int(
    cl.mem_flags.READ_WRITE
    | cl.mem_flags.READ_ONLY
    | cl.mem_flags.WRITE_ONLY
    | cl.mem_flags.HOST_WRITE_ONLY
    | cl.mem_flags.HOST_READ_ONLY
    | cl.mem_flags.HOST_NO_ACCESS
)


class Section(NamedTuple):
    """Bytes of the file: where they start, how many, their CRC-32."""

    start: Bytes
    size: Bytes
    crc: Annotated[int, (0, (1 << 32) - 1)]


class Program(NamedTuple):
    """A program: its binary for the saving device and its source (sections, either may be
    missing), its build options, the kernels the file launches from it."""

    binary: Annotated[int, "sections"] | None
    options: Text
    source: Annotated[int, "sections"] | None
    kernels: Names


class Scalar(NamedTuple):
    """One number: its dtype (numpy's ``str``, one of ``SCALARS``) and its bytes in hex."""

    dtype: Name
    hex: Annotated[str, (2, 32)]


class Arg(NamedTuple):
    """A kernel argument: one of a buffer, a scalar, local memory (its bytes), or none of them
    (None)."""

    index: Annotated[int, (0, 1 << 12)]  # type: ignore[assignment] # the file's name
    buffer: Annotated[int, "buffers"] | None = None
    scalar: Scalar | None = None
    local: Size | None = None


class Launch(NamedTuple):
    """A kernel launch's shape: the kernel, its sizes and its arguments."""

    program: Annotated[int, "programs"]
    kernel: Name
    global_size: Dims
    args: Annotated[list[Arg], (0, 1 << 12)]
    local_size: Dims | None = None
    offset: Dims | None = None
    allow_empty: bool = False


class Command(NamedTuple):
    """A launch, a finish, or a transfer over buffers (one; a copy's source then destination)
    at offsets: count bytes, or a host array (a section), or a fill's pattern (hex)."""

    op: Op
    launch: Annotated[int, "launches"] | None = None
    buffers: Annotated[list[Annotated[int, "buffers"]], (0, 2)] | None = None
    offsets: Annotated[list[Bytes], (0, 2)] | None = None
    count: Bytes | None = None  # type: ignore[assignment] # (shadows tuple.count)
    host: Annotated[int, "sections"] | None = None
    pattern: Annotated[str, (2, 256)] | None = None


class Buffer(NamedTuple):
    """A buffer: its size, flags (of ``FLAGS``), role, contents (a section), and for a
    sub-buffer its parent (an earlier buffer) and its origin in it."""

    size: Size
    flags: Bytes
    role: Role
    data: Annotated[int, "sections"] | None = None
    parent: Annotated[int, (0, 1 << 31)] | None = None
    origin: Bytes = 0


class Value(NamedTuple):
    """A step's argument or output: a Tensor or Array (its fields), a value, the argument
    ``index``, a Tensor or Array on the file's ``buffer`` or on argument ``slot``'s buffer."""

    kind: Kind
    type: Literal["Tensor", "Array", "int", "float", "bool", "str", "NoneType"] | None = None
    shape: Annotated[list[Bytes], (0, 32)] | None = None
    dtype: Name | None = None
    strides: Annotated[list[int], (0, 32)] | None = None
    offset: Bytes | None = None
    value: int | float | bool | Text | None = None
    index: Annotated[int, "params"] | None = None  # type: ignore[assignment]
    buffer: Annotated[int, "buffers"] | None = None
    slot: Annotated[int, "sizes"] | None = None


class Step(NamedTuple):
    """A step's call: its name, its arguments (a label and a value each, the last ones
    keywords), the sizes and aliasing of its buffer arguments, its outputs and how they are
    returned, and which buffer of the file stands in for each buffer argument."""

    name: Text
    labels: Names
    params: Annotated[list[Value], (0, 1 << 12)]
    keywords: Names | None
    sizes: Annotated[list[Bytes], (0, 1 << 12)]
    aliasing: Annotated[list[Annotated[int, "sizes"]], (0, 1 << 12)] | None
    result: Literal["none", "single", "tuple", "list"]
    outputs: Annotated[list[Value], (0, 1 << 12)]
    inputs: Annotated[list[tuple[Annotated[int, "sizes"], Annotated[int, "buffers"]]], (0, 1 << 12)]


class Device(NamedTuple):
    """The saving device: its identity (``device_identity``) and name."""

    identity: Text
    name: Text


class Manifest(NamedTuple):
    """The manifest: what the file is, the saving device, the tables (in the order their
    indices are read), and a step's call."""

    format: Literal["netcl-capture"]
    version: int
    kind: Literal["capture", "step"]
    created_ns: int
    device: Device
    sections: Annotated[list[Section], _MANY]
    programs: Annotated[list[Program], _MANY]
    buffers: Annotated[list[Buffer], _MANY]
    launches: Annotated[list[Launch], _MANY]
    commands: Annotated[list[Command], _MANY]
    step: Step | None = None


class _Error(Exception):
    """A refused field: ``at`` its path (``launches[3].local_size``), ``what`` is wrong. The
    parser builds the path on the way out, so a file that parses builds none."""

    def __init__(self, at: str, what: str) -> None:
        self.at, self.what = at, what

    def __str__(self) -> str:
        return f"{self.at.removeprefix('.')}: {self.what}"


def _parse(hint: Any, value: Any, tables: dict[str, int]) -> Any:
    """``value`` (JSON data) as ``hint`` declares it, or :class:`_Error` naming the field;
    ``tables``: the length of each table read so far."""
    if (shape := _SHAPES.get(id(hint))) is None:  # the schema's hints live as long as it does
        shape = _SHAPES[id(hint)] = get_origin(hint), get_args(hint), hint in _PLAIN
    origin, args, plain = shape
    if plain:  # (the most frequent: first)
        if type(value) is not hint and not (hint is float and type(value) is int):
            raise _Error("", f"{_short(value)}, expected {hint.__name__}")
        return value
    if origin is Annotated:
        found = _parse(args[0], value, tables)
        n, bounds = found if type(found) is int else len(found), args[1]
        if isinstance(bounds, str):  # an index into a table
            least, most, table = 0, tables[bounds] - 1, f" (an index of {bounds})"
        else:  # a number's bounds, or a text's or list's length
            (least, most), table = bounds, ""
        if not least <= n <= most:
            length = "" if type(found) is int else "a length "
            raise _Error("", f"{_short(found)}, expected {length}from {least} to {most}{table}")
        return found
    if origin is Union or origin is types.UnionType:
        if value is None:  # (every union of the schema is one with None)
            return None
        refused = []
        for arm in args:
            try:
                return _parse(arm, value, tables)
            except _Error as exc:
                refused.append(exc)
        raise refused[0]
    if origin is Literal:
        if not (isinstance(value, str) and value in args):
            raise _Error("", f"{_short(value)}, expected one of {', '.join(args)}")
        return value
    if origin is list or origin is tuple:
        if type(value) is not list or (origin is tuple and len(value) != len(args)):
            raise _Error("", f"{_short(value)}, expected a list")
        found = []
        for i, v in enumerate(value):
            try:
                found.append(_parse(args[0] if origin is list else args[i], v, tables))
            except _Error as exc:
                exc.at = f"[{i}]{exc.at}"
                raise
        return found
    fields = hint.__annotations__  # a record (a version-1 section: a list of its fields)
    value = dict(zip(fields, value, strict=False)) if type(value) is list else value
    if not isinstance(value, dict):
        raise _Error("", f"{_short(value)}, expected an object")
    found = {}
    for k, t in fields.items():
        try:
            found[k] = _parse(t, value.get(k), tables)
        except _Error as exc:
            exc.at = f".{k}{exc.at}"
            raise
        if k in _TABLES and (hint is Manifest or hint is Step):  # read before their indices
            tables[k] = len(found[k])
    return hint(**found)


def _short(value: Any) -> str:
    return json.dumps(value)[:40] if value is not None else "missing"


def dump(value: Any) -> Any:
    """Records as JSON data (a field that is None left out: missing reads as None)."""
    if isinstance(value, tuple) and type(value) is not tuple:  # a record
        fields = zip(type(value).__annotations__, value, strict=True)
        return {k: dump(v) for k, v in fields if v is not None}
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    return value


def read(f: IO[bytes], path: str, size: int) -> Manifest:
    """The checked manifest of the open file ``f`` (``size`` bytes) at ``path``."""
    head = f.read(HEADER.size)
    _, version, _, offset, length, crc = HEADER.unpack(head.ljust(HEADER.size, b"\0"))
    if refused := _refused_header(head, size):
        raise CaptureFileError(f"{path}: {refused}")
    f.seek(offset)
    data = f.read(length)
    try:
        if zlib.crc32(data) != crc:
            raise _Error("manifest", "its checksum does not match: the file is damaged")
        # counted first: deep nesting would exhaust the JSON parser
        brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
        deepest = max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
        if deepest > MAX_DEPTH:
            raise _Error("manifest", f"nested {deepest} deep, at most {MAX_DEPTH}")
        try:
            raw = _from_v1(json.loads(data)) if version == 1 else json.loads(data)
        except _MALFORMED as exc:
            raise _Error("manifest", f"malformed ({type(exc).__name__}: {exc})") from None
        manifest: Manifest = _parse(Manifest, raw, {})
        if manifest.version != version:
            raise _Error("version", f"{manifest.version}, the header says {version}")
        _check(manifest, offset)
    except _Error as exc:
        raise CaptureFileError(f"{path}: {exc}") from None
    return manifest


def _refused_header(head: bytes, size: int) -> str:
    """What is wrong with a file's header ("" if nothing), of a file of ``size`` bytes."""
    magic, version, flags, offset, length, _ = HEADER.unpack(head.ljust(HEADER.size, b"\0"))
    if len(head) < HEADER.size:
        what = f"{len(head)} bytes, shorter than the header"
    elif magic != MAGIC:
        what = f"it starts with {magic!r}, expected {MAGIC!r}"
    elif not 1 <= version <= FORMAT_VERSION or flags:
        what = (
            f"format version {version} (flags {flags}); this netcl-capture reads versions 1 to "
            f"{FORMAT_VERSION}: load it with the netcl-capture that saved it, or a later one"
        )
    elif length > MAX_MANIFEST:
        what = (
            f"its manifest claims {length} bytes, more than the {MAX_MANIFEST} a saved capture "
            "can have: the header is damaged"
        )
    elif offset < HEADER_SIZE or offset + length > size:
        what = (
            f"truncated: the manifest lies at bytes {offset}..{offset + length} of a "
            f"{size}-byte file"
        )
    else:
        return ""
    return f"not a saved capture: {what}" if magic != MAGIC else what


def _check(m: Manifest, end: int) -> None:
    """What types cannot say: sections disjoint and inside the data, buffers' flags and
    sub-buffers inside their parent, build options, launch shapes, one value per argument,
    commands' fields and operands, the step's lengths."""
    last = HEADER_SIZE
    for i, s in sorted(enumerate(m.sections), key=lambda x: x[1].start):
        if s.start < last or s.start + s.size > end:
            raise _Error(
                f"sections[{i}]",
                f"bytes {s.start}..{s.start + s.size} overlap another section or lie outside "
                f"the data ({HEADER_SIZE}..{end})",
            )
        last = s.start + s.size
    for i, b in enumerate(m.buffers):
        _check_buffer(m, b, f"buffers[{i}]", i)
    for i, p in enumerate(m.programs):
        if refused := _absolute(p.options):
            raise _Error(f"programs[{i}].options", refused)
    for i, launch in enumerate(m.launches):
        _check_launch(m, launch, f"launches[{i}]")
    for i, c in enumerate(m.commands):
        _check_command(m, c, f"commands[{i}]")
    if m.step is not None:
        _check_step(m.step)


def _check_buffer(m: Manifest, b: Buffer, at: str, i: int) -> None:
    if b.flags & ~FLAGS:
        raise _Error(
            f"{at}.flags",
            f"{b.flags} has bits {b.flags & ~FLAGS:#x} of no flag a saved buffer has "
            f"(the access flags, {FLAGS:#x})",
        )
    if b.parent is not None and b.parent >= i:
        raise _Error(f"{at}.parent", f"{b.parent}, expected a buffer before buffer {i}")
    if b.parent is not None and b.origin + b.size > m.buffers[b.parent].size:
        raise _Error(
            f"{at}.parent",
            f"buffer {b.parent} ({m.buffers[b.parent].size} bytes) does not hold bytes "
            f"{b.origin}..{b.origin + b.size}",
        )
    if b.data is not None and m.sections[b.data].size != b.size:
        raise _Error(f"{at}.data", f"section {b.data} is not {b.size} bytes")


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
                f"{_short(dump(a.scalar))}: not the hex of one value of a dtype of "
                f"{', '.join(sorted(SCALARS))}",
            )


def _check_command(m: Manifest, c: Command, at: str) -> None:
    """A command's fields as its op has them (a transfer's as netcl.core.contract says)."""
    ops = contract.SAVED[c.op][0].operands if c.op in contract.SAVED else ()
    wanted = {  # field: whether this op has it
        "launch": c.op == "launch",
        "host": bool(ops and ops[0].host),
        "count": bool(ops and ops[-1].count),
        "pattern": c.op == "fill",
    }
    for name, has in wanted.items():
        if (value := getattr(c, name)) is None and has:
            raise _Error(f"{at}.{name}", f"missing, which a {c.op} has")
        if value is not None and not has:
            raise _Error(f"{at}.{name}", f"{_short(value)}, which a {c.op} does not have")
    for name in ("buffers", "offsets"):
        if len(getattr(c, name) or ()) != len(ops):
            raise _Error(
                f"{at}.{name}", f"{_short(getattr(c, name))}, expected {len(ops)} for a {c.op}"
            )
    if c.pattern is not None and not _HEX.fullmatch(c.pattern):
        raise _Error(f"{at}.pattern", f"{_short(c.pattern)}, expected hex")
    count = m.sections[c.host].size if c.host is not None else c.count or 0
    for j, (k, offset) in enumerate(zip(c.buffers or (), c.offsets or (), strict=True)):
        if offset + count > m.buffers[k].size:
            raise _Error(
                f"{at}.offsets[{j}]",
                f"{offset} + {count} bytes lie outside buffer {k} ({m.buffers[k].size} bytes)",
            )


def _check_step(step: Step) -> None:
    params, keywords = len(step.params), len(step.keywords or ())
    buffers = sum(p.kind in (TENSOR, ARRAY) for p in step.params)
    if len(step.labels) != params:
        raise _Error("step.labels", f"{len(step.labels)} labels for {params} params")
    if keywords > params:
        raise _Error("step.keywords", f"{keywords} keywords for {params} params")
    if len(step.sizes) != buffers:
        raise _Error("step.sizes", f"{len(step.sizes)} sizes for {buffers} Tensors and Arrays")
    if step.aliasing and len(step.aliasing) != buffers:
        raise _Error("step.aliasing", f"{len(step.aliasing)} for {buffers} Tensors and Arrays")


def _from_v1(m: dict[str, Any]) -> dict[str, Any]:
    """A version-1 manifest in version 2's words: arguments by their value (not pyopencl's
    setter), transfers by their word, pyopencl's include folder symbolic."""
    for s in m["shapes"]:  # the launches, in version 2's names
        s |= {
            "global_size": s["global"],
            "local_size": s["local"],
            "args": [_v1_arg(*a) for a in s["args"]],
        }
    for p in m["programs"]:
        p["options"] = re.sub(r"\S*[/\\]pyopencl[/\\]cl(?=\s|$)", INCLUDE, p["options"])
    commands = [_v1_command(c) for c in m["commands"]]
    return {**m, "launches": m["shapes"], "commands": commands}


def _v1_command(c: list[Any]) -> dict[str, Any]:
    """A version-1 command: ["launch", shape], ["finish"], or ["transfer", pyopencl's
    function, its positional arguments, its keyword arguments]."""
    if c[0] == "launch":
        return {"op": c[0], "launch": c[1]}
    if c[0] != "transfer":
        return {"op": c[0]}
    (entry,) = [e for e, _ in contract.SAVED.values() if e.name == c[1]]
    bound = dict(zip(entry.params, c[2], strict=False), **c[3])
    return transfer(entry, bound, itemgetter("buffer"), itemgetter("array"), itemgetter("hex"))


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
    if kind == "scalar":
        found = {"dtype": found, "hex": value["hex"]}
    return {"index": index, kind: found}  # an index alone: set to None (no value)


def transfer(
    entry: contract.EntryPoint,
    bound: dict[str, Any],
    buffer: Callable[[Any], int],
    host: Callable[[Any], int],
    pattern: Callable[[Any], str],
) -> dict[str, Any]:
    """A transfer as a command's fields, from its arguments by pyopencl's parameter names:
    ``buffer``, ``host`` and ``pattern`` make a memory object, a host array and a fill's
    pattern a buffer index, a section and hex."""
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


# an absolute path in build options: alone, after "=" or a quote, or glued to its option (-I/x)
_PATH = re.compile(r"""(?:^|[\s="']|-[A-Za-z]+)([/\\~]\S*|[A-Za-z]:\\\S*)""")


def _absolute(options: str) -> str:
    """Why ``options`` cannot be saved or loaded: the first absolute path they name ("" if
    none)."""
    if not (found := _PATH.search(options)):
        return ""
    return (
        f"name {found[1]!r}, an absolute path, which another machine need not have: build with "
        "the headers inlined in the source, or their folder relative"
    )


def symbolic(options: str, where: str) -> str:
    """Build options with pyopencl's include folder as ``{pyopencl}``; any other absolute path
    is refused (another machine does not have it)."""
    found = options.replace(PYOPENCL, INCLUDE)
    if refused := _absolute(found):
        raise CaptureFileError(f"{where}: a program's build options {refused}")
    return found
