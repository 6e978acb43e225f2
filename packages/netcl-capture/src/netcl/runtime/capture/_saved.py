"""Saved captures: a capture's programs, commands and buffers in a file that another process
loads without the code that recorded it. The format is data only, never pickle (guide, "Saved
steps"), little-endian:

* a 64-byte header: ``NETCLCAP``, the format version (u32), flags (u32, 0), the manifest's
  offset and length (u64 each) and its CRC-32 (u32);
* sections: raw bytes at 64-byte aligned offsets (program binaries and sources, the contents of
  constant buffers, host arrays of recorded transfers), each with a CRC-32;
* the manifest, last: UTF-8 JSON naming the device, programs, buffers (size, flags, role),
  commands and sections, and for a step its call signature and outputs.

Loading checks the header, the manifest and every section's bounds and checksum before anything
from them reaches the driver, and streams buffer contents through two bounded staging buffers.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import pyopencl as cl

from netcl.core import contract, device
from netcl.core.device import device_identity
from netcl.core.log import get_logger
from netcl.runtime.capture import _telemetry as tm
from netcl.runtime.capture._program import ReplayProgram, build
from netcl.runtime.capture._recording import (
    ArgSet,
    LaunchShape,
    Op,
    RawFinish,
    RawLaunch,
    RawTransfer,
    Recording,
    launch_sizes,
)

__all__ = ["FORMAT_VERSION", "CaptureFileError", "Loaded", "inspect", "load", "save"]

FORMAT_VERSION = 1
_MAGIC = b"NETCLCAP"
_HEADER = struct.Struct("<8sIIQQI")
_HEADER_SIZE = 64
_ALIGN = 64
_MAX_MANIFEST = 64 << 20  # a manifest beyond this is not one we wrote
_CHUNK = 16 << 20  # staging buffer size: what saving or loading holds of a buffer in host memory
_FLAGS = int(cl.mem_flags.READ_WRITE | cl.mem_flags.READ_ONLY | cl.mem_flags.WRITE_ONLY
             | cl.mem_flags.HOST_WRITE_ONLY | cl.mem_flags.HOST_READ_ONLY
             | cl.mem_flags.HOST_NO_ACCESS)  # fmt: skip
# the pyopencl functions a file may name, by name: setters, and the transfers a file can hold
_ALLOWED = {e.name: e for e, _, _ in contract.BOUND
            if e.kind in ("setter", "setter_pairs", "setter_triples", "order")
            or e.name in ("_enqueue_read_buffer", "_enqueue_write_buffer",
                          "_enqueue_copy_buffer", "_enqueue_fill_buffer")}  # fmt: skip
_NAMES = {id(obj): e.name for e, _, obj in contract.BOUND if e.name in _ALLOWED}
# transfers whose first operand they overwrite whole (then the buffer's contents are not saved)
_WRITES = {"_enqueue_write_buffer": "mem", "_enqueue_copy_buffer": "dst",
           "_enqueue_fill_buffer": "mem"}  # fmt: skip

log = get_logger("netcl.runtime.capture")

INPUT, OUTPUT, CONSTANT, SCRATCH = "input", "output", "constant", "scratch"


class CaptureFileError(ValueError):
    """A saved capture that cannot be written or loaded; the message names the file and what
    is wrong with it."""


class Loaded(NamedTuple):
    """A loaded file: the replay form, the buffers in the file's order, its manifest."""

    program: ReplayProgram
    buffers: list[cl.Buffer]
    manifest: dict[str, Any]


