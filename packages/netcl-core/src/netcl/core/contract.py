"""The pyopencl internals netcl relies on, stated once: no netcl module names a private
pyopencl attribute except through this one.

``ENTRY_POINTS`` lists every such attribute: what netcl-capture replaces while recording (or
calls at replay), the primitives the pool and checked mode call beneath capture's hooks, and the
program internals the cache builds with. Each entry says where it lives, its kind, the position
of its ``wait_for`` argument, the parameter names read, what is recorded. Capture's hooks are
made from it, the recording and the replay read argument positions from it, and
``tests/core/test_contract.py`` checks it against the installed pyopencl's signatures. The
objects are read once, at import (``ORIGINALS``: so the pool's own reads are never a hook); a
pyopencl outside the supported range, or missing an attribute of the table, fails the import
with an ``ImportError`` naming it, rather than misbehaving later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pyopencl as cl
import pyopencl._cl as _cl
import pyopencl.invoker as _invoker

__all__ = [
    "BOUND",
    "ENTRY_POINTS",
    "ORIGINALS",
    "SAVED",
    "SUPPORTED",
    "EntryPoint",
    "Operand",
    "original",
]

#: The pyopencl versions whose entry points this table was checked against (the package's
#: dependency pins the same range).
SUPPORTED = "pyopencl>=2026.1,<2027"
_LOWEST, _BEYOND = (2026, 1), (2027,)

# launch: the driver's enqueue; setter, setter_pairs, setter_triples:
# argument setters (index, value...; flat pairs; flat (index, struct code, value) triples);
# transfer, order: copies, fills, markers, barriers; host_wait (events), event_wait (Event.wait);
# invoker generation; handle (int_ptr) and wrap (from_int_ptr): raw handles; replay: not hooked;
# program: the cache's raw program (never hooked)
Kind = Literal[
    "launch",
    "setter",
    "setter_pairs",
    "setter_triples",
    "transfer",
    "order",
    "finish",
    "host_wait",
    "event_wait",
    "invoker",
    "handle",
    "wrap",
    "alloc",
    "replay",
    "program",
]


@dataclass(frozen=True, slots=True)
class Operand:
    """A memory object a transfer touches: the parameter naming it, the parameter of its byte
    offset, and where the byte count comes from (a count parameter, or a host buffer's size).
    Transfers without operands (rectangles, images) touch the whole recorded object."""

    mem: str
    offset: str
    count: str = ""
    host: str = ""


@dataclass(frozen=True, slots=True)
class EntryPoint:
    """One pyopencl attribute netcl relies on: where it lives (``owner``: ``pyopencl._cl``,
    ``pyopencl.Kernel``, ...), the position of its ``wait_for`` argument (-1: none), the leading
    parameter names capture binds arguments to, what a call records; ``optional`` entries
    (image transfers) may be missing from a pyopencl build; ``word``: netcl's own name for a
    command a saved capture holds (files never name pyopencl's functions)."""

    owner: str
    name: str
    kind: Kind
    records: str
    wait_for: int = -1
    params: tuple[str, ...] = ()
    operands: tuple[Operand, ...] = ()
    optional: bool = False
    word: str = ""

    @property
    def operation(self) -> str:
        """The short name records use (``copy_buffer`` for ``_enqueue_copy_buffer``)."""
        return self.name.removeprefix("_enqueue_")


def _transfer(
    name: str, params: tuple[str, ...], *operands: Operand, optional: bool = False, word: str = ""
) -> EntryPoint:
    return EntryPoint(
        "pyopencl._cl",
        name,
        "transfer",
        "the copy or fill, its wait list",
        wait_for=len(params),
        params=params,
        operands=operands,
        optional=optional,
        word=word,
    )


def _order(word: str) -> EntryPoint:
    """A marker or barrier with its wait list, recorded for the order it gives."""
    name = f"_enqueue_{word}_with_wait_list"
    what = f"the {word} and its wait list"
    return EntryPoint("pyopencl._cl", name, "order", what, wait_for=1, params=("queue",), word=word)


_SETTER = "the argument value as set (memory objects by the recording's own reference)"
_RECT = (
    "queue",
    "mem",
    "hostbuf",
    "buffer_origin",
    "host_origin",
    "region",
    "buffer_pitches",
    "host_pitches",
)
_IMAGE = ("queue", "mem", "origin", "region", "hostbuf", "row_pitch", "slice_pitch")

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    # launches: Kernel.__call__ runs pyopencl's generated invoker, which sets the arguments
    # through the _set_arg*_multi setters and enqueues through _cl.enqueue_nd_range_kernel
    EntryPoint(
        "pyopencl._cl",
        "enqueue_nd_range_kernel",
        "launch",
        "the launch: kernel, sizes, argument table, wait list, event",
        wait_for=5,
        params=(
            "queue",
            "kernel",
            "global_work_size",
            "local_work_size",
            "global_work_offset",
            "wait_for",
            "g_times_l",
            "allow_empty_ndrange",
        ),
    ),
    # the same object under the name applications use
    EntryPoint("pyopencl", "enqueue_nd_range_kernel", "launch", "as pyopencl._cl's", wait_for=5),
    EntryPoint("pyopencl.Kernel", "set_arg", "setter", _SETTER, params=("arg_index", "arg")),
    EntryPoint("pyopencl.Kernel", "_set_arg_multi", "setter_pairs", _SETTER, params=("arg",)),
    EntryPoint("pyopencl.Kernel", "_set_arg_buf_multi", "setter_pairs", _SETTER, params=("arg",)),
    EntryPoint(
        "pyopencl.Kernel", "_set_arg_buf_pack_multi", "setter_triples", _SETTER, params=("arg",)
    ),
    EntryPoint("pyopencl.Kernel", "_set_arg_null", "setter", _SETTER, params=("arg",)),
    EntryPoint("pyopencl.Kernel", "_set_arg_buf", "setter", _SETTER, params=("arg0", "arg1")),
    EntryPoint("pyopencl.Kernel", "_set_arg_svm", "setter", _SETTER, params=("arg0", "arg1")),
    # transfers: cl.enqueue_copy, cl.enqueue_fill_buffer and pyopencl.array's get/set end here
    _transfer(
        "_enqueue_read_buffer",
        ("queue", "mem", "hostbuf", "src_offset"),
        Operand("mem", "src_offset", host="hostbuf"),
        word="read",
    ),
    _transfer(
        "_enqueue_write_buffer",
        ("queue", "mem", "hostbuf", "dst_offset"),
        Operand("mem", "dst_offset", host="hostbuf"),
        word="write",
    ),
    _transfer(
        "_enqueue_copy_buffer",
        ("queue", "src", "dst", "byte_count", "src_offset", "dst_offset"),
        Operand("src", "src_offset", count="byte_count"),
        Operand("dst", "dst_offset", count="byte_count"),
        word="copy",
    ),
    _transfer("_enqueue_read_buffer_rect", _RECT),
    _transfer("_enqueue_write_buffer_rect", _RECT),
    _transfer(
        "_enqueue_copy_buffer_rect",
        ("queue", "src", "dst", "src_origin", "dst_origin", "region", "src_pitches", "dst_pitches"),
    ),
    _transfer(
        "_enqueue_fill_buffer",
        ("queue", "mem", "pattern", "offset", "size"),
        Operand("mem", "offset", count="size"),
        word="fill",
    ),
    _transfer("_enqueue_read_image", _IMAGE, optional=True),
    _transfer("_enqueue_write_image", _IMAGE, optional=True),
    _transfer(
        "_enqueue_copy_image",
        ("queue", "src", "dest", "src_origin", "dest_origin", "region"),
        optional=True,
    ),
    _transfer(
        "_enqueue_copy_image_to_buffer",
        ("queue", "src", "dest", "origin", "region", "offset"),
        optional=True,
    ),
    _transfer(
        "_enqueue_copy_buffer_to_image",
        ("queue", "src", "dest", "offset", "origin", "region"),
        optional=True,
    ),
    # ordering only: recorded so that the replay keeps the dependencies they express
    _order("marker"),
    _order("barrier"),
    EntryPoint("pyopencl.CommandQueue", "finish", "finish", "the queue (a host-side finish)"),
    # host-side waits order the commands issued after them; one object under two names
    EntryPoint(
        "pyopencl._cl", "wait_for_events", "host_wait", "the events waited for", params=("arg",)
    ),
    EntryPoint("pyopencl", "wait_for_events", "host_wait", "as pyopencl._cl's"),
    EntryPoint("pyopencl.Event", "wait", "event_wait", "the event waited for"),
    # memoised while recording: a new Kernel object's invoker costs an sqlite lookup
    EntryPoint("pyopencl.invoker", "generate_enqueue_and_set_args", "invoker", "nothing"),
    # raw handles: a native library reaching a queue or buffer this way enqueues work the
    # capture cannot see; noted with the caller, end() refuses such a recording by default
    EntryPoint("pyopencl.CommandQueue", "int_ptr", "handle", "the caller (native access)"),
    EntryPoint("pyopencl.MemoryObjectHolder", "int_ptr", "handle", "the caller"),
    EntryPoint("pyopencl.CommandQueue", "from_int_ptr", "wrap", "the caller"),
    EntryPoint("pyopencl.MemoryObject", "from_int_ptr", "wrap", "the caller"),
    # births: a buffer allocated while recording is the recorded code's own memory, the only
    # kind a capture may move into its arena (pyopencl.array, reikna and loopy's code call
    # `pyopencl.Buffer`; a MemoryPool hands out a block made now or of undefined contents)
    EntryPoint("pyopencl", "Buffer", "alloc", "the buffer made (its birth)"),
    EntryPoint("pyopencl._cl.MemoryPool", "allocate", "alloc", "the block handed out"),
    EntryPoint("pyopencl._cl.MemoryPool", "__call__", "alloc", "as allocate"),
    # called by the replay, never replaced
    EntryPoint("pyopencl.CommandQueue", "flush", "replay", "nothing"),
    # the cache builds the raw program pyopencl.Program wraps (its `_prg`) with the raw
    # clBuildProgram: the wrapper's build also fetches every build log after a success
    EntryPoint("pyopencl._cl", "_Program", "program", "nothing"),
    EntryPoint(
        "pyopencl._cl._Program",
        "_build",
        "program",
        "nothing",
        params=("self", "options", "devices"),
    ),
)

_OWNERS: dict[str, Any] = {
    "pyopencl": cl,
    "pyopencl._cl": _cl,
    "pyopencl.invoker": _invoker,
    "pyopencl._cl._Program": _cl._Program,
    "pyopencl._cl.MemoryPool": _cl.MemoryPool,
}


def _owner(path: str) -> Any:
    found = _OWNERS.get(path) or getattr(cl, path.removeprefix("pyopencl."), None)
    if found is None:
        raise _unsupported(path)
    return found


def _unsupported(what: str) -> ImportError:
    version = getattr(cl, "VERSION_TEXT", "of unknown version")
    return ImportError(
        f"netcl: pyopencl {version} has no {what}, which netcl relies on; "
        f"supported versions: {SUPPORTED}"
    )


def _check_version() -> None:
    found = tuple(getattr(cl, "VERSION", ()))
    if not (_LOWEST <= found < _BEYOND):
        text = getattr(cl, "VERSION_TEXT", None) or ".".join(map(str, found)) or "unknown"
        raise ImportError(
            f"netcl: pyopencl {text} is outside the supported versions "
            f"({SUPPORTED}): netcl relies on pyopencl internals checked for "
            "those versions only"
        )


def _resolve() -> list[tuple[EntryPoint, Any, Any]]:
    _check_version()
    found: list[tuple[EntryPoint, Any, Any]] = []
    for entry in ENTRY_POINTS:
        owner = _owner(entry.owner)
        # the owner's own attribute, not one inherited: hooks replace exactly this object
        if (obj := owner.__dict__.get(entry.name)) is None:
            if entry.optional:
                continue
            raise _unsupported(f"{entry.owner}.{entry.name}")
        found.append((entry, owner, obj))
    return found


#: (entry, owner object, pyopencl's own object) of every entry this pyopencl has.
BOUND: list[tuple[EntryPoint, Any, Any]] = _resolve()
#: (owner, attribute) -> pyopencl's own object.
ORIGINALS: dict[tuple[Any, str], Any] = {(owner, e.name): obj for e, owner, obj in BOUND}
#: The commands a saved capture can hold, by their ``word``: (entry, pyopencl's own object).
SAVED: dict[str, tuple[EntryPoint, Any]] = {e.word: (e, obj) for e, _, obj in BOUND if e.word}


def original(owner: str, name: str) -> Any:
    """pyopencl's own object for ``owner.name`` (as read at import)."""
    return ORIGINALS[(_owner(owner), name)]


# The driver entry points the replay calls (never a hook), and the raw handle getters
# netcl's own code uses while the handle hooks are installed.
enqueue_nd_range_kernel: Callable[..., Any] = original("pyopencl._cl", "enqueue_nd_range_kernel")
set_arg: Callable[..., Any] = original("pyopencl.Kernel", "set_arg")
finish: Callable[[Any], Any] = original("pyopencl.CommandQueue", "finish")
flush: Callable[[Any], Any] = original("pyopencl.CommandQueue", "flush")
marker: Callable[..., Any] = original("pyopencl._cl", "_enqueue_marker_with_wait_list")
wait_for_events: Callable[[Any], Any] = original("pyopencl._cl", "wait_for_events")
retain: Callable[..., Any] = original("pyopencl.MemoryObject", "from_int_ptr")
mem_ptr: Callable[[Any], int] = original("pyopencl.MemoryObjectHolder", "int_ptr").fget
queue_ptr: Callable[[Any], int] = original("pyopencl.CommandQueue", "int_ptr").fget
# the pool's backing read and checked mode's guard fills and reads (the originals: never one of
# capture's hooks, since the pool's own work is not the application's)
read_buffer: Callable[..., Any] = original("pyopencl._cl", "_enqueue_read_buffer")
fill_buffer: Callable[..., Any] = original("pyopencl._cl", "_enqueue_fill_buffer")
barrier: Callable[..., Any] = original("pyopencl._cl", "_enqueue_barrier_with_wait_list")
RawProgram: type = original("pyopencl._cl", "_Program")
build_raw: Callable[..., Any] = original("pyopencl._cl._Program", "_build")


def raw_program(program: cl.Program) -> Any:
    """The raw program a ``pyopencl.Program`` wraps (its ``_prg``, as tests/core pins)."""
    return program._prg
