"""Saved captures: a capture's programs, commands and buffers in a file that another process
loads without the code that recorded it. The format is data only, never pickle (guide, "Saved
steps"), little-endian:

* a 64-byte header: ``NETCLCAP``, the format version (u32), flags (u32, 0), the manifest's
  offset and length (u64 each) and its CRC-32 (u32);
* sections: raw bytes at 64-byte aligned offsets (program binaries and sources, the contents of
  constant buffers, host arrays of recorded transfers), each with a CRC-32;
* the manifest, last: UTF-8 JSON of the records ``_format`` declares (the device, programs,
  buffers, launches, commands and sections, and for a step its call signature and outputs).

Loading checks the header, the manifest and every section's bounds and checksum before anything
from them reaches the driver, and streams buffer contents through two bounded staging buffers.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

import numpy as np
import pyopencl as cl

from netcl.core import contract, device
from netcl.core.device import device_identity
from netcl.core.log import get_logger
from netcl.runtime.capture import _format as fmt
from netcl.runtime.capture import _memory
from netcl.runtime.capture import _telemetry as tm
from netcl.runtime.capture._format import FORMAT_VERSION, CaptureFileError
from netcl.runtime.capture._program import ReplayProgram, build
from netcl.runtime.capture._recording import (
    ArgSet,
    LaunchShape,
    RawFinish,
    RawLaunch,
    RawTransfer,
    Recording,
    launch_sizes,
)

__all__ = ["FORMAT_VERSION", "CaptureFileError", "Loaded", "inspect", "load", "save"]

_CHUNK = 16 << 20  # staging buffer size: what saving or loading holds of a buffer in host memory
log = get_logger("netcl.runtime.capture")


class Loaded(NamedTuple):
    """A loaded file: the replay form, the buffers in the file's order, its manifest."""

    program: ReplayProgram
    buffers: list[cl.Buffer]
    manifest: fmt.Manifest


class _Writer:
    """Sections appended to a file being written, with their offsets and checksums."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.pos = fmt.HEADER_SIZE
        self.sections: list[fmt.Section] = []
        f.write(bytes(fmt.HEADER_SIZE))

    def add(self, chunks: Iterator[Any] | bytes) -> int:
        """Write one section (bytes, or chunks of it); its index."""
        pad = -self.pos % 64
        self.f.write(bytes(pad))
        start = self.pos = self.pos + pad
        crc = 0
        for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
            crc = zlib.crc32(chunk, crc)
            self.f.write(chunk)
            self.pos += len(memoryview(chunk).cast("B"))
        self.sections.append(fmt.Section(start, self.pos - start, crc))
        return len(self.sections) - 1

    def finish(self, manifest: fmt.Manifest) -> None:
        data = json.dumps(fmt.dump(manifest), separators=(",", ":")).encode()
        self.f.write(data)
        self.f.seek(0)
        self.f.write(
            fmt.HEADER.pack(fmt.MAGIC, FORMAT_VERSION, 0, self.pos, len(data), zlib.crc32(data))
        )


class _Buffers(dict[int, tuple[int, cl.MemoryObjectHolder]]):
    """The file's buffer table, by int_ptr: (index, buffer); sub-buffers after their parent."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where, self.parents = where, dict[int, tuple[int, int]]()  # ptr: (parent, origin)
        self.sizes: list[int] = []

    def index(self, mem: cl.MemoryObjectHolder) -> int:
        ptr = contract.mem_ptr(mem)
        if (found := self.get(ptr)) is None:
            if mem.get_info(cl.mem_info.TYPE) != cl.mem_object_type.BUFFER:
                raise CaptureFileError(
                    f"{self.where}: the capture uses an image (a "
                    f"{type(mem).__name__}); only buffers can be saved"
                )
            parent = mem.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT)
            if parent is not None:  # a sub-buffer stays one: a region of its saved parent
                self.parents[ptr] = (self.index(parent), int(mem.get_info(cl.mem_info.OFFSET)))
            found = self[ptr] = (len(self), mem)
            self.sizes.append(int(mem.size))
        return found[0]

    def arg(self, arg: ArgSet) -> fmt.Arg:
        """A kernel argument in the file's words, from the payload its setter took."""
        first = arg.payload[0]  # (index, value), ((index, value),), ((index, code, value),)
        parts = first if isinstance(first, tuple) else arg.payload
        value: Any = parts[-1] if len(parts) > 1 else None
        if len(parts) == 3 or (isinstance(value, np.ndarray) and value.size == 1):  # one number
            code = parts[1] if len(parts) == 3 else value.dtype  # the C type pyopencl packs
            value = np.array(value, code.decode() if isinstance(code, bytes) else code).ravel()[0]
        if isinstance(value, np.generic) and value.dtype.str in fmt.SCALARS:
            return fmt.Arg(arg.arg_index, scalar=fmt.Scalar(value.dtype.str, value.tobytes().hex()))
        if isinstance(value, cl.MemoryObjectHolder):
            return fmt.Arg(arg.arg_index, buffer=self.index(value))
        if isinstance(value, cl.LocalMemory):
            return fmt.Arg(arg.arg_index, local=int(value.size))
        if value is None:
            return fmt.Arg(arg.arg_index)
        raise CaptureFileError(
            f"{self.where}: kernel argument {arg.arg_index} is a "
            f"{type(value).__name__} ({value!r:.60}); a file holds buffers, "
            "scalars of one number, local memory and None"
        )