# -- saving -----------------------------------------------------------------------------------
class _Writer:
    """Sections appended to a file being written, with their offsets and checksums."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.pos = _HEADER_SIZE
        self.sections: list[list[int]] = []
        f.write(bytes(_HEADER_SIZE))

    def add(self, chunks: Iterator[Any] | bytes) -> int:
        """Write one section (bytes, or chunks of it); its index."""
        pad = -self.pos % _ALIGN
        self.f.write(bytes(pad))
        start = self.pos = self.pos + pad
        crc = 0
        for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
            crc = zlib.crc32(chunk, crc)
            self.f.write(chunk)
            self.pos += len(memoryview(chunk).cast("B"))
        self.sections.append([start, self.pos - start, crc])
        return len(self.sections) - 1

    def finish(self, manifest: dict[str, Any]) -> None:
        manifest["sections"] = self.sections
        data = json.dumps(manifest, separators=(",", ":")).encode()
        offset = self.pos
        self.f.write(data)
        self.f.seek(0)
        self.f.write(_HEADER.pack(_MAGIC, FORMAT_VERSION, 0, offset, len(data), zlib.crc32(data)))


class _Encoder:
    """Turns recorded values into JSON data: buffers by their index in the buffer table, host
    arrays as sections; anything else a file cannot hold is refused by name."""

    def __init__(self, writer: _Writer, queue: cl.CommandQueue, where: str) -> None:
        self.writer, self.queue, self.where = writer, queue, where
        self.buffers: dict[int, tuple[int, cl.MemoryObjectHolder]] = {}  # int_ptr -> (i, buffer)
        self.parents: dict[int, tuple[int, int]] = {}  # sub-buffer int_ptr -> (parent, origin)

    def buffer(self, mem: cl.MemoryObjectHolder) -> int:
        ptr = contract.mem_ptr(mem)
        if (found := self.buffers.get(ptr)) is None:
            if mem.get_info(cl.mem_info.TYPE) != cl.mem_object_type.BUFFER:
                raise CaptureFileError(f"{self.where}: the capture uses an image (a "
                                       f"{type(mem).__name__}); only buffers can be saved")
            parent = mem.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)
            if parent is not None:  # a sub-buffer stays one: a region of its saved parent
                self.parents[ptr] = (self.buffer(parent), int(mem.get_info(cl.mem_info.OFFSET)))
            found = self.buffers[ptr] = (len(self.buffers), mem)
        return found[0]

    def __call__(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (tuple, list)):
            items = [self(v) for v in value]
            return {"tuple": items} if isinstance(value, tuple) else items
        if isinstance(value, cl.MemoryObjectHolder):
            return {"buffer": self.buffer(value)}
        if isinstance(value, cl.CommandQueue):
            if value != self.queue:
                raise CaptureFileError(f"{self.where}: the capture uses more than one queue; "
                                       "only a capture on one in-order queue can be saved")
            return {"queue": 0}
        if isinstance(value, cl.LocalMemory):
            return {"local": int(value.size)}
        if isinstance(value, np.generic):
            return {"scalar": _dtype_text(value.dtype), "hex": value.tobytes().hex()}
        if isinstance(value, np.ndarray):
            data = np.ascontiguousarray(value)
            return {"array": self.writer.add(data.view(np.uint8).reshape(-1).data.tobytes()),
                    "dtype": _dtype_text(value.dtype), "shape": list(value.shape)}
        if isinstance(value, (bytes, bytearray, memoryview)):
            return {"bytes": bytes(value).hex()}
        raise CaptureFileError(f"{self.where}: a recorded argument is a {type(value).__name__} "
                               f"({value!r:.60}), which a file cannot hold")  # fmt: skip


def _dtype_text(dtype: np.dtype[Any]) -> Any:
    return dtype.str if dtype.fields is None else np.lib.format.dtype_to_descr(dtype)


def save(path: str | os.PathLike[str], program: ReplayProgram, *, kind: str,
         roles: Sequence[tuple[str, cl.MemoryObjectHolder]] = (),
         step: dict[str, Any] | None = None) -> int:  # fmt: skip
    """Write ``program`` to ``path`` (atomically: a new file replaces the old one at the end).
    ``roles``: (INPUT or OUTPUT, buffer) of a step's argument and output buffers, which become
    the first buffers of the file's table, in this order (the rest are constants or scratch);
    ``step``: a step's signature and outputs. Returns the file's size in bytes."""
    where = f"save({os.fspath(path)!r})"
    queues = {contract.queue_ptr(op.queue): op.queue for op in program.ops}
    if len(queues) > 1 or program.plan is not None:
        raise CaptureFileError(f"{where}: the capture uses {len(queues)} queues (or an "
                               "out-of-order queue); only a capture on one in-order queue can "
                               "be saved")  # fmt: skip
    if program.opaque_launches:
        raise CaptureFileError(f"{where}: kernels {sorted(program.opaque_launches)} were "
                               "launched with arguments set before begin(), which the capture "
                               "does not know: pass the arguments in the call")  # fmt: skip
    if not program.ops:
        raise CaptureFileError(f"{where}: the capture is empty")
    queue = next(iter(queues.values()))
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    start = time.time_ns()
    with tm.TEL.span(tm.SAVE_SPAN, {tm.FILE: str(target)}) as span:
        contract.finish(queue)  # the contents saved are those after the recorded commands ran
        try:
            with open(partial, "wb") as f:
                writer = _Writer(f)
                manifest = _manifest(writer, program, queue, roles, where)
                manifest.update(kind=kind, created_ns=start, step=step)
                writer.finish(manifest)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        size = target.stat().st_size
        span.set_many({tm.BYTES: size, tm.SECTIONS: len(writer.sections),
                       tm.LAUNCHES: program.num_launches})  # fmt: skip
    log.info("capture_saved", file=str(target), bytes=size, launches=program.num_launches)
    return size


def _manifest(writer: _Writer, program: ReplayProgram, queue: cl.CommandQueue,
              roles: Sequence[tuple[str, cl.MemoryObjectHolder]], where: str
              ) -> dict[str, Any]:  # fmt: skip
    enc = _Encoder(writer, queue, where)
    role_of = {enc.buffer(buf): role for role, buf in roles}  # first: the step refers to them
    # the capture's own memory and its regions: scratch, no contents worth keeping
    arena = {enc.buffer(buf) for buf in program.arena.buffers}
    programs: dict[int, int] = {}  # program int_ptr -> index
    saved_programs: list[dict[str, Any]] = []
    shapes: dict[int, int] = {}  # id(LaunchShape) -> index
    saved_shapes: list[dict[str, Any]] = []
    commands: list[list[Any]] = []
    first_write: dict[int, bool] = {}  # buffer index -> whether its first use overwrites it
    dev = queue.device
    for op in program.ops:
        if type(op) is RawLaunch:
            shape = op.shape
            if (s := shapes.get(id(shape))) is None:
                prg = shape.kernel.program
                if (p := programs.get(prg.int_ptr)) is None:
                    p = programs[prg.int_ptr] = len(saved_programs)
                    saved_programs.append(_save_program(writer, prg, dev))
                gsize, lsize, offset = launch_sizes(shape)
                args = [[a.arg_index, _NAMES[id(a.setter)], enc(a.payload)] for a in shape.args]
                s = shapes[id(shape)] = len(saved_shapes)
                saved_shapes.append({"program": p, "kernel": shape.kernel.function_name,
                                     "global": gsize, "local": lsize, "offset": offset,
                                     "allow_empty": shape.allow_empty, "args": args})
                if shape.kernel.function_name not in saved_programs[p]["kernels"]:
                    saved_programs[p]["kernels"].append(shape.kernel.function_name)
                for _, buf in program.binds[id(shape)].buffers:
                    first_write.setdefault(enc.buffer(buf), False)
            commands.append(["launch", s])
        elif type(op) is RawTransfer:
            name = op.entry.name
            if name not in _ALLOWED:
                raise CaptureFileError(f"{where}: the capture holds a {op.entry.operation}, "
                                       "which a file cannot hold yet (buffer reads, writes, "
                                       "copies and fills can)")  # fmt: skip
            args, kwargs = enc(list(op.args)), {k: enc(v) for k, v in op.kwargs.items()}
            bound = op.bound()
            written = _WRITES.get(name)
            for pname, buf in ((k, v) for k, v in bound.items()
                               if isinstance(v, cl.MemoryObjectHolder)):  # fmt: skip
                whole = pname == written and _covers(name, bound, buf)
                first_write.setdefault(enc.buffer(buf), whole)
            commands.append(["transfer", name, args, kwargs])
        else:
            commands.append(["finish"])
    buffers = []
    for ptr, (i, buf) in enc.buffers.items():
        # netcl cannot see whether a kernel reads a buffer: only a buffer whose first use
        # overwrites it whole (a write, copy or fill) needs no contents
        overwritten = first_write.get(i, False)
        parent, origin = enc.parents.get(ptr, (None, 0))
        role = role_of.get(i) or (SCRATCH if overwritten or {i, parent} & arena else CONSTANT)
        data = None  # a sub-buffer's contents are its parent's
        if role in (CONSTANT, OUTPUT) and not overwritten and parent is None:
            data = writer.add(_download(queue, buf))
        buffers.append({"size": int(buf.size), "flags": int(buf.flags) & _FLAGS, "role": role,
                        "data": data, "parent": parent, "origin": origin})  # fmt: skip
    return {"format": "netcl-capture", "version": FORMAT_VERSION,
            "device": {"identity": device_identity(dev), "name": dev.name.strip()},
            "launches": program.num_launches, "programs": saved_programs, "shapes": saved_shapes,
            "buffers": buffers, "commands": commands}  # fmt: skip


def _covers(name: str, bound: dict[str, Any], buf: cl.MemoryObjectHolder) -> bool:
    """Whether a write, copy or fill overwrites ``buf`` from its first byte to its last."""
    offset = bound.get("dst_offset" if name != "_enqueue_fill_buffer" else "offset") or 0
    if name == "_enqueue_write_buffer":
        count = np.asarray(bound["hostbuf"]).nbytes
    else:
        count = bound.get("byte_count" if name == "_enqueue_copy_buffer" else "size") or 0
    return offset == 0 and count >= int(buf.size)


def _save_program(writer: _Writer, prg: Any, dev: cl.Device) -> dict[str, Any]:
    devices = prg.get_info(cl.program_info.DEVICES)
    binaries = prg.get_info(cl.program_info.BINARIES)
    binary = next((b for d, b in zip(devices, binaries, strict=True) if d == dev), b"")
    source = prg.get_info(cl.program_info.SOURCE) or ""
    options = prg.get_build_info(dev, cl.program_build_info.OPTIONS) or ""
    return {"binary": writer.add(bytes(binary)) if binary else None,
            "source": writer.add(source.encode()) if source.strip("\0 \n") else None,
            "options": options.strip(), "kernels": []}  # fmt: skip


def _download(queue: cl.CommandQueue, buf: cl.MemoryObjectHolder) -> Iterator[np.ndarray]:
    """A buffer's contents in chunks, through one staging array."""
    size = int(buf.size)
    staging = np.empty(min(size, _CHUNK), np.uint8)
    for offset in range(0, size, _CHUNK):
        part = staging[: min(_CHUNK, size - offset)]
        cl.enqueue_copy(queue, part, buf, src_offset=offset)
        yield part


# -- loading ----------------------------------------------------------------------------------
class _File:
    """An open saved file whose header and manifest were checked."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            self.f = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise CaptureFileError(f"{self.path}: cannot be read ({exc.strerror})") from None
        try:
            self.size = os.fstat(self.f.fileno()).st_size
            self.manifest = self._manifest()
        except BaseException:
            self.f.close()
            raise

    def error(self, what: str) -> CaptureFileError:
        return CaptureFileError(f"{self.path}: {what}")

    def _manifest(self) -> dict[str, Any]:
        head = self.f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise self.error(f"not a saved capture: {len(head)} bytes, shorter than the header")
        magic, version, flags, offset, length, crc = _HEADER.unpack(head)
        if magic != _MAGIC:
            raise self.error(f"not a saved capture (it starts with {magic!r}, expected "
                             f"{_MAGIC!r})")  # fmt: skip
        if version != FORMAT_VERSION or flags:
            raise self.error(f"format version {version} (flags {flags}); this netcl-capture "
                             f"reads version {FORMAT_VERSION}: load it with the netcl-capture "
                             "that saved it, or save it again")  # fmt: skip
        if length > _MAX_MANIFEST:
            raise self.error(f"its manifest claims {length} bytes, more than the "
                             f"{_MAX_MANIFEST} a saved capture can have: the header is damaged")
        if offset < _HEADER_SIZE or offset + length > self.size:
            raise self.error(f"truncated: the manifest lies at bytes {offset}..{offset + length}"
                             f" of a {self.size}-byte file")  # fmt: skip
        self.f.seek(offset)
        data = self.f.read(length)
        if zlib.crc32(data) != crc:
            raise self.error("the manifest's checksum does not match: the file is damaged")
        try:
            manifest = json.loads(data)
            sections = manifest["sections"]
            for start, size, _ in sections:
                if not (isinstance(start, int) and isinstance(size, int)
                        and start >= _HEADER_SIZE and size >= 0 and start + size <= offset):
                    raise ValueError(f"section at {start} of {size} bytes lies outside the data")
        except (ValueError, KeyError, TypeError) as exc:
            raise self.error(f"its manifest is malformed ({exc})") from None
        return manifest  # type: ignore[no-any-return]

    def section(self, i: Any) -> bytes:
        """A whole section, its checksum checked."""
        start, size, crc = self._bounds(i)
        self.f.seek(start)
        data = self.f.read(size)
        if len(data) != size or zlib.crc32(data) != crc:
            raise self.error(f"section {i} is damaged (its checksum does not match)")
        return data

    def _bounds(self, i: Any) -> tuple[int, int, int]:
        sections = self.manifest["sections"]
        if not isinstance(i, int) or not 0 <= i < len(sections):
            raise self.error(f"its manifest names section {i!r}, which it does not have")
        start, size, crc = sections[i]
        return start, size, crc

    def upload(self, i: Any, queue: cl.CommandQueue, buf: cl.Buffer) -> None:
        """Stream a section into ``buf`` through two staging arrays (reading the next chunk
        while the last one is copied), checking its checksum."""
        start, size, crc = self._bounds(i)
        if size != int(buf.size):
            raise self.error(f"section {i} holds {size} bytes for a {int(buf.size)}-byte buffer")
        staging = [np.empty(min(size, _CHUNK), np.uint8) for _ in range(2 if size > _CHUNK else 1)]
        pending: list[cl.Event | None] = [None] * len(staging)
        self.f.seek(start)
        found = 0
        for k, offset in enumerate(range(0, size, _CHUNK)):
            s = k % len(staging)
            if pending[s] is not None:
                pending[s].wait()  # type: ignore[union-attr]
            part = staging[s][: min(_CHUNK, size - offset)]
            if self.f.readinto(part.data) != len(part):
                raise self.error(f"section {i} is truncated")
            found = zlib.crc32(part.data, found)
            pending[s] = cl.enqueue_copy(queue, buf, part, dst_offset=offset, is_blocking=False)
        for event in pending:
            if event is not None:
                event.wait()
        if found != crc:
            raise self.error(f"section {i} is damaged (its checksum does not match)")

    def close(self) -> None:
        self.f.close()


def load(path: str | os.PathLike[str], queue: cl.CommandQueue) -> Loaded:
    """Load a saved capture onto ``queue``'s device: its programs (rebuilt from their source
    where the file's device differs), buffers (constants filled) and replay form."""
    if not isinstance(queue, cl.CommandQueue):
        raise TypeError(f"load({os.fspath(path)!r}): expected a pyopencl CommandQueue, got "
                        f"{type(queue).__name__}")  # fmt: skip
    if device.out_of_order(queue):
        raise ValueError(f"load({os.fspath(path)!r}): the queue is out of order; a saved "
                         "capture replays on an in-order queue")  # fmt: skip
    with tm.TEL.span(tm.LOAD_SPAN, {tm.FILE: os.fspath(path)}) as span:
        file = _File(path)
        try:
            loaded, rebuilt = _load(file, queue)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, CaptureFileError):
                raise
            raise file.error(f"its manifest is malformed ({type(exc).__name__}: {exc})") from None
        except cl.Error as exc:
            raise file.error(f"the OpenCL driver refused it: {exc}") from None
        finally:
            file.close()
        span.set_many({tm.BYTES: file.size, tm.SECTIONS: len(file.manifest["sections"]),
                       tm.REBUILT: rebuilt, tm.LAUNCHES: loaded.program.num_launches})
    log.info("capture_loaded", file=file.path, bytes=file.size, rebuilt_programs=rebuilt)
    return loaded