def save(
    path: str | os.PathLike[str],
    program: ReplayProgram,
    *,
    kind: Literal["capture", "step"],
    roles: Sequence[tuple[str, cl.MemoryObjectHolder]] = (),
    step: fmt.Step | None = None,
) -> int:
    """Write ``program`` to ``path`` (atomically: a new file replaces the old one at the end).
    ``roles``: (INPUT or OUTPUT, buffer) of a step's argument and output buffers, which become
    the first buffers of the file's table, in this order (the rest are constants or scratch);
    ``step``: a step's signature and outputs. Returns the file's size in bytes."""
    where = f"save({os.fspath(path)!r})"
    queues = {contract.queue_ptr(op.queue): op.queue for op in program.ops}
    if len(queues) > 1 or program.plan is not None:
        raise CaptureFileError(
            f"{where}: the capture uses {len(queues)} queues (or an "
            "out-of-order queue); only a capture on one in-order queue can "
            "be saved"
        )
    if program.opaque_launches:
        raise CaptureFileError(
            f"{where}: kernels {sorted(program.opaque_launches)} were "
            "launched with arguments set before begin(), which the capture "
            "does not know: pass the arguments in the call"
        )
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
                writer.finish(
                    _manifest(writer, program, queue, roles, where)._replace(
                        kind=kind, created_ns=start, step=step
                    )
                )
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        size = target.stat().st_size
        span.set_many(
            {tm.BYTES: size, tm.SECTIONS: len(writer.sections), tm.LAUNCHES: program.num_launches}
        )
    log.info("capture_saved", file=str(target), bytes=size, launches=program.num_launches)
    return size


def _manifest(
    writer: _Writer,
    program: ReplayProgram,
    queue: cl.CommandQueue,
    roles: Sequence[tuple[str, cl.MemoryObjectHolder]],
    where: str,
) -> fmt.Manifest:
    table = _Buffers(where)
    # first: the step refers to them
    role_of: dict[int, Any] = {table.index(buf): role for role, buf in roles}
    # the capture's own memory and its regions: scratch, no contents worth keeping
    arena = {table.index(buf) for buf in program.arena.buffers}
    launches = _Launches(writer, table, queue.device, where)
    commands: list[fmt.Command] = []
    first_write: dict[int, bool] = {}  # buffer index -> whether its first use overwrites it
    for op in program.ops:
        if type(op) is RawLaunch:
            index = launches.add(op.shape)
            for _, buf in program.binds[id(op.shape)].buffers:
                first_write.setdefault(table.index(buf), False)
            commands.append(fmt.Command("launch", launch=index))
        elif type(op) is RawTransfer:
            commands.append(_transfer(op, writer, table, first_write, where))
        else:
            commands.append(fmt.Command("finish"))
    buffers = []
    for ptr, (i, buf) in table.items():
        # netcl cannot see whether a kernel reads a buffer: only a buffer whose first use
        # overwrites it whole (a write, copy or fill) needs no contents
        overwritten = first_write.get(i, False)
        parent, origin = table.parents.get(ptr, (None, 0))
        role = role_of.get(i) or (
            fmt.SCRATCH if overwritten or {i, parent} & arena else fmt.CONSTANT
        )
        data = None  # a sub-buffer's contents are its parent's
        if role in (fmt.CONSTANT, fmt.OUTPUT) and not overwritten and parent is None:
            data = writer.add(_download(queue, buf))
        flags = int(buf.flags) & fmt.FLAGS
        buffers.append(fmt.Buffer(int(buf.size), flags, role, data, parent, origin))
    dev = queue.device
    return fmt.Manifest(
        "netcl-capture",
        FORMAT_VERSION,
        "capture",
        0,
        device=fmt.Device(device_identity(dev), dev.name.strip()),
        sections=writer.sections,
        programs=launches.programs,
        buffers=buffers,
        launches=launches.rows,
        commands=commands,
    )