def _load(file: _File, queue: cl.CommandQueue) -> tuple[Loaded, int]:
    m = file.manifest
    if m.get("format") != "netcl-capture" or m.get("version") != FORMAT_VERSION:
        raise file.error("its manifest is not a netcl-capture manifest of version "
                         f"{FORMAT_VERSION}")  # fmt: skip
    ctx, dev = queue.context, queue.device
    need = sum(int(b["size"]) for b in m["buffers"] if b["parent"] is None)
    if need > dev.global_mem_size:
        raise file.error(f"its buffers need {need} bytes, more than {dev.name.strip()!r} has "
                         f"({dev.global_mem_size})")  # fmt: skip
    here, saved = device_identity(dev), m["device"]["identity"]
    programs, rebuilt = [], 0
    for i, p in enumerate(m["programs"]):
        if saved == here and p["binary"] is not None:
            prg = cl.Program(ctx, [dev], [file.section(p["binary"])])
            prg.build(options=p["options"], devices=[dev])
        else:
            prg = _rebuild(file, p, i, ctx, dev, saved, here)
            rebuilt += 1
        programs.append(prg)
    buffers: list[cl.Buffer] = []
    for b in m["buffers"]:
        size, flags = int(b["size"]), int(b["flags"]) & _FLAGS or cl.mem_flags.READ_WRITE
        if size <= 0:
            raise ValueError(f"a buffer of {size} bytes")
        if b["parent"] is None:
            buf = cl.Buffer(ctx, flags, size)
        elif 0 <= b["parent"] < len(buffers):  # parents come first
            buf = buffers[b["parent"]].get_sub_region(int(b["origin"]), size, flags)
        else:
            raise ValueError(f"sub-buffer of buffer {b['parent']!r}, not before it")
        if b["data"] is not None:
            file.upload(b["data"], queue, buf)
        buffers.append(buf)
    decode = _decoder(file, queue, buffers)
    kernels: dict[tuple[int, str], cl.Kernel] = {}
    shapes = []
    for s in m["shapes"]:
        key = (int(s["program"]), str(s["kernel"]))
        if (kernel := kernels.get(key)) is None:
            kernel = kernels[key] = cl.Kernel(programs[key[0]], key[1])
        args = tuple(ArgSet(int(i), _allowed(file, name), decode(payload))
                     for i, name, payload in s["args"])  # fmt: skip
        if len(args) < kernel.num_args:
            raise ValueError(f"kernel {key[1]!r} has {kernel.num_args} arguments, the file "
                             f"sets {len(args)}")  # fmt: skip
        sizes = [None if v is None else tuple(int(x) for x in v)
                 for v in (s["global"], s["local"], s["offset"])]  # fmt: skip
        shapes.append(LaunchShape(kernel, queue, sizes[0], sizes[1], sizes[2], False,
                                  bool(s["allow_empty"]), args))  # fmt: skip
    rec = Recording()
    ops: list[Op] = []
    for c in m["commands"]:
        if c[0] == "launch":
            ops.append(RawLaunch(shapes[c[1]], (), None))
        elif c[0] == "transfer":
            entry = _ALLOWED.get(c[1])
            if entry is None or entry.kind not in ("transfer", "order"):
                raise file.error(f"its manifest names operation {c[1]!r}, which a file cannot "
                                 "hold")  # fmt: skip
            args, kwargs = tuple(decode(c[2])), {str(k): decode(v) for k, v in c[3].items()}
            places: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
            where = tuple((k, v) for k, v in places if isinstance(v, cl.MemoryObjectHolder))
            fn = contract.original(entry.owner, entry.name)
            ops.append(RawTransfer(entry, fn, args, kwargs, (), None, where))
        elif c[0] == "finish":
            ops.append(RawFinish(queue))
        else:
            raise file.error(f"its manifest names command {c[0]!r}")
    rec.raw = list(ops)
    return Loaded(build(rec), buffers, m), rebuilt


def _allowed(file: _File, name: Any) -> Callable[..., Any]:
    entry = _ALLOWED.get(name)
    if entry is None or entry.owner != "pyopencl.Kernel":
        raise file.error(f"its manifest names argument setter {name!r}, which a file cannot use")
    return contract.original(entry.owner, entry.name)  # type: ignore[no-any-return]


def _rebuild(file: _File, p: dict[str, Any], i: int, ctx: cl.Context, dev: cl.Device,
             saved: str, here: str) -> Any:  # fmt: skip
    """Program ``i`` built from its saved source for a device other than the file's."""
    kernels = ", ".join(p["kernels"])
    if p["source"] is None:
        raise file.error(f"it was saved for device {saved!r}; this queue's device is {here!r},"
                         f" and program {i} (kernels {kernels}) was saved without its source "
                         "(it was built from a binary), so it cannot be rebuilt here: save the "
                         "capture on this device, or from a process that built the program "
                         "from source")  # fmt: skip
    source = file.section(p["source"]).decode()
    log.info("capture_program_rebuilt", file=file.path, program=i, kernels=kernels,
             saved_device=saved, device=here)  # fmt: skip
    try:
        from netcl.runtime.cache import cacher  # the program cache, where it is installed
    except ImportError:
        return cl.Program(ctx, source).build(options=p["options"], devices=[dev])
    return cacher.get_program(ctx, source, dev, p["options"])