class _Launches:
    """The file's launch table and program table, a row per shape and per program."""

    def __init__(self, writer: _Writer, table: _Buffers, dev: cl.Device, where: str) -> None:
        self.writer, self.table, self.dev, self.where = writer, table, dev, where
        self.rows: list[fmt.Launch] = []
        self.programs: list[fmt.Program] = []
        self.of_shape: dict[int, int] = {}  # id(LaunchShape) -> row
        self.of_program: dict[int, int] = {}  # program int_ptr -> row

    def add(self, shape: LaunchShape) -> int:
        """The row of a launch's shape (added at its first launch)."""
        if (row := self.of_shape.get(id(shape))) is not None:
            return row
        prg, name = shape.kernel.program, shape.kernel.function_name
        if (p := self.of_program.get(prg.int_ptr)) is None:
            p = self.of_program[prg.int_ptr] = len(self.programs)
            self.programs.append(_save_program(self.writer, prg, self.dev, self.where))
        if name not in self.programs[p].kernels:
            self.programs[p].kernels.append(name)
        gsize, lsize, offset = (None if d is None else list(d) for d in launch_sizes(shape))
        args = [self.table.arg(a) for a in shape.args]
        self.of_shape[id(shape)] = len(self.rows)
        self.rows.append(fmt.Launch(p, name, gsize or [], args, lsize, offset, shape.allow_empty))
        return len(self.rows) - 1


def _transfer(
    op: RawTransfer, writer: _Writer, table: _Buffers, first_write: dict[int, bool], where: str
) -> fmt.Command:
    """A recorded transfer as a command; notes whether it overwrites each buffer whole."""
    if not op.entry.word:
        raise CaptureFileError(
            f"{where}: the capture holds a {op.entry.operation}, which a file cannot hold yet "
            "(buffer reads, writes, copies and fills can)"
        )
    c = fmt.Command(
        **fmt.transfer(
            op.entry,
            op.bound(),
            table.index,
            lambda a: writer.add(np.ascontiguousarray(a).view(np.uint8).data.tobytes()),
            lambda p: np.asarray(p).tobytes().hex(),
        )
    )
    count = writer.sections[c.host].size if c.host is not None else c.count or 0
    last = len(c.buffers or []) - 1
    for j, (b, at) in enumerate(zip(c.buffers or [], c.offsets or [], strict=True)):
        # a write, copy or fill overwriting the whole buffer: its contents are not saved
        whole = c.op != "read" and j == last and at == 0 and count >= table.sizes[b]
        first_write.setdefault(b, whole)
    return c


def _save_program(writer: _Writer, prg: Any, dev: cl.Device, where: str) -> fmt.Program:
    devices = prg.get_info(cl.program_info.DEVICES)
    binaries = prg.get_info(cl.program_info.BINARIES)
    binary = next((b for d, b in zip(devices, binaries, strict=True) if d == dev), b"")
    source = prg.get_info(cl.program_info.SOURCE) or ""
    options = prg.get_build_info(dev, cl.program_build_info.OPTIONS) or ""
    return fmt.Program(
        binary=writer.add(bytes(binary)) if binary else None,
        options=fmt.symbolic(options.strip(), where),
        source=writer.add(source.encode()) if source.strip("\0 \n") else None,
        kernels=[],
    )


def _download(queue: cl.CommandQueue, buf: cl.MemoryObjectHolder) -> Iterator[np.ndarray]:
    """A buffer's contents in chunks, through one staging array."""
    size = int(buf.size)
    staging = np.empty(min(size, _CHUNK), np.uint8)
    for offset in range(0, size, _CHUNK):
        part = staging[: min(_CHUNK, size - offset)]
        cl.enqueue_copy(queue, part, buf, src_offset=offset)
        yield part


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
            self.manifest = fmt.read(self.f, self.path, self.size)
        except BaseException:
            self.f.close()
            raise

    def error(self, what: str) -> CaptureFileError:
        return CaptureFileError(f"{self.path}: {what}")

    def section(self, i: int) -> bytes:
        """A whole section, its checksum checked."""
        start, size, crc = self.manifest.sections[i]
        self.f.seek(start)
        data = self.f.read(size)
        if len(data) != size or zlib.crc32(data) != crc:
            raise self.error(f"section {i} is damaged (its checksum does not match)")
        return data

    def upload(self, i: int, queue: cl.CommandQueue, buf: cl.Buffer) -> None:
        """Stream a section into ``buf`` through two staging arrays (reading the next chunk
        while the last one is copied), checking its checksum."""
        start, size, crc = self.manifest.sections[i]
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
        raise TypeError(
            f"load({os.fspath(path)!r}): expected a pyopencl CommandQueue, got "
            f"{type(queue).__name__}"
        )
    if device.out_of_order(queue):
        raise ValueError(
            f"load({os.fspath(path)!r}): the queue is out of order; a saved "
            "capture replays on an in-order queue"
        )
    with tm.TEL.span(tm.LOAD_SPAN, {tm.FILE: os.fspath(path)}) as span:
        file = _File(path)
        try:
            loaded, rebuilt = _load(file, queue)
        except cl.Error as exc:
            raise file.error(f"the OpenCL driver refused it: {exc}") from None
        finally:
            file.close()
        span.set_many(
            {
                tm.BYTES: file.size,
                tm.SECTIONS: len(file.manifest.sections),
                tm.REBUILT: rebuilt,
                tm.LAUNCHES: loaded.program.num_launches,
            }
        )
    log.info("capture_loaded", file=file.path, bytes=file.size, rebuilt_programs=rebuilt)
    return loaded


def _load(file: _File, queue: cl.CommandQueue) -> tuple[Loaded, int]:
    m = file.manifest
    dev = queue.device
    need = sum(b.size for b in m.buffers if b.parent is None)
    if need > dev.global_mem_size:
        raise file.error(
            f"its buffers need {need} bytes, more than {dev.name.strip()!r} has "
            f"({dev.global_mem_size})"
        )
    programs, rebuilt = _programs(file, queue)
    buffers = _buffers(file, queue)
    kernels: dict[tuple[int, str], cl.Kernel] = {}  # one per kernel, as a recording has them
    shapes = []
    for k, s in enumerate(m.launches):
        if (kernel := kernels.get((s.program, s.kernel))) is None:
            kernel = kernels[s.program, s.kernel] = cl.Kernel(programs[s.program], s.kernel)
        shapes.append(_shape(file, queue, k, kernel, buffers))
    rec = Recording()  # the file's commands, as a recording of them would hold them
    for c in m.commands:
        if c.op == "launch":
            rec.raw.append(RawLaunch(shapes[c.launch], (), None))  # type: ignore[index]
        elif c.op == "finish":
            rec.raw.append(RawFinish(queue))
        else:
            rec.raw.append(_raw_transfer(file, queue, c, buffers))
    return Loaded(build(rec), buffers, m), rebuilt


def _programs(file: _File, queue: cl.CommandQueue) -> tuple[list[Any], int]:
    """The file's programs, from their binaries on the saving device (else from source), and
    how many were rebuilt from source."""
    ctx, dev = queue.context, queue.device
    here, saved = device_identity(dev), file.manifest.device.identity
    programs, rebuilt = [], 0
    for i, p in enumerate(file.manifest.programs):
        if saved == here and p.binary is not None:
            prg = cl.Program(ctx, [dev], [file.section(p.binary)])
            prg.build(options=p.options.replace(fmt.INCLUDE, fmt.PYOPENCL), devices=[dev])
        else:
            prg = _rebuild(file, p, i, ctx, dev, saved, here)
            rebuilt += 1
        programs.append(prg)
    return programs, rebuilt


def _buffers(file: _File, queue: cl.CommandQueue) -> list[cl.Buffer]:
    """The file's buffers, their contents uploaded: sub-buffers of their parent, except an
    arena's regions on a device where regions may not overlap (a buffer of their own)."""
    m, ctx = file.manifest, queue.context
    buffers: list[cl.Buffer] = []
    overlap = _memory._may_overlap(ctx)  # an arena's regions may share bytes (else: buffers)
    for b in m.buffers:
        flags = b.flags & fmt.FLAGS or cl.mem_flags.READ_WRITE
        scratch = b.role == fmt.SCRATCH and b.parent is not None
        if b.parent is None or (
            scratch and m.buffers[b.parent].role == fmt.SCRATCH and not overlap
        ):
            buf = cl.Buffer(ctx, flags, b.size)
        else:  # parents come first
            buf = buffers[b.parent].get_sub_region(b.origin, b.size, flags)
        if b.data is not None:
            file.upload(b.data, queue, buf)
        buffers.append(buf)
    return buffers