def _decoder(file: _File, queue: cl.CommandQueue, buffers: list[cl.Buffer]
             ) -> Callable[[Any], Any]:  # fmt: skip
    def decode(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [decode(v) for v in value]
        (kind, found), *_ = value.items()
        if kind == "tuple":
            return tuple(decode(v) for v in found)
        if kind == "buffer":
            return buffers[found]
        if kind == "queue":
            return queue
        if kind == "local":
            return cl.LocalMemory(int(found))
        if kind == "scalar":
            return np.frombuffer(bytes.fromhex(value["hex"]), _dtype(found))[0]
        if kind == "array":
            data = np.frombuffer(file.section(found), _dtype(value["dtype"]))
            return data.reshape(tuple(value["shape"])).copy()  # writable, as recorded
        if kind == "bytes":
            return bytes.fromhex(found)
        raise ValueError(f"unknown value {value!r:.60}")

    return decode


def _dtype(text: Any) -> np.dtype[Any]:
    if isinstance(text, str):
        return np.dtype(text)
    return np.lib.format.descr_to_dtype([tuple(f) for f in text])


# -- inspecting -------------------------------------------------------------------------------
def inspect(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a saved file holds (checked as a load checks it, without a device)."""
    file = _File(path)
    file.close()
    m = file.manifest
    try:
        roles: dict[str, list[int]] = {}
        for b in m["buffers"]:
            count = roles.setdefault(b["role"], [0, 0])
            count[0] += 1
            count[1] += int(b["size"])
        sections = m["sections"]
        return {
            "file": file.path, "bytes": file.size, "format_version": m["version"],
            "kind": m["kind"], "name": (m.get("step") or {}).get("name"),
            "device": m["device"]["name"], "device_identity": m["device"]["identity"],
            "launches": m["launches"], "commands": len(m["commands"]),
            "programs": [{"kernels": p["kernels"], "options": p["options"],
                          "binary_bytes": sections[p["binary"]][1] if p["binary"] is not None
                          else 0, "source": p["source"] is not None} for p in m["programs"]],
            "buffers": {role: {"count": n, "bytes": size} for role, (n, size) in roles.items()},
            "sections": len(sections),
        }  # fmt: skip
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise file.error(f"its manifest is malformed ({type(exc).__name__}: {exc})") from None