def _shape(
    file: _File, queue: cl.CommandQueue, k: int, kernel: cl.Kernel, buffers: list[cl.Buffer]
) -> LaunchShape:
    """Launch ``k`` of the file as a recording's shape, its arguments checked against its
    kernel's."""
    s = file.manifest.launches[k]
    if sorted(a.index for a in s.args) != list(range(kernel.num_args)):
        raise file.error(
            f"launches[{k}].args: kernel {s.kernel!r} has {kernel.num_args} arguments, as the "
            f"driver reports; the file sets arguments {sorted(a.index for a in s.args)}"
        )
    args = tuple(ArgSet(a.index, contract.set_arg, (a.index, _value(a, buffers))) for a in s.args)
    return LaunchShape(
        kernel, queue, s.global_size, s.local_size, s.offset, False, s.allow_empty, args
    )


def _value(a: fmt.Arg, buffers: list[cl.Buffer]) -> Any:
    """A kernel argument's value: a buffer, local memory, a number, or None."""
    if a.buffer is not None:
        return buffers[a.buffer]
    if a.local:
        return cl.LocalMemory(a.local)
    if a.scalar:
        return np.frombuffer(bytes.fromhex(a.scalar.hex), a.scalar.dtype)[0]
    return None


def _raw_transfer(
    file: _File, queue: cl.CommandQueue, c: fmt.Command, buffers: list[cl.Buffer]
) -> RawTransfer:
    """A transfer command as a recording holds it: pyopencl's function and its arguments."""
    (entry, fn), kwargs = contract.SAVED[c.op], dict[str, Any]()
    for o, k, offset in zip(entry.operands, c.buffers or (), c.offsets or (), strict=True):
        kwargs |= {o.mem: buffers[k], o.offset: offset, o.count: c.count}
        if c.host is not None:
            kwargs[o.host] = np.frombuffer(file.section(c.host), np.uint8).copy()
        if c.pattern is not None:
            kwargs["pattern"] = bytes.fromhex(c.pattern)
    kwargs = {k: v for k, v in kwargs.items() if k and v is not None}
    where = tuple((k, v) for k, v in kwargs.items() if isinstance(v, cl.MemoryObjectHolder))
    return RawTransfer(entry, fn, (queue,), kwargs, (), None, where)


def _rebuild(
    file: _File, p: fmt.Program, i: int, ctx: cl.Context, dev: cl.Device, saved: str, here: str
) -> Any:
    """Program ``i`` built from its saved source for a device other than the file's."""
    kernels, options = ", ".join(p.kernels), p.options.replace(fmt.INCLUDE, fmt.PYOPENCL)
    if p.source is None:
        raise file.error(
            f"it was saved for device {saved!r}; this queue's device is {here!r},"
            f" and program {i} (kernels {kernels}) was saved without its source "
            "(it was built from a binary), so it cannot be rebuilt here: save the "
            "capture on this device, or from a process that built the program "
            "from source"
        )
    try:
        source = file.section(p.source).decode()
    except UnicodeDecodeError:
        raise file.error(f"programs[{i}].source is not UTF-8 text") from None
    log.info(
        "capture_program_rebuilt",
        file=file.path,
        program=i,
        kernels=kernels,
        saved_device=saved,
        device=here,
    )
    try:
        try:
            from netcl.runtime.cache import cacher  # the program cache, where it is installed
        except ImportError:
            return cl.Program(ctx, source).build(options=options, devices=[dev])
        return cacher.get_program(ctx, source, dev, options)
    except (cl.Error, RuntimeError) as exc:  # pyopencl's error, or the program cache's
        raise file.error(
            f"programs[{i}].source does not build on {here!r} (kernels {kernels}): {str(exc)[:500]}"
        ) from None


def inspect(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a saved file holds (checked as a load checks it, without a device). Buffers by
    role: every buffer counted, bytes of device memory only (a sub-buffer's are its parent's,
    so the capture's arena counts once, not again for each region)."""
    file = _File(path)
    file.close()
    m = file.manifest
    roles: dict[str, dict[str, int]] = {}
    for b in m.buffers:
        count = roles.setdefault(b.role, {"count": 0, "bytes": 0})
        count["count"] += 1
        count["bytes"] += b.size if b.parent is None else 0
    return {
        "file": file.path,
        "bytes": file.size,
        "format_version": m.version,
        "kind": m.kind,
        "name": m.step.name if m.step else None,
        "device": m.device.name,
        "device_identity": m.device.identity,
        "commands": len(m.commands),
        "launches": sum(c.op == "launch" for c in m.commands),
        "buffers": roles,
        "programs": [
            {
                "kernels": p.kernels,
                "options": p.options,
                "source": p.source is not None,
                "binary_bytes": m.sections[p.binary].size if p.binary is not None else 0,
            }
            for p in m.programs
        ],
        "sections": len(m.sections),
    }
